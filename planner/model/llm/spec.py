"""Transformer training specs (YAML): ``model``, ``training`` and optional ``parallel`` sections.

Exactly these fields (MoE fields are an extension)::

    model: {kind: transformer, name, layers, hidden_size, ffn_hidden_size, num_heads,
            num_kv_heads, vocab_size, seq_len, ffn: swiglu|gelu}
    training: {global_batch_size (sequences), micro_batch_size, precision: bf16|fp16|fp8|fp32,
               activation_recompute: none|selective|full,
               documents: {...},   (packed variable-length documents: documents.py)
               offload: {alpha}}   (token-wise activation swap: offload.py)
    parallel: {tp, cp, pp, dp, vpp, fsdp: none|zero1|zero2|zero3|hsdp}
    trainer: {preset, attention, sequence_parallel, ...}   (planner/model/llm/trainer.py)

Mixture of experts (extension): ``model.num_experts`` (E > 1 makes every block's MLP E experts
of width ``ffn_hidden_size``) and ``model.top_k`` (experts per token); ``parallel.ep`` splits
the experts over ``ep`` data-parallel ranks (expert parallelism, carved from DP as in
Megatron-Core), which exchange tokens with an all-to-all before and after the experts.

Built-in specs (``planner/models/``) load by name: ``llama3-405b``, ``gpt3-175b`` ...
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.fileio import builtin_names, read_spec_mapping
from simulator.validation import Fields

from planner.model.llm.documents import DocumentSpec, parse_documents
from planner.model.llm.offload import OffloadSpec, parse_offload
from planner.model.llm.trainer import TrainerSpec, trainer_from_mapping

__all__ = ["ModelSpec", "TrainingSpec", "ParallelSpec", "LLMSpec", "load_llm_spec",
           "builtin_model_names", "parse_parallel", "spec_document"]

PRECISIONS = ("bf16", "fp16", "fp8", "fp32")
RECOMPUTE = ("none", "selective", "full")
FSDP = ("none", "zero1", "zero2", "zero3", "hsdp")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A dense (optionally MoE) decoder-only transformer; sizes are counts, not bytes."""

    name: str
    layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    ffn: str = "swiglu"
    num_experts: int = 0
    top_k: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def expert_params(self) -> int:
        """Weights of one expert MLP (one FFN of width ``ffn_hidden_size``)."""
        return (3 if self.ffn == "swiglu" else 2) * self.hidden_size * self.ffn_hidden_size

    @property
    def dense_params_per_layer(self) -> int:
        """Weights of one block outside the experts: attention (Q, K, V, O), 2 norms, router."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        router = h * self.num_experts if self.is_moe else 0
        return h * h + 2 * h * kv + h * h + 2 * h + router

    @property
    def params_per_layer(self) -> int:
        """All weights of one block: attention + every expert's MLP (one MLP if dense) + norms."""
        return self.dense_params_per_layer + self.expert_params * max(1, self.num_experts)

    @property
    def active_params_per_layer(self) -> int:
        """Weights one token touches in a block: the dense part and ``top_k`` experts."""
        k = self.top_k if self.is_moe else 1
        return self.dense_params_per_layer + self.expert_params * k

    def layer_params_per_rank(self, ep: int = 1) -> float:
        """Weights of one block held by an expert-parallel rank (before TP sharding)."""
        if not self.is_moe:
            return self.params_per_layer
        return self.dense_params_per_layer + self.expert_params * self.num_experts / ep

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def total_params(self) -> int:
        """All weights, with untied input and output embeddings."""
        return self.layers * self.params_per_layer + 2 * self.embedding_params + self.hidden_size

    @property
    def non_embedding_params(self) -> int:
        return self.layers * self.params_per_layer

    @property
    def active_non_embedding_params(self) -> int:
        """Non-embedding weights used per token (= all of them for a dense model)."""
        return self.layers * self.active_params_per_layer


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    global_batch_size: int
    micro_batch_size: int = 1
    precision: str = "bf16"
    activation_recompute: str = "none"
    documents: DocumentSpec | None = None     # packed variable-length documents (documents.py)
    offload: OffloadSpec | None = None        # token-wise activation swap (offload.py)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec:
    """Degrees of each axis; ``dp = 0`` means "whatever the GPU count leaves"."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 0
    vpp: int = 1
    fsdp: str = "none"
    ep: int = 1

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    def world(self) -> int:
        return self.model_parallel * self.dp


@dataclass(frozen=True, slots=True, kw_only=True)
class LLMSpec:
    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec | None
    source: str
    trainer: TrainerSpec = field(default_factory=TrainerSpec)


def spec_document(spec: LLMSpec, parallel: ParallelSpec | None = None) -> dict[str, Any]:
    """The spec as the document a user writes (``model:``, ``training:``, ``parallel:``,
    ``trainer:``): :func:`parse_llm_spec` reads it back to an equal spec. ``parallel``
    replaces the spec's own layout (a plan's chosen one)."""
    par = parallel if parallel is not None else spec.parallel
    training = asdict(spec.training)
    training.pop("documents")
    training.pop("offload")
    if spec.training.documents is not None:
        training["documents"] = spec.training.documents.to_dict()
    if spec.training.offload is not None:
        training["offload"] = spec.training.offload.to_dict()
    doc: dict[str, Any] = {"model": {"kind": "transformer", **asdict(spec.model)},
                           "training": training}
    if par is not None:
        doc["parallel"] = asdict(par)
    doc["trainer"] = spec.trainer.to_dict()
    return doc


def builtin_model_names() -> list[str]:
    return builtin_names("planner.models")


def load_llm_spec(ref: str | Path) -> LLMSpec:
    """Load a model spec by path or built-in name."""
    doc, source = read_spec_mapping(ref, package="planner.models", what="model",
                                    fix="write model:, training: and optionally parallel: sections")
    return parse_llm_spec(doc, source=source)


def parse_llm_spec(doc: Mapping[str, Any], *, source: str) -> LLMSpec:
    f = Fields(doc, source)
    f.check_keys({"model", "training", "parallel", "trainer", "description", "notes"})
    m = f.sub("model", required=True)
    m.check_keys({"kind", "name", "layers", "hidden_size", "ffn_hidden_size", "num_heads",
                  "num_kv_heads", "vocab_size", "seq_len", "ffn", "num_experts", "top_k"})
    m.str("kind", "transformer", choices=("transformer",))
    model = ModelSpec(
        name=m.str("name", "model"), layers=m.int("layers", required=True, minimum=1),
        hidden_size=m.int("hidden_size", required=True, minimum=1),
        ffn_hidden_size=m.int("ffn_hidden_size", required=True, minimum=1),
        num_heads=m.int("num_heads", required=True, minimum=1),
        num_kv_heads=m.int("num_kv_heads", m.data.get("num_heads"), minimum=1),
        vocab_size=m.int("vocab_size", required=True, minimum=1),
        seq_len=m.int("seq_len", required=True, minimum=1),
        ffn=m.str("ffn", "swiglu", choices=("swiglu", "gelu")),
        num_experts=m.int("num_experts", 0, minimum=0), top_k=m.int("top_k", 1, minimum=1))
    if model.hidden_size % model.num_heads:
        raise m.err("num_heads", f"hidden_size {model.hidden_size} is not divisible by "
                    f"num_heads {model.num_heads}", "choose heads that divide hidden_size")
    if model.num_experts == 1 or (model.num_experts and model.top_k > model.num_experts):
        raise m.err("num_experts" if model.num_experts == 1 else "top_k",
                    f"num_experts {model.num_experts}, top_k {model.top_k}: an MoE needs "
                    "num_experts ≥ 2 and top_k ≤ num_experts",
                    "set num_experts: 0 for a dense model, or top_k ≤ num_experts")
    if model.num_heads % model.num_kv_heads:
        raise m.err("num_kv_heads", f"num_heads {model.num_heads} is not a multiple of "
                    f"num_kv_heads {model.num_kv_heads}", "use a divisor of num_heads")
    t = f.sub("training", required=True)
    t.check_keys({"global_batch_size", "micro_batch_size", "precision", "activation_recompute",
                  "documents", "offload"})
    docs = None
    if t.has("documents"):
        base = Path(source).parent if Path(source).is_file() else None
        docs = parse_documents(t.sub("documents"), seq_len=model.seq_len, base=base)
    training = TrainingSpec(
        global_batch_size=t.int("global_batch_size", required=True, minimum=1),
        micro_batch_size=t.int("micro_batch_size", 1, minimum=1),
        precision=t.str("precision", "bf16", choices=PRECISIONS),
        activation_recompute=t.str("activation_recompute", "none", choices=RECOMPUTE),
        documents=docs, offload=parse_offload(t.sub("offload")) if t.has("offload") else None)
    if docs is not None and training.micro_batch_size != 1:
        raise t.err("micro_batch_size", f"micro_batch_size {training.micro_batch_size} with "
                    "packed documents: a micro-batch is one packed sequence",
                    "set micro_batch_size: 1 (documents are packed into each sequence)")
    parallel = None
    if f.has("parallel"):
        pf = f.sub("parallel")
        parallel = _parallel_fields(pf)
    trainer = trainer_from_mapping(f.sub("trainer").data, source=source)
    return LLMSpec(model=model, training=training, parallel=parallel, source=source,
                   trainer=trainer)


def _parallel_fields(pf: Fields) -> ParallelSpec:
    pf.check_keys({"tp", "cp", "pp", "dp", "vpp", "fsdp", "ep"})
    return ParallelSpec(tp=pf.int("tp", 1, minimum=1), cp=pf.int("cp", 1, minimum=1),
                        pp=pf.int("pp", 1, minimum=1), dp=pf.int("dp", 0, minimum=0),
                        vpp=pf.int("vpp", 1, minimum=1),
                        fsdp=pf.str("fsdp", "none", choices=FSDP), ep=pf.int("ep", 1, minimum=1))


def parse_parallel(text: str, base: ParallelSpec | None = None) -> ParallelSpec:
    """``'tp=8,cp=1,pp=16,dp=128,vpp=1,fsdp=zero1'`` → :class:`ParallelSpec` (``--parallel``)."""
    values: dict[str, Any] = {}
    for item in text.split(","):
        key, eq, val = item.partition("=")
        key = key.strip()
        if not eq or key not in ("tp", "cp", "pp", "dp", "vpp", "fsdp", "ep"):
            raise SpecError(f"bad item {item!r}", source="--parallel",
                            fix="write e.g. tp=8,cp=1,pp=16,dp=128,vpp=1,fsdp=zero1,ep=1")
        if key in values:
            raise SpecError(f"{key} is given twice", source="--parallel", field=key,
                            fix=f"give {key} once")
        if key == "fsdp":
            values[key] = val.strip()
        else:
            try:
                values[key] = int(val)
            except ValueError:
                raise SpecError(f"{key}={val!r} is not an integer", source="--parallel",
                                field=key, fix=f"write {key}=N") from None
    doc = {**({} if base is None else {k: getattr(base, k) for k in base.__slots__}), **values}
    return _parallel_fields(Fields(doc, "--parallel"))
