"""What one validation run executes: a scaled-down transformer and the plan's parallel layout.

A plan or model spec describes a model far too large for this machine; ``clusterplan validate``
keeps its shape (SwiGLU or GELU, the GQA ratio, the FFN ratio, activation recompute) and its
parallel layout (tp, pp, dp, vpp, rank order, schedule), and scales sizes down to what a few
CPU processes run in seconds. The simulator's expected step and the real run both use the
scaled spec, so what is compared is the same plan on the same model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import read_json_file

from planner.export._plan import check_plan
from planner.measure.heap import DEFAULT_HEAP
from planner.model.llm.layout import Layout
from planner.model.llm.spec import (
    LLMSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    load_llm_spec,
    parse_parallel,
)

__all__ = ["Scale", "Fault", "RunConfig", "load_source", "scaled_spec", "run_config",
           "parse_fault"]

SCHEDULES = ("1f1b", "gpipe", "interleaved")
FAULT_KINDS = ("raise", "hang", "exit")
MAX_PROCESSES = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class Scale:
    """Sizes of the scaled-down model; ``None`` derives one from the spec and the layout."""

    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    ffn: int | None = None
    vocab: int | None = None
    seq: int | None = None
    micro_batch: int = 1
    microbatches: int | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """An injected failure (``--inject-fault RANK:KIND@STEP``): ``raise`` an exception,
    ``hang`` (sleep past every timeout) or ``exit`` (die without a report) at the start of
    step ``step`` (0-based, warm-up steps included)."""

    rank: int
    kind: str
    step: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunConfig:
    """Everything a worker process needs (picklable; no torch objects)."""

    spec: LLMSpec
    parallel: ParallelSpec
    order: str = "tp-cp-dp-pp"
    schedule: str = "1f1b"
    steps: int = 3
    warmup: int = 1
    dp_buckets: int = 4
    p2p_scatter_gather: bool = False
    timeout_s: float = 60.0
    seed: int = 1234
    trace_dir: str | None = None
    fault: Fault | None = None
    backend: str = "gloo"
    heap: str = DEFAULT_HEAP        # what the ranks' C heap does with freed memory
    extra: dict = field(default_factory=dict)

    @property
    def world(self) -> int:
        return self.parallel.world()

    @property
    def microbatches(self) -> int:
        t = self.spec.training
        return t.global_batch_size // (t.micro_batch_size * self.parallel.dp)

    def to_dict(self) -> dict:
        m, t, p = self.spec.model, self.spec.training, self.parallel
        return {"model": asdict(m), "training": asdict(t),
                "parallel": {k: getattr(p, k) for k in ("tp", "cp", "pp", "dp", "vpp", "fsdp")},
                "order": self.order, "schedule": self.schedule, "steps": self.steps,
                "warmup": self.warmup, "dp_buckets": self.dp_buckets,
                "p2p_scatter_gather": self.p2p_scatter_gather, "timeout_s": self.timeout_s,
                "backend": self.backend, "heap": self.heap, "processes": self.world,
                "microbatches": self.microbatches}


def load_source(ref: str) -> tuple[LLMSpec, ParallelSpec | None, str, str]:
    """A model spec (YAML path or built-in name) or a plan JSON of ``clusterplan plan``:
    the spec, its parallel layout (if any), the rank order and the source name."""
    path = Path(ref)
    if path.suffix == ".json":
        if not path.exists():
            raise SpecError("no such plan file", source=ref,
                            fix="pass a plan written by `clusterplan plan MODEL --out plan.json`"
                                " or a model spec")
        plan = read_json_file(path, field="PLAN", missing_fix="check the path",
                              json_fix="pass the file written by `clusterplan plan ... --out`")
        plan = check_plan(plan, source=ref)
        try:
            spec = load_llm_spec(plan.get("model", ""))
        except SpecError:
            raise SpecError(f"model {plan.get('model')!r} of the plan is not a built-in model",
                            source=ref, field="model",
                            fix="pass the model's YAML spec with --parallel instead") from None
        tr = replace(spec.training, global_batch_size=plan["global_batch_size"],
                     micro_batch_size=plan["micro_batch_size"],
                     activation_recompute=plan.get("activation_recompute",
                                                   spec.training.activation_recompute))
        par = plan["parallel"]
        p = ParallelSpec(tp=par["tp"], cp=par["cp"], pp=par["pp"], dp=par["dp"],
                         vpp=par["vpp"], fsdp=par.get("fsdp", "none"), ep=par.get("ep", 1))
        return replace(spec, training=tr, source=ref), p, plan.get("order", "tp-cp-dp-pp"), ref
    spec = load_llm_spec(ref)
    return spec, spec.parallel, "tp-cp-dp-pp", spec.source


def parse_fault(text: str | None) -> Fault | None:
    """``'1:hang@2'`` → :class:`Fault` (rank 1 hangs at step 2); ``None`` → no fault."""
    if not text:
        return None
    head, _, step = text.partition("@")
    rank, _, kind = head.partition(":")
    try:
        f = Fault(int(rank), kind.strip(), int(step) if step else 0)
    except ValueError:
        raise SpecError(f"bad fault {text!r}", field="--inject-fault",
                        fix="write RANK:KIND@STEP, e.g. 1:hang@1 (KIND raise, hang or exit)") \
            from None
    if f.kind not in FAULT_KINDS or f.rank < 0 or f.step < 0:
        raise SpecError(f"bad fault {text!r}", field="--inject-fault",
                        fix="write RANK:KIND@STEP with KIND raise, hang or exit")
    return f


def _pick(value: int | None, default: int, name: str, minimum: int = 1) -> int:
    v = default if value is None else value
    if v < minimum:
        raise SpecError(f"{v} is below {minimum}", field=f"--{name}",
                        fix=f"pass --{name} {minimum} or more")
    return v


def scaled_spec(spec: LLMSpec, p: ParallelSpec, scale: Scale) -> LLMSpec:
    """The spec scaled down for a real run of layout ``p`` (``p.dp`` resolved), fp32.

    Defaults keep the model's ratios: 4 blocks per virtual stage (at most the model's count),
    hidden 128, 4 heads (raised to tp), KV heads by the model's GQA ratio (at least tp),
    FFN width by the model's FFN/hidden ratio, vocabulary 512, sequence 64; 2·pp micro-batches
    (2 without PP, so gradients accumulate). Every size tensor parallelism splits must divide
    by tp (SpecError naming the flag otherwise)."""
    m, t = spec.model, spec.training
    tp, nv = p.tp, p.pp * p.vpp
    layers = _pick(scale.layers, max(nv, min(m.layers, 4 * nv)), "layers")
    heads = _pick(scale.heads, max(4, tp), "heads")
    hidden = _pick(scale.hidden, max(128, 16 * heads), "hidden")
    kv_default = max(tp, heads // max(1, m.num_heads // m.num_kv_heads))
    kv = _pick(scale.kv_heads, kv_default if heads % kv_default == 0 else heads, "kv-heads")
    ffn_default = max(tp, round(hidden * m.ffn_hidden_size / m.hidden_size / (8 * tp)) * 8 * tp)
    ffn = _pick(scale.ffn, ffn_default, "ffn")
    vocab = _pick(scale.vocab, 512, "vocab")
    seq = _pick(scale.seq, 64, "seq")
    mb = _pick(scale.micro_batch, 1, "micro-batch")
    micro = _pick(scale.microbatches, 2 * p.pp if p.pp > 1 else 2, "microbatches")
    checks = [("layers", layers < nv, f"{layers} blocks cannot fill pp·vpp = {nv} stages",
               f"pass --layers {nv} or more"),
              ("heads", heads % tp, f"{heads} heads do not split over tp {tp}",
               "pass --heads as a multiple of tp"),
              ("hidden", hidden % heads, f"hidden {hidden} is not divisible by {heads} heads",
               "pass --hidden as a multiple of --heads"),
              ("kv-heads", heads % kv or kv % tp,
               f"{kv} KV heads must divide {heads} heads and split over tp {tp}",
               "pass --kv-heads dividing --heads and divisible by tp"),
              ("ffn", ffn % tp, f"FFN width {ffn} does not split over tp {tp}",
               "pass --ffn as a multiple of tp"),
              ("vocab", vocab % tp, f"vocabulary {vocab} does not split over tp {tp}",
               "pass --vocab as a multiple of tp"),
              ("microbatches", p.vpp > 1 and micro % p.pp,
               f"the interleaved schedule needs micro-batches ({micro}) divisible by pp {p.pp}",
               f"pass --microbatches as a multiple of {p.pp}")]
    for name, bad, msg, fix in checks:
        if bad:
            raise SpecError(msg, field=f"--{name}", fix=fix)
    model = ModelSpec(name=f"{m.name}-scaled", layers=layers, hidden_size=hidden,
                      ffn_hidden_size=ffn, num_heads=heads, num_kv_heads=kv, vocab_size=vocab,
                      seq_len=seq, ffn=m.ffn)
    training = TrainingSpec(global_batch_size=mb * p.dp * micro, micro_batch_size=mb,
                            precision="fp32", activation_recompute=t.activation_recompute)
    return LLMSpec(model=model, training=training, parallel=p, source=spec.source)


def run_config(spec: LLMSpec, parallel: ParallelSpec | None, *, parallel_text: str | None,
               nproc: int | None, scale: Scale, order: str = "tp-cp-dp-pp",
               schedule: str = "1f1b", recompute: str | None = None, **kw) -> RunConfig:
    """Resolve the layout (``--parallel`` over the plan's, dp from ``--nproc``), check what
    the real run supports, and scale the model (see :func:`scaled_spec`)."""
    if parallel_text:
        parallel = parse_parallel(parallel_text, parallel)
    if parallel is None:
        raise SpecError("no parallel layout", source=spec.source, field="parallel",
                        fix="pass --parallel tp=2,pp=2,dp=1 or add a parallel: section")
    p = parallel
    mp = p.tp * p.cp * p.pp
    if nproc is not None and nproc < 1:
        raise SpecError(f"--nproc {nproc} runs nothing", field="--nproc", fix="pass 1 or more")
    if not p.dp:
        if nproc is None:
            raise SpecError(f"the layout leaves dp open and no --nproc gives it (tp·cp·pp = "
                            f"{mp})", field="--nproc",
                            fix=f"pass --nproc (a multiple of {mp}) or dp= in --parallel")
        if nproc % mp:
            raise SpecError(f"dp is open and --nproc {nproc} is not a multiple of tp·cp·pp = {mp}",
                            field="--nproc", fix=f"pass --nproc as a multiple of {mp}, or dp=")
        p = replace(p, dp=nproc // mp)
    if nproc is not None and nproc != p.world():
        raise SpecError(f"--nproc {nproc} but tp·cp·pp·dp = {p.world()}", field="--nproc",
                        fix=f"pass --nproc {p.world()} or change --parallel")
    if p.world() > MAX_PROCESSES:
        raise SpecError(f"the layout has {p.world()} ranks; validate runs at most "
                        f"{MAX_PROCESSES} processes on one machine", field="--parallel",
                        fix="scale the layout down, e.g. --parallel tp=2,pp=2,dp=1")
    unsupported = [("cp", p.cp > 1, "context parallelism is not run for real yet"),
                   ("ep", p.ep > 1 or spec.model.is_moe,
                    "mixture-of-experts layers are not run for real yet"),
                   ("fsdp", p.fsdp != "none",
                    f"fsdp={p.fsdp} is not run for real yet (data parallelism is a bucketed "
                    "all-reduce)")]
    for name, bad, msg in unsupported:
        if bad:
            raise SpecError(msg, field=f"parallel.{name}",
                            fix=f"validate the plan with {name}="
                                + ("none" if name == "fsdp" else "1") + " for now")
    if schedule not in SCHEDULES:
        raise SpecError(f"unknown schedule {schedule!r}", field="--schedule",
                        fix=f"use one of {', '.join(SCHEDULES)}")
    if p.vpp > 1 and schedule == "gpipe":
        raise SpecError("gpipe does not interleave virtual stages", field="--schedule",
                        fix="use 1f1b (interleaved with vpp > 1) or set vpp=1")
    if recompute is not None:
        spec = replace(spec, training=replace(spec.training, activation_recompute=recompute))
    Layout(p.tp, p.cp, p.dp, p.pp, order)      # checks the order
    scaled = scaled_spec(spec, p, scale)
    return RunConfig(spec=scaled, parallel=p, order=order, schedule=schedule, **kw)
