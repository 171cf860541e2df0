"""What the training framework does, as far as step time and memory depend on it.

The same model, parallel layout and GPUs run at different speeds under different trainers: which
attention kernel they call, whether norms and dropouts are sequence-parallel, whether
tensor-parallel collectives hide behind GEMMs, when and in which type gradients are reduced,
whether pipeline sends block the compute stream, and how layers are split over pipeline stages.
A spec states these in a ``trainer:`` section (every key optional)::

    trainer:
      preset: megatron-core     # megatron-lm-2021 | megatron-lm-2022 | megatron-deepspeed |
                                # megatron-core | torchtitan
      attention: flash          # flash | standard (s×s scores in memory)
      sequence_parallel: true   # norms/dropouts on 1/tp of the sequence (Korthikanti 2022)
      tp_comm_overlap: false    # TP all-gather/reduce-scatter hidden behind GEMMs (needs SP)
      grad_reduce: overlapped   # overlapped (buckets during the last backward) | after_backward
      grad_reduce_dtype: fp32   # fp32 | bf16 | fp16: the gradients' type on the wire
      pp_comm_overlap: true     # false: a pipeline send blocks its rank's compute stream
      trim_first_last_stage: 0  # layers taken off the first and the last pipeline stage

Keys override the preset's values; ``--trainer NAME`` and ``--trainer-set KEY=VALUE`` do the
same on the command line. :data:`PRESETS` documents each preset with the version it describes
and its source.

>>> t = trainer_from_mapping({"preset": "megatron-deepspeed"}, source="spec.yaml")
>>> t.attention, t.grad_reduce, t.grad_bytes
('standard', 'after_backward', 2)
>>> override(t, ["attention=flash"]).attention
'flash'
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping, Sequence

from simulator.errors import SpecError
from simulator.validation import Fields

__all__ = ["TrainerSpec", "PRESETS", "DEFAULT_PRESET", "trainer_from_mapping", "preset",
           "override", "trainer_from_args", "TRAINER_KEYS"]

ATTENTION = ("flash", "standard")
GRAD_REDUCE = ("overlapped", "after_backward")
GRAD_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEFAULT_PRESET = "megatron-core"


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainerSpec:
    """Trainer settings (defaults: Megatron-Core, the behaviour before this section existed)."""

    preset: str = DEFAULT_PRESET
    attention: str = "flash"
    sequence_parallel: bool = True
    tp_comm_overlap: bool = False
    grad_reduce: str = "overlapped"
    grad_reduce_dtype: str = "fp32"
    pp_comm_overlap: bool = True
    trim_first_last_stage: int = 0

    @property
    def grad_bytes(self) -> int:
        """Bytes per gradient element on the wire."""
        return GRAD_DTYPES[self.grad_reduce_dtype]

    @property
    def dp_buckets(self) -> int:
        """Gradient buckets the last backward is cut into (1: one reduction after it)."""
        return 4 if self.grad_reduce == "overlapped" else 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


TRAINER_KEYS = tuple(f.name for f in fields(TrainerSpec))

#: preset name -> settings, plus ``describes`` (trainer and version) and ``source`` (why)
PRESETS: dict[str, dict[str, Any]] = {
    "megatron-lm-2021": {
        "describes": "NVIDIA Megatron-LM v2.x (2021), the PTD-P code of Narayanan et al., SC'21",
        "source": "Megatron-LM v2 training.py all-reduces gradients (allreduce_gradients) after "
                  "forward_backward_func returns, in the parameters' type unless "
                  "--accumulate-allreduce-grads-in-fp32; p2p_communication.py calls "
                  "torch.cuda.synchronize() after batch_isend_irecv; no flash attention or "
                  "sequence parallelism existed yet (fused softmax over s×s scores)",
        "attention": "standard", "sequence_parallel": False, "tp_comm_overlap": False,
        "grad_reduce": "after_backward", "grad_reduce_dtype": "fp16", "pp_comm_overlap": False,
        "trim_first_last_stage": 0},
    "megatron-lm-2022": {
        "describes": "NVIDIA Megatron-LM v3.0 (2022), the code of Korthikanti et al. 2022",
        "source": "Korthikanti et al. 2022 introduce sequence parallelism and selective "
                  "recompute in this version (its full-recompute baseline rows run without "
                  "sequence parallelism: set sequence_parallel: false); gradients still "
                  "all-reduced after the backward, pipeline p2p still synchronised",
        "attention": "standard", "sequence_parallel": True, "tp_comm_overlap": False,
        "grad_reduce": "after_backward", "grad_reduce_dtype": "fp32", "pp_comm_overlap": False,
        "trim_first_last_stage": 0},
    "megatron-deepspeed": {
        "describes": "microsoft/Megatron-DeepSpeed with the DeepSpeed pipeline engine "
                     "(DeepSpeed 0.7-0.12, 2022-2023), as used by vTrain and BLOOM",
        "source": "DeepSpeed's TrainSchedule issues ReduceGrads after the last BackwardPass "
                  "(ZeRO 0/1 do not overlap it) in the gradients' 16-bit type (fp32_allreduce "
                  "off by default); its pipeline SendActivation/RecvActivation are blocking "
                  "instructions of the engine; flash attention only with --use-flash-attn",
        "attention": "standard", "sequence_parallel": False, "tp_comm_overlap": False,
        "grad_reduce": "after_backward", "grad_reduce_dtype": "fp16", "pp_comm_overlap": False,
        "trim_first_last_stage": 0},
    "megatron-core": {
        "describes": "Megatron-Core 0.9-0.13 with Transformer Engine (2024-2025), default flags "
                     "of its GPT pre-training examples",
        "source": "--use-flash-attn / TE fused attention, --sequence-parallel, "
                  "--overlap-grad-reduce with the distributed optimizer (fp32 main gradients "
                  "unless --grad-reduce-in-bf16), overlapped p2p; --tp-comm-overlap is opt-in",
        "attention": "flash", "sequence_parallel": True, "tp_comm_overlap": False,
        "grad_reduce": "overlapped", "grad_reduce_dtype": "fp32", "pp_comm_overlap": True,
        "trim_first_last_stage": 0},
    "torchtitan": {
        "describes": "pytorch/torchtitan 0.2-0.3 (2025): FSDP2, DTensor TP, torch.distributed "
                     "pipelining",
        "source": "SDPA/flex flash attention; its TP plan shards norms with SequenceParallel; "
                  "FSDP2 reduce-scatters each block's gradients during backward in "
                  "mixed_precision_reduce = float32; async TP is opt-in",
        "attention": "flash", "sequence_parallel": True, "tp_comm_overlap": False,
        "grad_reduce": "overlapped", "grad_reduce_dtype": "fp32", "pp_comm_overlap": True,
        "trim_first_last_stage": 0},
}


def preset(name: str, *, source: str = "trainer.preset", field: str = "preset") -> TrainerSpec:
    """The settings of preset ``name``."""
    if name not in PRESETS:
        raise SpecError(f"unknown trainer preset {name!r}", source=source, field=field,
                        fix=f"use one of: {', '.join(PRESETS)}")
    settings = {k: v for k, v in PRESETS[name].items() if k in TRAINER_KEYS}
    return TrainerSpec(preset=name, **settings)


def trainer_from_mapping(doc: Mapping[str, Any] | None, *, source: str,
                         prefix: str = "trainer") -> TrainerSpec:
    """A ``trainer:`` mapping (None: the default preset) as a :class:`TrainerSpec`."""
    f = Fields(doc or {}, source, prefix)
    f.check_keys(set(TRAINER_KEYS))
    base = preset(f.str("preset", DEFAULT_PRESET, choices=tuple(PRESETS)), source=source,
                  field=f.path("preset"))
    values = {
        "attention": f.str("attention", base.attention, choices=ATTENTION),
        "sequence_parallel": f.bool("sequence_parallel", base.sequence_parallel),
        "tp_comm_overlap": f.bool("tp_comm_overlap", base.tp_comm_overlap),
        "grad_reduce": f.str("grad_reduce", base.grad_reduce, choices=GRAD_REDUCE),
        "grad_reduce_dtype": f.str("grad_reduce_dtype", base.grad_reduce_dtype,
                                   choices=tuple(GRAD_DTYPES)),
        "pp_comm_overlap": f.bool("pp_comm_overlap", base.pp_comm_overlap),
        "trim_first_last_stage": f.int("trim_first_last_stage", base.trim_first_last_stage,
                                       minimum=0, maximum=10_000),
    }
    t = replace(base, **values)
    if t.tp_comm_overlap and not t.sequence_parallel:
        raise f.err("tp_comm_overlap", "tp_comm_overlap needs sequence_parallel (it overlaps "
                    "the all-gathers and reduce-scatters that sequence parallelism issues)",
                    "set sequence_parallel: true or tp_comm_overlap: false")
    return t


def _parse_value(key: str, text: str) -> Any:
    if key in ("sequence_parallel", "tp_comm_overlap", "pp_comm_overlap"):
        low = text.strip().lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        return text
    if key == "trim_first_last_stage":
        try:
            return int(text)
        except ValueError:
            return text
    return text.strip()


def override(t: TrainerSpec, items: Sequence[str], *, source: str = "--trainer-set") -> TrainerSpec:
    """``t`` with ``KEY=VALUE`` items applied (``preset=NAME`` first resets to that preset)."""
    doc: dict[str, Any] = {}
    for item in items:
        for part in item.split(","):
            key, eq, val = part.partition("=")
            key = key.strip()
            if not eq or key not in TRAINER_KEYS:
                raise SpecError(f"bad item {part!r}", source=source, field=key or None,
                                fix=f"write KEY=VALUE with KEY one of: {', '.join(TRAINER_KEYS)}")
            doc[key] = _parse_value(key, val)
    name = doc.pop("preset", None)
    base = t.to_dict() if name is None else {"preset": name}
    return trainer_from_mapping({**base, **doc}, source=source, prefix="")


def trainer_from_args(t: TrainerSpec, name: str | None, sets: Sequence[str] | None) -> TrainerSpec:
    """The spec's trainer ``t`` with ``--trainer NAME`` and ``--trainer-set KEY=VALUE`` applied."""
    if name:
        t = preset(name, source="--trainer", field="--trainer")
    return override(t, sets or [])
