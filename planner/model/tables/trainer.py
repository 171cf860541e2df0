"""What the recommendation trainer does, as far as a DLRM step's time depends on it.

A table spec states it in a ``trainer:`` section (every key optional)::

    trainer:
      preset: torchrec        # torchrec | torchrec-compiled | hugectr | dle-tf2 | dle-pytorch
      pipeline: sparse_dist   # sparse_dist | none
      dispatch: eager         # eager | graphs
      mixed_precision: autocast   # autocast | pure
      fusion: none            # none | compiled | fused
      embedding_output: fp32  # fp32 | dense
      dense_gradients: auto   # auto | fp32 | dense
      input_dist: alltoall    # alltoall | loader
      bottom_mlp: data_parallel   # data_parallel | rank0
      embedding_update: fused     # fused | sparse_grad | scatter_add
      output_dist: flat           # flat | per_peer

``pipeline``: ``sparse_dist`` is TorchRec's ``TrainPipelineSparseDist`` (the default of its
training loops and examples): the next batch's input dist (the ids all-to-alls) runs on its own
stream while this batch computes, so the lookups start without waiting for ids; ``none`` is a
plain ``DistributedModelParallel`` step (``model(batch)``; what ``clusterplan validate`` runs),
whose lookups wait for this batch's ids.

``dispatch``: ``eager`` PyTorch issues every dense op from Python, so an op takes at least the
host's time to dispatch it (:mod:`planner.model.llm.host`); ``graphs``: the dense step is
captured in a CUDA graph or compiled (HugeCTR, ``torch.compile`` with CUDA graphs), and ops take
their kernels' time only.

``mixed_precision`` (matters when the dense part's ``dtype`` is bf16 or fp16): ``autocast`` is
PyTorch's automatic mixed precision: GEMMs run in the dense dtype, but every elementwise op
(bias, ReLU, DCNv2's products and sums, the concatenation, their gradients) runs in fp32,
because the pooled embeddings and the parameters are fp32 and promote them; ``pure`` keeps the
activations in the dense dtype throughout (a model cast to bf16, HugeCTR-style fused layers).
Measured on an H200 (``traces/measured/h200/dlrm-triton/step.csv``), the eager DCNv2 dense part
under autocast takes 14.8 ms at 32,768 samples, which fp32 elementwise traffic explains and
bf16 traffic (9.5 ms) does not.

``fusion``: ``none``: every elementwise op of the dense part is a kernel of its own, reading
and writing its tensors in memory (eager PyTorch, or CUDA graphs of the eager ops); ``fused``:
bias, ReLU and their gradients run in the epilogues of the GEMMs around them (cuBLASLt's
bias/ReLU epilogues), DCNv2's ``x0 ⊙ v + x`` and its gradients are one kernel each, the dot
interaction one kernel each way, and casts fold into the kernels that produce their inputs
(HugeCTR's fused fully-connected and cross layers and dot interaction, hand-written kernels):
the same GEMMs, far fewer bytes between them. ``compiled`` is what TorchInductor
(``torch.compile``) makes of the same model: the elementwise ops fused as under ``fused``, but
every GEMM and batched GEMM stays a cuBLAS call, so the dot interaction keeps its three batched
products (``f × f`` outputs, slow when ``f`` is not a multiple of 8) beside one fused gather
kernel each way. Checked on the H200 against the dense parts under ``torch.compile`` replayed
from CUDA graphs (``traces/measured/h200/dlrm-nosync/dense.csv``, ``dense-dot.csv``). With
``mixed_precision: pure`` the dense gradients are in the dense dtype, so the data-parallel
all-reduce moves 2 bytes per parameter, not 4.

``embedding_output``: the precision of the pooled embeddings a lookup writes, the all-to-all
carries and the backward gets back as gradients. ``fp32``: TorchRec's (FBGEMM's table-batched
kernels emit fp32 unless their ``output_dtype`` is set); the spec's ``comm_precision`` then
says what the all-to-all carries (TorchRec's quantized comms). ``dense``: the dense part's
dtype: HugeCTR's embedding collection under ``use_mixed_precision`` builds its embedding
vectors and their gradients in half precision (``emb_type`` and ``wgrad_type`` are half in its
model setup), so the model-parallel all-to-all and the row-wise reductions move 2 bytes per
element; a narrower ``comm_precision`` still applies.

``dense_gradients``: the precision of the dense parameters' gradients, which the data-parallel
all-reduce moves. ``auto``: the dense dtype under ``pure`` (the parameters are kept in it, as
HugeCTR's half-precision weight gradients), fp32 under ``autocast``; ``fp32``: fp32 whatever the
activations (Keras' ``mixed_float16`` policy keeps fp32 variables, so their gradients are fp32);
``dense``: the dense dtype.

``input_dist``: how a rank gets the ids of the tables it holds. ``alltoall``: every rank's data
loader reads its own samples of every feature and the ids all-to-all sends each table's ids to
its shards' ranks (TorchRec's input dist, HugeCTR's data distributor); ``loader``: every rank's
data loader reads the ids of the tables it holds for the whole global batch, so no ids cross
ranks (DeepLearningExamples' TF2 DLRM: its ``DistributedEmbedding`` takes model-parallel input,
``dp_input=False``, from a dataset split by feature).

``bottom_mlp``: where the bottom MLP runs. ``data_parallel``: every rank runs it on its own
samples and its gradients join the dense all-reduce (TorchRec, HugeCTR, DLE's TF2 DLRM);
``rank0``: rank 0 runs it alone on the whole global batch and sends each rank its samples'
outputs in the pooled all-to-all, as one more embedding vector, and takes their gradients back
in the backward one; its parameters are in no all-reduce (DeepLearningExamples' PyTorch DLRM:
``get_device_mapping`` puts the bottom MLP on device 0, ``DistributedDlrm`` sends its output
through the same ``all_to_all`` as the embeddings, and only the top model is wrapped in
``DistributedDataParallel``).

``embedding_update``: how the tables' gradients reach their weights. ``fused``: the lookup's
backward kernel computes each row's gradient and applies the optimizer in place (FBGEMM's
table-batched embeddings under TorchRec, HugeCTR's embedding collections); ``sparse_grad``:
PyTorch's own sparse-gradient path, as DeepLearningExamples' PyTorch DLRM runs it (its
``joint_sparse`` embedding: a gather kernel forward that writes fp32 rows, cast to half by a
kernel of its own under ``--amp``; ``at::embedding_sparse_backward``, a COO gradient with one
row per id; ``GradScaler.unscale_`` over its values under fp16; ``torch.optim.SGD``, which adds
the uncoalesced gradient into the table with ``index_add_``); ``scatter_add``: TensorFlow's
``IndexedSlices`` path, as DeepLearningExamples' TF2 DLRM runs it (``tf.nn.embedding_lookup``'s
gradient holds one row per id, distributed-embeddings' multi-hot gradient op one per distinct
id; ``LossScaleOptimizer.get_unscaled_gradients`` scales them under
``--amp``; the legacy Keras SGD scatters ``−lr · g`` with ``resource_scatter_add``, so a
scaling pass runs with or without the loss scale). Either way an optimizer with state (Adagrad,
Adam, LazyAdam) merges repeated ids first. Priced pass by pass in
:mod:`planner.model.tables.lookup_cost`.

``output_dist``: how the pooled all-to-all's buffers meet the dense part. ``flat``: it reads
and writes one tensor each way (TorchRec's pooled all-to-all, HugeCTR); ``per_peer``:
``torch.distributed.all_to_all`` over one tensor per peer, whose received pieces are
concatenated into the interaction's input (one copy of the local batch's pooled rows), and
whose gradient is sliced per peer and each slice copied contiguous before the backward one
(DeepLearningExamples' PyTorch DLRM, ``BottomToTop``); the copies are dense-part ops.

``preset`` names a trainer by what it does (:data:`DLRM_PRESETS`): ``torchrec`` (the defaults:
TorchRec's pipelined training loop, eager PyTorch under autocast), ``torchrec-compiled`` (the
same loop with the dense part compiled into CUDA graphs:
``torch.compile(mode="reduce-overhead")``; autocast, compiled) and ``hugectr`` (HugeCTR: its own
overlapped embedding pipeline, CUDA graphs, half-precision activations throughout, fused layers,
half-precision embedding vectors) and ``dle-tf2`` (NVIDIA DeepLearningExamples' TensorFlow 2
DLRM and DCNv2 with ``--xla --amp``, read from its code: a ``tf.function`` graph, so no Python
per op; Keras ``mixed_float16``, so activations in half precision with fp32 variables and
gradients; XLA's elementwise fusions, TF's GEMMs with bias and ReLU fused and a custom CUDA dot
interaction; the lookups' outputs fp32, cast after the all-to-all, since its embeddings do not
run in fp16; ``input_dist: loader``; ``embedding_update: scatter_add``; its tables placed by
``--planner memory_balanced``) and
``dle-pytorch`` (NVIDIA DeepLearningExamples' PyTorch DLRM with ``--amp``, read from its code:
eager PyTorch under ``torch.cuda.amp.autocast`` (``--cuda_graphs`` is off by default: write
``dispatch=graphs`` for a run that sets it), apex's fused MLP (bias and ReLU in one kernel per
layer) and a custom CUDA dot interaction, so ``fused``; the pooled embeddings cast to half
before the all-to-all under ``--amp`` (``embedding_output: dense``); every rank's loader reads
its own tables' ids for the whole batch (``input_dist: loader``); ``bottom_mlp: rank0``;
``embedding_update: sparse_grad`` (the distributed path: on one GPU DLE picks its
``joint_fused`` kernels instead, not modelled apart); ``output_dist: per_peer``; its tables
placed by ``--planner dle_pytorch``).
``--trainer NAME`` on ``clusterplan plan`` picks a preset in place of the spec's section;
``--trainer-set KEY=VALUE`` overrides a key.

>>> dlrm_trainer_from_mapping({"pipeline": "none"}, source="tables.yaml")  # doctest: +ELLIPSIS
DlrmTrainer(pipeline='none', dispatch='eager', mixed_precision='autocast', fusion='none', ...)
>>> override_dlrm_trainer(DlrmTrainer(), ["dispatch=graphs"]).dispatch
'graphs'
>>> t = dlrm_trainer_from_mapping({"preset": "hugectr", "dispatch": "eager"}, source="t.yaml")
>>> t.dispatch, t.mixed_precision, t.fusion, t.embedding_output
('eager', 'pure', 'fused', 'dense')
>>> t.pooled_bytes(4.0, "bf16"), DlrmTrainer().pooled_bytes(4.0, "bf16")
(2.0, 4.0)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Sequence

from simulator.errors import SpecError

from planner.model.tables.dense import ACTIVATION_BYTES

__all__ = ["DlrmTrainer", "dlrm_trainer_from_mapping", "override_dlrm_trainer",
           "dlrm_preset", "dlrm_trainer_from_args", "DLRM_TRAINER_KEYS", "DLRM_PRESETS",
           "DLRM_TRAINER_CHOICES"]

_CHOICES = {"pipeline": ("sparse_dist", "none"), "dispatch": ("eager", "graphs"),
            "mixed_precision": ("autocast", "pure"), "fusion": ("none", "fused", "compiled"),
            "embedding_output": ("fp32", "dense"), "dense_gradients": ("auto", "fp32", "dense"),
            "input_dist": ("alltoall", "loader"), "bottom_mlp": ("data_parallel", "rank0"),
            "embedding_update": ("fused", "sparse_grad", "scatter_add"),
            "output_dist": ("flat", "per_peer")}


@dataclass(frozen=True, slots=True, kw_only=True)
class DlrmTrainer:
    """Trainer settings of a DLRM step (defaults: TorchRec's pipelined eager training)."""

    pipeline: str = "sparse_dist"
    dispatch: str = "eager"
    mixed_precision: str = "autocast"
    fusion: str = "none"
    embedding_output: str = "fp32"
    dense_gradients: str = "auto"
    input_dist: str = "alltoall"
    bottom_mlp: str = "data_parallel"
    embedding_update: str = "fused"
    output_dist: str = "flat"

    @property
    def ids_alltoall(self) -> bool:
        """True when the ids reach the tables' ranks through an all-to-all (``input_dist``)."""
        return self.input_dist == "alltoall"

    @property
    def bottom_on_rank0(self) -> bool:
        """True when rank 0 alone runs the bottom MLP on the global batch (``bottom_mlp``)."""
        return self.bottom_mlp == "rank0"

    @property
    def sparse_grad(self) -> bool:
        """True when the tables' gradients are sparse tensors (PyTorch's COO, TensorFlow's
        IndexedSlices) that an optimizer adds into the weights after the backward
        (``embedding_update``)."""
        return self.embedding_update in ("sparse_grad", "scatter_add")

    @property
    def pipelined(self) -> bool:
        """True when the next batch's input dist overlaps this batch's compute."""
        return self.pipeline == "sparse_dist"

    @property
    def elementwise_bytes(self) -> float | None:
        """Bytes per element of the dense part's elementwise ops: 4 under autocast (fp32),
        None when they take the dense dtype's size."""
        return 4.0 if self.mixed_precision == "autocast" else None

    @property
    def fused(self) -> bool:
        """True when bias, activations and elementwise chains fuse into few kernels."""
        return self.fusion in ("fused", "compiled")

    @property
    def gemm_interaction(self) -> bool:
        """True when the dot interaction's products stay batched GEMMs (``compiled``)."""
        return self.fusion == "compiled"

    def gradient_bytes(self, dtype: str) -> float:
        """Bytes per dense parameter gradient the data-parallel all-reduce moves for a dense
        part of ``dtype`` (``dense_gradients``): under ``auto`` the dtype's own under ``pure``
        (the parameters are in it, so are their gradients), else 4 (fp32 parameters, as under
        autocast)."""
        own = ACTIVATION_BYTES.get(dtype, 4.0)
        if self.dense_gradients == "auto":
            return own if self.mixed_precision == "pure" else 4.0
        return own if self.dense_gradients == "dense" else 4.0

    def pooled_bytes(self, comm_bytes: float, dense_dtype: str | None) -> float:
        """Bytes per element of the pooled embeddings and their gradients between lookups and
        the dense part: ``comm_bytes`` (the spec's ``comm_precision``), or under ``dense`` the
        dense dtype's size when that is narrower (fp32 without a dense part)."""
        if self.embedding_output != "dense":
            return comm_bytes
        return min(comm_bytes, ACTIVATION_BYTES.get(dense_dtype or "fp32", 4.0))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for a report: ``pipeline sparse_dist, dispatch eager, ...``."""
        return ", ".join(f"{k} {v}" for k, v in self.to_dict().items())


DLRM_TRAINER_KEYS = tuple(f.name for f in fields(DlrmTrainer))

#: each trainer key's allowed values, the first the default's
DLRM_TRAINER_CHOICES = _CHOICES

#: named DLRM trainers as the settings above (see the module docstring)
DLRM_PRESETS = {
    "torchrec": DlrmTrainer(),
    "torchrec-compiled": DlrmTrainer(dispatch="graphs", fusion="compiled"),
    "hugectr": DlrmTrainer(dispatch="graphs", mixed_precision="pure", fusion="fused",
                           embedding_output="dense"),
    "dle-tf2": DlrmTrainer(dispatch="graphs", mixed_precision="pure", fusion="fused",
                           embedding_output="fp32", dense_gradients="fp32", input_dist="loader",
                           embedding_update="scatter_add"),
    "dle-pytorch": DlrmTrainer(fusion="fused", embedding_output="dense", input_dist="loader",
                               bottom_mlp="rank0", embedding_update="sparse_grad",
                               output_dist="per_peer"),
}


def dlrm_preset(name: str, *, source: str, field: str = "trainer.preset") -> DlrmTrainer:
    """The trainer preset ``name`` (:data:`DLRM_PRESETS`); a SpecError naming ``source`` and
    ``field`` for an unknown one."""
    if name not in DLRM_PRESETS:
        raise SpecError(f"unknown DLRM trainer preset {name!r}", source=source, field=field,
                        fix=f"use one of: {', '.join(DLRM_PRESETS)}")
    return DLRM_PRESETS[name]


def _check(key: str, value: Any, source: str, where: str) -> str:
    if key not in _CHOICES:
        raise SpecError(f"unknown trainer setting {key!r}", source=source, field=where,
                        fix=f"use one of: preset, {', '.join(DLRM_TRAINER_KEYS)}")
    if value not in _CHOICES[key]:
        raise SpecError(f"{key} must be one of {', '.join(_CHOICES[key])}, got {value!r}",
                        source=source, field=where,
                        fix=f"write {key}: {_CHOICES[key][0]}")
    return str(value)


def dlrm_trainer_from_mapping(value: Any, *, source: str) -> DlrmTrainer:
    """A spec's ``trainer:`` section as a :class:`DlrmTrainer` (``None``: the defaults)."""
    if value is None:
        return DlrmTrainer()
    if not isinstance(value, Mapping):
        raise SpecError(f"expected a mapping, got {value!r}", source=source, field="trainer",
                        fix="write trainer: {pipeline: sparse_dist, dispatch: eager}")
    base = DlrmTrainer()
    if "preset" in value:
        base = dlrm_preset(str(value["preset"]), source=source)
    kw = {str(k): _check(str(k), v, source, f"trainer.{k}") for k, v in value.items()
          if k != "preset"}
    return replace(base, **kw)


def override_dlrm_trainer(trainer: DlrmTrainer, pairs: Sequence[str]) -> DlrmTrainer:
    """``trainer`` with ``KEY=VALUE`` overrides (``--trainer-set``) applied."""
    kw: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SpecError(f"expected KEY=VALUE, got {pair!r}", source="--trainer-set",
                            fix="pass e.g. --trainer-set pipeline=none")
        kw[key.strip()] = _check(key.strip(), value.strip(), "--trainer-set", key.strip())
    return replace(trainer, **kw) if kw else trainer


def dlrm_trainer_from_args(trainer: DlrmTrainer, name: str | None,
                           pairs: Sequence[str] | None) -> DlrmTrainer:
    """``trainer`` replaced by the preset ``name`` (``--trainer``) when given, then with
    ``KEY=VALUE`` overrides (``--trainer-set``) applied."""
    if name:
        trainer = dlrm_preset(name, source="--trainer", field="--trainer")
    return override_dlrm_trainer(trainer, pairs or [])
