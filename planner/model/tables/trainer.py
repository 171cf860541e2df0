"""What the recommendation trainer does, as far as a DLRM step's time depends on it.

A table spec states it in a ``trainer:`` section (every key optional)::

    trainer:
      pipeline: sparse_dist   # sparse_dist | none
      dispatch: eager         # eager | graphs
      mixed_precision: autocast   # autocast | pure

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

``--trainer-set KEY=VALUE`` on ``clusterplan plan`` overrides a key.

>>> dlrm_trainer_from_mapping({"pipeline": "none"}, source="tables.yaml")
DlrmTrainer(pipeline='none', dispatch='eager', mixed_precision='autocast')
>>> override_dlrm_trainer(DlrmTrainer(), ["dispatch=graphs"]).dispatch
'graphs'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Sequence

from simulator.errors import SpecError

__all__ = ["DlrmTrainer", "dlrm_trainer_from_mapping", "override_dlrm_trainer",
           "DLRM_TRAINER_KEYS"]

_CHOICES = {"pipeline": ("sparse_dist", "none"), "dispatch": ("eager", "graphs"),
            "mixed_precision": ("autocast", "pure")}


@dataclass(frozen=True, slots=True, kw_only=True)
class DlrmTrainer:
    """Trainer settings of a DLRM step (defaults: TorchRec's pipelined eager training)."""

    pipeline: str = "sparse_dist"
    dispatch: str = "eager"
    mixed_precision: str = "autocast"

    @property
    def pipelined(self) -> bool:
        """True when the next batch's input dist overlaps this batch's compute."""
        return self.pipeline == "sparse_dist"

    @property
    def elementwise_bytes(self) -> float | None:
        """Bytes per element of the dense part's elementwise ops: 4 under autocast (fp32),
        None when they take the dense dtype's size."""
        return 4.0 if self.mixed_precision == "autocast" else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DLRM_TRAINER_KEYS = tuple(f.name for f in fields(DlrmTrainer))


def _check(key: str, value: Any, source: str, where: str) -> str:
    if key not in _CHOICES:
        raise SpecError(f"unknown trainer setting {key!r}", source=source, field=where,
                        fix=f"use one of: {', '.join(DLRM_TRAINER_KEYS)}")
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
    kw = {str(k): _check(str(k), v, source, f"trainer.{k}") for k, v in value.items()}
    return DlrmTrainer(**kw)


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
