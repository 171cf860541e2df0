"""One training step of a transformer as a simulator workload.

Representative ranks: all data-parallel replicas, tensor-parallel and context-parallel ranks of a
pipeline stage do the same work at the same time, so compute and pipeline sends are issued for
one representative per stage (``tp = cp = dp = 0``). Tensor- and context-parallel collectives
are blocking inside each block (Megatron), so their time, simulated once on the actual TP/CP
group, is part of the block's time. Data-parallel traffic is issued for real: every TP×CP
position of every stage reduces its gradient buckets over its whole DP group, overlapping the
last micro-batch's backward, so DP traffic of the whole cluster shares the fabric.

``build_step(..., expand_collectives=True)`` lists every collective of the step instead: each
block's TP (and CP) collectives become explicit ops on the stage representative's real TP/CP
group, in the order a Megatron-style trainer issues them (forward: the all-reduces after the
attention and MLP output projections; backward: those of the MLP and QKV input gradients;
the recompute forward's again under full recompute; with sequence parallelism all-gathers and
reduce-scatters instead), plus the vocabulary-parallel embedding and cross-entropy collectives,
and parameters are counted per rank exactly (norms replicated over TP; :mod:`.partition`);
the passes are emitted by :mod:`.emit`. :func:`~planner.workloads.llm.comm_events.comm_events` reads
the per-rank ordered communication events of any step workload back, expanding the
representative folding to every rank. ``planner/measure/validate`` compares them with a real run.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simulator.compute import ComputeProfile, load_compute_profile
from simulator.errors import SpecError
from simulator.topology import Topology
from simulator.workload import Workload

from planner.model.llm.host import HostOverhead
from planner.model.llm.kernels import bytes_per_element
from planner.model.llm.layout import Layout
from planner.model.llm.offload import check_offload
from planner.model.llm.schedule import schedule
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.workloads.llm.emit import PassEmitter
from planner.workloads.llm.partition import p2p_activation_bytes
from planner.workloads.llm.passes import mb_times, offload_plan, pass_times
from planner.workloads.llm.pipeline import StepBuilder

__all__ = ["StepPlan", "build_step", "resolve_parallel", "MAX_MICROBATCHES"]

#: micro-batches per pipeline in one step at most: each is a few ops per stage and chunk, so a
#: step of millions would take minutes and gigabytes to build (real steps have tens to thousands)
MAX_MICROBATCHES = 65_536


@dataclass
class StepPlan:
    """The workload plus what was folded into compute ops (seconds per micro-batch)."""

    workload: Workload
    layout: Layout
    parallel: ParallelSpec
    microbatches: int
    fwd_s: list                  # per (stage, chunk): forward time of one micro-batch
    bwd_s: list
    tp_comm_s: list              # per (stage, chunk): TP+CP communication inside fwd+bwd
    representatives: list[int]
    info: dict = field(default_factory=dict)


def resolve_parallel(spec: LLMSpec, p: ParallelSpec, num_gpus: int) -> ParallelSpec:
    """Fill ``dp`` from the GPU count and check every divisibility rule (SpecError, exit 2)."""
    m, t = spec.model, spec.training
    if m.num_heads % p.tp:
        raise SpecError(f"num_heads {m.num_heads} is not divisible by tp {p.tp}",
                        source="--parallel", field="tp", fix="use a tp that divides num_heads")
    mp = p.tp * p.cp * p.pp
    if p.dp and mp * p.dp != num_gpus:
        raise SpecError(f"tp·cp·pp·dp = {p.tp}·{p.cp}·{p.pp}·{p.dp} = {mp * p.dp} does not match "
                        f"the {num_gpus} GPUs of the topology", source="--parallel", field="dp",
                        fix=f"choose degrees whose product is {num_gpus}, or resize with --gpus")
    if not p.dp and num_gpus % mp:
        raise SpecError(f"tp·cp·pp = {p.tp}·{p.cp}·{p.pp} = {mp} does not divide the {num_gpus} "
                        "GPUs of the topology", source="--parallel", field="tp",
                        fix=f"choose tp·cp·pp dividing {num_gpus}, or resize with --gpus")
    dp = p.dp or num_gpus // mp
    if p.tp > m.num_kv_heads and p.tp % m.num_kv_heads:
        raise SpecError(f"tp {p.tp} does not divide or get divided by num_kv_heads "
                        f"{m.num_kv_heads}", source="--parallel", field="tp",
                        fix="use a tp that divides num_kv_heads or a multiple of it")
    if p.cp > 1 and m.seq_len % (2 * p.cp):
        raise SpecError(f"seq_len {m.seq_len} is not divisible by 2·cp = {2 * p.cp}",
                        source="--parallel", field="cp", fix="use a cp with seq_len % (2·cp) == 0")
    if m.layers < p.pp * p.vpp:
        raise SpecError(f"{m.layers} layers cannot fill pp·vpp = {p.pp * p.vpp} stages",
                        source="--parallel", field="pp", fix="lower pp or vpp")
    if p.vpp > 1 and p.pp == 1:
        raise SpecError("vpp > 1 needs pp > 1", source="--parallel", field="vpp", fix="set vpp=1")
    micro = t.global_batch_size // (t.micro_batch_size * dp)
    if micro > MAX_MICROBATCHES:
        raise SpecError(f"global batch {t.global_batch_size:,} in micro-batches of "
                        f"{t.micro_batch_size} over dp {dp} is {micro:,} micro-batches per "
                        f"pipeline, more than the {MAX_MICROBATCHES:,} a step is built with",
                        source=spec.source, field="training.global_batch_size",
                        fix="use a smaller global batch, a larger micro-batch, or more dp")
    if t.global_batch_size % (t.micro_batch_size * dp):
        raise SpecError(f"global batch {t.global_batch_size} is not divisible by micro-batch "
                        f"{t.micro_batch_size} × dp {dp}", source="--parallel", field="dp",
                        fix="change the global batch, the micro-batch size or dp")
    if p.ep > 1:
        if not m.is_moe:
            raise SpecError(f"ep {p.ep} needs a mixture-of-experts model ({m.name} is dense)",
                            source="--parallel", field="ep",
                            fix="set ep=1, or give the model num_experts and top_k")
        if m.num_experts % p.ep or dp % p.ep:
            raise SpecError(f"ep {p.ep} must divide num_experts {m.num_experts} and dp {dp}",
                            source="--parallel", field="ep",
                            fix="use an ep that divides both (experts are split over DP ranks)")
    return replace(p, dp=dp)


def build_step(spec: LLMSpec, p: ParallelSpec, topo: Topology, *, order: str = "tp-cp-dp-pp",
               profile: ComputeProfile | None = None, schedule_name: str = "1f1b",
               dp_buckets: int | None = None, attention: str | None = None,
               sequence_parallel: bool | None = None, expand_collectives: bool = False,
               p2p_scatter_gather: bool | None = None,
               host: "HostOverhead | None | str" = "measured",
               host_serial: bool = False, grad_bytes: int | None = None,
               mb_scales: list[tuple[float, float]] | None = None) -> StepPlan:
    """Build the workload of one step; ``p`` must be resolved (see :func:`resolve_parallel`).

    ``mb_scales``: packed variable-length documents (planner/llm/packed.py). Micro-batch ``j``
    of the simulated pipeline runs ``(tokens, attention)`` times the work of one sequence of
    ``seq_len`` tokens holding one document: every pass's non-attention time scales with its
    tokens, its attention kernels (forward, backward, recompute) with the busiest CP rank's
    attention work. ``None``: every micro-batch is one whole-sequence document.

    ``expand_collectives``: every TP/CP collective becomes an op on its real group (see the
    module docstring) instead of simulated time folded into the block; parameters per rank
    are counted exactly, so DP bucket sizes are those of a real trainer's flat gradient buffer
    (:func:`dp_bucket_elements`, :func:`rank_params`). Mixture-of-experts models are refused.

    ``p2p_scatter_gather``: whether a pipeline send carries 1/tp of the activation (Megatron's
    scatter-gather). ``None`` keeps each mode's assumption: the folded step sends 1/tp (its
    gather is not modelled); the expanded step sends what Megatron-core sends: 1/tp slices with
    sequence parallelism, the whole activation without. ``True`` without sequence parallelism
    in the expanded step adds the receiver's TP all-gather as an op; ``False`` sends the whole
    activation (see :func:`p2p_activation_bytes`).

    ``host`` and ``host_serial``: see :func:`planner.workloads.llm.passes.pass_times`.

    The trainer's settings come from ``spec.trainer`` (planner/model/llm/trainer.py);
    ``attention``, ``sequence_parallel``, ``dp_buckets`` and ``grad_bytes`` override them
    (the validation harness describes its own small trainer this way).

    ``dp_buckets`` and ``grad_bytes``: the data-parallel gradient reduction. The last
    micro-batch's backward is cut into ``dp_buckets`` parts, each bucket reduced as soon as its
    part lands (Megatron-core's overlapped DDP); ``dp_buckets=1`` reduces all gradients after the
    last backward, not overlapped (DeepSpeed's engine, whose pipeline schedule issues
    ``ReduceGrads`` after the last ``BackwardPass``). ``grad_bytes`` per gradient element on the
    wire: 4 for fp32 main-gradient buffers (Megatron-core), 2 where fp16/bf16 gradients are
    reduced in their own type (DeepSpeed without ``fp32_allreduce``).
    """
    m, t, tr = spec.model, spec.training, spec.trainer
    attention = tr.attention if attention is None else attention
    sequence_parallel = tr.sequence_parallel if sequence_parallel is None else sequence_parallel
    grad_bytes = tr.grad_bytes if grad_bytes is None else grad_bytes
    if dp_buckets is None:
        dp_buckets = tr.dp_buckets
    if expand_collectives and (m.is_moe or p.ep > 1):
        raise SpecError("expand_collectives does not list mixture-of-experts all-to-alls yet",
                        source=spec.source, field="model.num_experts",
                        fix="use a dense model, or simulate without expanded collectives")
    if t.offload is not None:
        check_offload(spec.source, t.activation_recompute, p.pp)
        expand_collectives = True           # the swap is issued block by block
    prof = profile or load_compute_profile(topo.gpu)
    lay = Layout(p.tp, p.cp, p.dp, p.pp, order)
    b = t.micro_batch_size
    micro = t.global_batch_size // (b * p.dp)
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    e_w = 2 if t.precision == "fp8" else e
    reps = [lay.rank(pp=s) for s in range(p.pp)]

    detail: dict = {}
    fwd_s, bwd_s, tpc_s, chunk_layers = pass_times(spec, p, topo, lay, prof, detail=detail,
                                                   attention=attention,
                                                   sequence_parallel=sequence_parallel,
                                                   include_comm=not expand_collectives,
                                                   host=host, host_serial=host_serial,
                                                   tp_comm_overlap=tr.tp_comm_overlap
                                                   and sequence_parallel)

    w = Workload(name=f"{m.name} step")
    act, p2p_gather = p2p_activation_bytes(spec, p, sequence_parallel=sequence_parallel,
                                           scatter_gather=p2p_scatter_gather,
                                           expanded=expand_collectives)
    offload = offload_plan(spec, p, topo, detail, sequence_parallel, attention) \
        if t.offload is not None else None
    emit = PassEmitter(w, spec, p, lay, reps, detail, chunk_layers,
                       sequence_parallel=sequence_parallel,
                       offload=offload) if expand_collectives else None
    steps = StepBuilder(w, spec, p, lay, reps, chunk_layers, fwd_s, bwd_s, micro=micro,
                         weight_bytes=e_w, grad_bytes=grad_bytes, dp_buckets=dp_buckets,
                         act_bytes=act, p2p_gather=p2p_gather, emit=emit,
                         expanded=expand_collectives, pp_blocking=not tr.pp_comm_overlap,
                         reduce_after=tr.grad_reduce == "after_backward" and dp_buckets == 1,
                         mb_times=mb_times(fwd_s, bwd_s, detail, chunk_layers, mb_scales,
                                            spec.training.activation_recompute))
    steps.fsdp_gathers()
    steps.passes({s: schedule(schedule_name, p.pp, micro, s, p.vpp) for s in range(p.pp)})
    steps.optimizer_steps()
    return StepPlan(workload=w, layout=lay, parallel=p, microbatches=micro, fwd_s=fwd_s,
                    bwd_s=bwd_s, tp_comm_s=tpc_s, representatives=reps,
                    info={"chunk_layers": chunk_layers, **detail,
                          **({"offload": offload} if offload is not None else {})})
