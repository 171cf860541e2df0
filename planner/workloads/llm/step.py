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

from simulator.collectives import simulate_collective
from simulator.compute import ComputeProfile, load_compute_profile, op_time
from simulator.errors import SpecError
from simulator.topology import Topology
from simulator.workload import Workload

from planner.model.llm.activations import block_terms
from planner.model.llm.host import HostOverhead, host_overhead_for
from planner.model.llm.kernels import block_kernels, bytes_per_element, kernels_time, logits_kernels
from planner.model.llm.layout import Layout
from planner.model.llm.offload import (
    OffloadPlan,
    alpha_closed_form,
    check_offload,
    host_copy_Bps,
    skeletal_split,
)
from planner.model.llm.schedule import schedule
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.model.llm.stages import chunk_layer_counts
from planner.workloads.llm.emit import PassEmitter
from planner.workloads.llm.partition import (
    dp_bucket_elements,
    p2p_activation_bytes,
    rank_params,
)

__all__ = ["StepPlan", "build_step", "resolve_parallel", "pass_times", "offload_plan_for",
           "MAX_MICROBATCHES"]

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

    ``host`` and ``host_serial``: see :func:`pass_times`.

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
    offload = _offload_plan(spec, p, topo, detail, sequence_parallel, attention) \
        if t.offload is not None else None
    emit = PassEmitter(w, spec, p, lay, reps, detail, chunk_layers,
                       sequence_parallel=sequence_parallel,
                       offload=offload) if expand_collectives else None
    steps = _StepBuilder(w, spec, p, lay, reps, chunk_layers, fwd_s, bwd_s, micro=micro,
                         weight_bytes=e_w, grad_bytes=grad_bytes, dp_buckets=dp_buckets,
                         act_bytes=act, p2p_gather=p2p_gather, emit=emit,
                         expanded=expand_collectives, pp_blocking=not tr.pp_comm_overlap,
                         reduce_after=tr.grad_reduce == "after_backward" and dp_buckets == 1,
                         mb_times=_mb_times(fwd_s, bwd_s, detail, chunk_layers, mb_scales,
                                            spec.training.activation_recompute))
    steps.fsdp_gathers()
    steps.passes({s: schedule(schedule_name, p.pp, micro, s, p.vpp) for s in range(p.pp)})
    steps.optimizer_steps()
    return StepPlan(workload=w, layout=lay, parallel=p, microbatches=micro, fwd_s=fwd_s,
                    bwd_s=bwd_s, tp_comm_s=tpc_s, representatives=reps,
                    info={"chunk_layers": chunk_layers, **detail,
                          **({"offload": offload} if offload is not None else {})})


class _StepBuilder:
    """Adds one step's ops to a workload, stage by stage: FSDP weight gathers, the passes of
    the pipeline schedule with their sends, the DP gradient reductions and the optimizer.
    Sizes are bytes, times seconds; ``emit`` (expanded collectives) emits passes op by op."""

    def __init__(self, w: Workload, spec: LLMSpec, p: ParallelSpec, lay: Layout,
                 reps: list[int], chunk_layers: list, fwd_s: list, bwd_s: list, *, micro: int,
                 weight_bytes: int, grad_bytes: int, dp_buckets: int, act_bytes: float,
                 p2p_gather: bool, emit: PassEmitter | None, expanded: bool,
                 pp_blocking: bool = False, reduce_after: bool = False,
                 mb_times: list | None = None) -> None:
        self.w, self.spec, self.p, self.reps = w, spec, p, reps
        self.chunk_layers, self.fwd_s, self.bwd_s, self.micro = chunk_layers, fwd_s, bwd_s, micro
        self.e_w, self.grad_bytes, self.dp_buckets = weight_bytes, grad_bytes, dp_buckets
        self.act, self.p2p_gather, self.emit, self.expanded = act_bytes, p2p_gather, emit, expanded
        self.nv = p.pp * p.vpp
        self.zero3 = p.fsdp in ("zero3", "hsdp")
        self.dp_reduce = "allreduce" if p.fsdp == "none" else "reducescatter"
        # context-parallel ranks hold the same weights: gradients are reduced (and FSDP
        # shards kept) over the dp·cp ranks of a TP position, as Megatron-Core and torchtitan do
        self.dp_groups = {s: [sorted(lay.rank(tp=i, cp=j, dp=d, pp=s)
                                     for j in range(p.cp) for d in range(p.dp))
                              for i in range(p.tp)]
                          for s in range(p.pp)}
        self.gathered: dict[tuple[int, int, str], list[int]] = {}
        self.done: dict[tuple[str, int, int], int] = {}     # (kind, vstage, mb) -> op id
        self.first_b: dict[tuple[int, int], bool] = {}
        self.last_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
        self.dp_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
        # pipeline sends, issued by the sender as its pass ends: (kind, sender vstage, mb) -> op;
        # ``pp_blocking``: a rank's next pass waits for its send (synchronous p2p)
        self.reduce_after = reduce_after and not expanded
        self.sent: dict[tuple[str, int, int], int] = {}
        self.pp_blocking = pp_blocking
        self.blocked: dict[int, int] = {}
        self.mb_times = mb_times        # per micro-batch (fwd_s, bwd_s) tables, or None

    def pass_s(self, kind: str, s: int, c: int, mb: int) -> float:
        """Seconds of pass ``kind`` (F/B) of micro-batch ``mb`` on chunk ``c`` of stage ``s``."""
        fwd, bwd = self.mb_times[mb] if self.mb_times else (self.fwd_s, self.bwd_s)
        return (fwd if kind == "F" else bwd)[s][c]

    def chunk_params(self, s: int, c: int) -> float:
        """Parameters held per rank in chunk ``c`` of stage ``s`` (DP traffic, optimizer)."""
        p, m = self.p, self.spec.model
        if self.expanded:
            return float(rank_params(self.spec, p, self.chunk_layers, s, c))
        n = self.chunk_layers[s][c] * m.layer_params_per_rank(p.ep)
        vs = c * p.pp + s
        if vs == 0 or vs == p.pp * p.vpp - 1:
            n += m.embedding_params
        return n / p.tp

    def dp_collectives(self, kind: str, s: int, size: float, deps: list[int],
                       name: str) -> list[int]:
        """One ``kind`` of ``size`` bytes per DP·CP group of stage ``s`` (none without)."""
        if self.p.dp * self.p.cp == 1 or size <= 0:
            return []
        # nccl-tests sizes: the full per-rank buffer (gradients in, parameters out)
        return [self.w.collective(kind, g, size, name=name, stream="dp", deps=deps,
                                  category="dp")
                for g in self.dp_groups[s]]

    def fsdp_gathers(self) -> None:
        """FSDP (ZeRO-3): gather each chunk's weights before its first forward."""
        if not self.zero3:
            return
        p = self.p
        for s in range(p.pp):
            for c in range(p.vpp):
                self.gathered[(s, c, "F")] = self.dp_collectives(
                    "allgather", s, self.chunk_params(s, c) * self.e_w, [],
                    f"fsdp gather s{s}c{c}")

    def passes(self, items: dict[int, list]) -> None:
        """Emit every stage's schedule ``items`` (kind, micro-batch, chunk), each pass once
        the pass it receives from on the neighbouring stage has been emitted."""
        p = self.p
        pos = {s: 0 for s in range(p.pp)}
        remaining = sum(len(v) for v in items.values())
        while remaining:
            progressed = False
            for s in range(p.pp):
                while pos[s] < len(items[s]):
                    kind, mb, c = items[s][pos[s]]
                    vs = c * p.pp + s
                    if not self._ready(kind, vs, mb):
                        break
                    oid = self._forward(s, c, mb) if kind == "F" else self._backward(s, c, mb)
                    self.done[(kind, vs, mb)] = oid
                    self._send(kind, s, vs, mb, oid)
                    self.last_ops[s].append(oid)
                    pos[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise SpecError("pipeline schedule cannot make progress", field="parallel",
                                fix="report this configuration as a bug")

    def _ready(self, kind: str, vs: int, mb: int) -> bool:
        """Whether the pass that feeds pass ``kind`` of micro-batch ``mb`` on virtual stage
        ``vs`` (the previous stage's forward, the next stage's backward) has been emitted."""
        if kind == "F":
            return vs == 0 or ("F", vs - 1, mb) in self.done
        return vs == self.nv - 1 or ("B", vs + 1, mb) in self.done

    def _send(self, kind: str, s: int, vs: int, mb: int, oid: int) -> None:
        """The pipeline send of pass ``kind`` (activation forward, gradient backward) that ends
        with op ``oid`` on virtual stage ``vs`` of stage ``s``; none at the pipeline's ends."""
        dst = vs + 1 if kind == "F" else vs - 1
        if not 0 <= dst < self.nv:
            return
        what = "act" if kind == "F" else "grad"
        sid = _p2p(self.w, self.p, self.reps, vs, dst, self.act, oid,
                   f"{what} mb{mb}" + (f" v{dst}" if self.emit else ""))
        self.sent[(kind, vs, mb)] = sid
        if self.pp_blocking and sid != oid:
            self.blocked[s] = sid

    def _stage_deps(self, s: int) -> list[int]:
        """What stage ``s``'s next pass waits for besides its data: its last blocking send."""
        sid = self.blocked.pop(s, None)
        return [] if sid is None else [sid]

    def _forward(self, s: int, c: int, mb: int) -> int:
        """The forward of micro-batch ``mb`` on chunk ``c`` of stage ``s``; its op id."""
        p, w, emit = self.p, self.w, self.emit
        vs = c * p.pp + s
        deps: list[int] = self._stage_deps(s)
        if vs > 0:
            deps.append(self.sent[("F", vs - 1, mb)])
        deps += self.gathered.get((s, c, "F"), [])
        if emit:
            return emit.forward(s, c, mb, deps, gather=self.p2p_gather and vs > 0)
        return w.compute(self.reps[s], f"F mb{mb} c{c}", duration_s=self.pass_s("F", s, c, mb),
                         deps=deps, category="fwd")

    def _backward(self, s: int, c: int, mb: int) -> int:
        """The backward of micro-batch ``mb`` on chunk ``c`` of stage ``s`` (the last one's
        with the DP gradient reductions); its op id."""
        p, w, emit = self.p, self.w, self.emit
        vs = c * p.pp + s
        deps: list[int] = self._stage_deps(s)
        if vs < self.nv - 1:
            deps.append(self.sent[("B", vs + 1, mb)])
        deps.append(self.done[("F", vs, mb)])
        if self.zero3 and not self.first_b.get((s, c)):
            self.first_b[(s, c)] = True
            deps += self.dp_collectives("allgather", s, self.chunk_params(s, c) * self.e_w, [],
                                        f"fsdp regather s{s}c{c}")
        last_mb = mb == self.micro - 1
        if emit:
            return self._expanded_backward(s, c, mb, deps, last_mb)
        if last_mb and p.dp * p.cp > 1 and not self.reduce_after:
            return self._bucketed_backward(s, c, mb, deps)
        return w.compute(self.reps[s], f"B mb{mb} c{c}", duration_s=self.pass_s("B", s, c, mb),
                         deps=deps, category="bwd")

    def _expanded_backward(self, s: int, c: int, mb: int, deps: list[int],
                           last_mb: bool) -> int:
        """A backward emitted op by op, its gradients reduced in buckets as they land."""
        p = self.p
        vs = c * p.pp + s
        k = max(1, min(self.dp_buckets, self.chunk_layers[s][c])) \
            if last_mb and p.dp * p.cp > 1 else 0
        sizes = dp_bucket_elements(round(self.chunk_params(s, c)), k)

        def reduce(j: int, dep: int) -> list[int]:
            return self.dp_collectives(self.dp_reduce, s, sizes[j] * self.grad_bytes, [dep],
                                       f"grads s{s}c{c}b{j}")
        oid, reduced = self.emit.backward(s, c, mb, deps, buckets=k, reduce=reduce,
                                          gather=self.p2p_gather and vs < self.nv - 1)
        self.dp_ops[s] += reduced
        return oid

    def _bucketed_backward(self, s: int, c: int, mb: int, deps: list[int]) -> int:
        """The last micro-batch's backward in buckets, each reduced as it lands; the last
        bucket's op id."""
        k = max(1, min(self.dp_buckets, self.chunk_layers[s][c]))
        prev = None
        for j in range(k):
            oid = self.w.compute(self.reps[s], f"B mb{mb} c{c} bucket{j}",
                                 duration_s=self.pass_s("B", s, c, mb) / k,
                                 deps=deps if prev is None else [prev], category="bwd")
            prev = oid
            self.dp_ops[s] += self.dp_collectives(self.dp_reduce, s,
                                                  self.chunk_params(s, c) * self.grad_bytes / k,
                                                  [oid], f"grads s{s}c{c}b{j}")
        return oid

    def optimizer_steps(self) -> None:
        """The optimizer step (and ZeRO-1/2 parameter all-gather) on each stage."""
        p = self.p
        for s in range(p.pp):
            params = sum(self.chunk_params(s, c) for c in range(p.vpp))
            last = self.last_ops[s][-1:] + self._stage_deps(s)
            if self.reduce_after:    # one reduction of the whole gradient buffer
                self.dp_ops[s] += self.dp_collectives(self.dp_reduce, s,
                                                      params * self.grad_bytes, last,
                                                      f"grads s{s}")
            shard = p.dp * p.cp if p.fsdp != "none" else 1
            opt = self.w.compute(self.reps[s], "optimizer", bytes_moved=30 * params / shard,
                                 deps=self.dp_ops[s] + last, category="optimizer")
            if p.fsdp in ("zero1", "zero2"):
                self.dp_collectives("allgather", s, params * self.e_w, [opt],
                                    f"param gather s{s}")


def pass_times(spec: LLMSpec, p: ParallelSpec, topo: Topology, lay: Layout,
               prof: ComputeProfile, comm_cache: dict | None = None, *,
               attention: str | None = None, sequence_parallel: bool | None = None,
               detail: dict | None = None, host: HostOverhead | None | str = "measured",
               include_comm: bool = True, host_serial: bool = False,
               tp_comm_overlap: bool | None = None):
    """Per (stage, chunk): forward and backward seconds of one micro-batch on the stage's
    representative (TP/CP collectives included, timed on their actual groups), the TP/CP part
    of it, and the blocks per chunk. ``comm_cache`` may be shared across calls.

    Each block pass takes at least the trainer's host time (``host``, planner/model/llm/host.py:
    ``"measured"`` reads the file for the topology's GPU kind, :func:`host_overhead_for`;
    ``None`` for a trainer without that floor, e.g. CUDA graphs). CPU devices run ops synchronously and get no floor, unless
    ``host_serial``: then the host time is *added* to the kernels' (a CPU thread dispatches
    and computes in turn), and the kernels are charged no launch overhead of their own (the
    measured host time already holds every op's dispatch), as ``clusterplan calibrate gloo``
    measures it for :mod:`planner.measure.validate`.

    ``include_comm=False`` leaves the TP/CP/EP collectives out of the pass times (the expanded
    step issues them as ops). ``attention``, ``sequence_parallel`` and ``tp_comm_overlap``
    default to ``spec.trainer``'s; with ``tp_comm_overlap`` each of a block's four TP
    all-gathers and reduce-scatters runs in chunks under the GEMM beside it (Transformer
    Engine's userbuffers), exposing ``max(c/tp, c − gemm)`` of its time ``c`` (the first chunk
    cannot overlap). ``detail`` receives, per stage, the seconds of one block's
    forward (``layer_fwd_s``), of its recompute (``layer_recompute_s``) and the rest of its
    backward (``layer_bwd_s``), and the embedding and logits parts (``embed_*``, ``logits_*``)."""
    m, t, tr = spec.model, spec.training, spec.trainer
    attention = tr.attention if attention is None else attention
    sequence_parallel = tr.sequence_parallel if sequence_parallel is None else sequence_parallel
    if tp_comm_overlap is None:
        tp_comm_overlap = tr.tp_comm_overlap and sequence_parallel
    b = t.micro_batch_size
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    T = b * m.seq_len / p.cp
    reps = [lay.rank(pp=s) for s in range(p.pp)]
    comm_cache = {} if comm_cache is None else comm_cache

    def coll(kind: str, ranks: list[int], size: float) -> float:
        key = (kind, tuple(ranks), size)
        if key not in comm_cache:
            comm_cache[key] = simulate_collective(topo, kind, ranks, size).time_s \
                if len(ranks) > 1 and size > 0 else 0.0
        return comm_cache[key]

    blk = block_kernels(m, b=b, tp=p.tp, cp=p.cp, precision=t.precision, attention=attention,
                        sequence_parallel=sequence_parallel, ep=p.ep)
    kprof = replace(prof, launch_overhead_s=0.0) if host_serial and host else prof
    blk_f, blk_b = kernels_time(kprof, blk), kernels_time(kprof, blk, backward=True)
    attn = [k for k in blk if k.name.startswith("attention")]
    attn_f, attn_b = kernels_time(prof, attn), kernels_time(prof, attn, backward=True)
    # the attention half of a block (QKV, attention, output projection): its share of the
    # block's kernel time, forward and backward (the host time splits the same way)
    half = [k for k in blk if k.name in ("qkv", "attn_out") or k.name.startswith("attention")]
    frac_f = kernels_time(kprof, half) / blk_f if blk_f > 0 else 0.5
    frac_b = kernels_time(kprof, half, backward=True) / blk_b if blk_b > 0 else 0.5
    logit = logits_kernels(m, b=b, tp=p.tp, cp=p.cp, precision=t.precision)
    logit_f, logit_b = kernels_time(prof, logit), kernels_time(prof, logit, backward=True)

    if isinstance(host, str):
        host = host_overhead_for(topo.gpu.name) if topo.gpu.name != "cpu" else None
    host_f = host.forward_s if host else 0.0
    host_b = host.backward_pass_s(t.activation_recompute) if host else 0.0

    def floor(kernel_s: float, host_s: float) -> float:
        return kernel_s + host_s if host_serial else max(kernel_s, host_s)
    # GEMMs a TP all-gather / reduce-scatter hides under with tp_comm_overlap (s each)
    beside = [kernels_time(kprof, [k]) for k in blk
              if k.name in ("qkv", "attn_out", "mlp_up", "mlp_down")] if tp_comm_overlap else []
    layers_per_chunk = chunk_layer_counts(m.layers, p.pp, p.vpp, tr.trim_first_last_stage)
    fwd_s, bwd_s, tpc_s = [], [], []
    chunk_layers = []
    for s in range(p.pp):
        tp_ar, cp_ag, ep_a2a = _stage_collectives(spec, p, lay, reps[s], coll) \
            if include_comm else (0.0, 0.0, 0.0)
        if detail is not None:   # EP all-to-all seconds per micro-batch and layer, per stage
            detail.setdefault("ep_a2a_s", []).append(ep_a2a)
            detail.setdefault("layer_attention_s", []).append((attn_f, attn_b))
            detail.setdefault("layer_attn_frac_f", []).append(frac_f)
            detail.setdefault("layer_attn_frac_b", []).append(frac_b)
        tp_x = _tp_exposed(tp_ar, beside, p.tp)
        comm_f = tp_x + cp_ag + 2 * ep_a2a
        comm_b = tp_x + 2 * cp_ag + 2 * ep_a2a
        recompute = {"none": 0.0, "selective": attn_f, "full": blk_f + comm_f}[
            t.activation_recompute]
        if detail is not None:
            layer_b = floor(blk_b + comm_b + recompute, host_b)
            layer_r = blk_f if t.activation_recompute == "full" and not include_comm else 0.0
            detail.setdefault("layer_fwd_s", []).append(floor(blk_f + comm_f, host_f))
            detail.setdefault("layer_recompute_s", []).append(layer_r)
            detail.setdefault("layer_bwd_s", []).append(layer_b - layer_r)
        per_chunk = layers_per_chunk[s]
        chunk_layers.append(per_chunk)
        f_row, b_row, c_row = [], [], []
        for c, n in enumerate(per_chunk):
            vs = c * p.pp + s
            f = n * floor(blk_f + comm_f, host_f)
            bw = n * floor(blk_b + comm_b + recompute, host_b)
            embed_f = op_time(prof, flops=0, bytes_moved=2 * T * m.hidden_size * e)
            embed_b = op_time(prof, flops=0, bytes_moved=3 * T * m.hidden_size * e)
            logits_b = logit_b + (logit_f if t.activation_recompute == "full" else 0.0)
            if detail is not None:
                detail.update(embed_fwd_s=embed_f, embed_bwd_s=embed_b, logits_fwd_s=logit_f,
                              logits_bwd_s=logits_b)
            if vs == 0:
                f += embed_f
                bw += embed_b
            if vs == p.pp * p.vpp - 1:
                f += logit_f
                bw += logits_b
            f_row.append(f)
            b_row.append(bw)
            c_row.append(n * (comm_f + comm_b + (comm_f if t.activation_recompute == "full"
                                                 else 0.0)))
        fwd_s.append(f_row)
        bwd_s.append(b_row)
        tpc_s.append(c_row)

    return fwd_s, bwd_s, tpc_s, chunk_layers


def offload_plan_for(spec: LLMSpec, p: ParallelSpec, topo: Topology, prof: ComputeProfile,
                     comm_cache: dict | None = None) -> tuple[OffloadPlan, float]:
    """The swap :func:`build_step` would run for ``spec.training.offload`` on layout ``p``
    (the planner checks memory with it before simulating), and what it adds to one block's
    pass in seconds: the token-wise recompute and any swap-out longer than the block."""
    tr = spec.trainer
    detail: dict = {}
    sp = tr.sequence_parallel
    pass_times(spec, p, topo, Layout(p.tp, p.cp, p.dp, p.pp), prof, comm_cache, detail=detail,
               include_comm=False, sequence_parallel=sp)
    plan = _offload_plan(spec, p, topo, detail, sp, tr.attention)
    fwd, attn = detail["layer_fwd_s"][0], detail["layer_attention_s"][0][0]
    return plan, (1 - plan.alpha) * max(0.0, fwd - attn) + max(0.0, plan.swap_s - fwd)


def _offload_plan(spec: LLMSpec, p: ParallelSpec, topo: Topology, detail: dict,
                  sequence_parallel: bool, attention: str) -> OffloadPlan:
    """MEMO's swap for one block of this step (planner/model/llm/offload.py): its skeletal
    tensors, the host copy bandwidth and memory of the topology, ``alpha`` as given or MEMO's
    closed form from the block's forward time."""
    m, t = spec.model, spec.training
    terms = block_terms(m, seq=m.seq_len, batch=t.micro_batch_size, tp=p.tp, cp=p.cp,
                        sequence_parallel=sequence_parallel and p.tp > 1, attention=attention,
                        recompute="none", precision=t.precision)
    s_in, s_attn, s_oth = skeletal_split(terms)
    params = topo.params
    copy = host_copy_Bps(params, topo.comm.efficiency.get("pcie", 1.0))
    host = float(params.get("host_memory_bytes", 0.0)) / int(params.get("gpus_per_node", 1))
    if copy <= 0 or host <= 0:
        raise SpecError(f"topology {topo.name} states no host memory or PCIe bandwidth for "
                        "activation offload", source=topo.source, field="node.host_memory",
                        fix="set node.host_memory (bytes per node) and node.pcie_bandwidth")
    if t.offload.alpha is None:
        alpha, bound = alpha_closed_form(copy_Bps=copy, layer_s=detail["layer_fwd_s"][0],
                                         host_bytes=host, layers=m.layers, s_in=s_in,
                                         s_attn=s_attn, s_oth=s_oth)
    else:
        alpha, bound = t.offload.alpha, "given"
    return OffloadPlan(alpha=alpha, bound=bound, s_in=s_in, s_attn=s_attn, s_oth=s_oth,
                       copy_Bps=copy, host_bytes_per_gpu=host, layers=m.layers)


def _mb_times(fwd_s: list, bwd_s: list, detail: dict, chunk_layers: list,
              scales: list[tuple[float, float]] | None, recompute: str) -> list | None:
    """Per micro-batch ``(fwd_s, bwd_s)`` tables of :func:`build_step`'s ``mb_scales``."""
    if scales is None:
        return None
    out = []
    for lin, att in scales:
        fwd, bwd = [], []
        for s, (f_row, b_row) in enumerate(zip(fwd_s, bwd_s)):
            a_f, a_b = detail["layer_attention_s"][s]
            a_b += a_f if recompute in ("selective", "full") else 0.0
            n = chunk_layers[s]
            fwd.append([(f - k * a_f) * lin + k * a_f * att for f, k in zip(f_row, n)])
            bwd.append([(b - k * a_b) * lin + k * a_b * att for b, k in zip(b_row, n)])
        out.append((fwd, bwd))
    return out


def _stage_collectives(spec: LLMSpec, p: ParallelSpec, lay: Layout, rep: int,
                       coll) -> tuple[float, float, float]:
    """Seconds of one block's TP all-reduce, CP K/V all-gather and MoE all-to-all (each one
    call, one micro-batch) on the groups of stage representative ``rep``."""
    m, t = spec.model, spec.training
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    T = t.micro_batch_size * m.seq_len / p.cp
    kv = m.num_kv_heads * m.head_dim
    tp_ar = coll("allreduce", lay.group("tp", rep), T * m.hidden_size * e)
    cp_ag = coll("allgather", lay.group("cp", rep),
                 p.cp * 2 * T * kv * e / min(p.tp, m.num_kv_heads))
    # MoE: token dispatch and combine all-to-alls over the EP group (each rank sends its
    # top_k copies of its 1/tp token slice), forward and again in backward
    ep_a2a = coll("alltoall", lay.ep_group(rep, p.ep),
                  m.top_k * T * m.hidden_size * e / p.tp) if m.is_moe else 0.0
    return tp_ar, cp_ag, ep_a2a


def _tp_exposed(tp_ar: float, beside: list[float], tp: int) -> float:
    """Exposed TP communication of one block pass: two all-reduces of ``tp_ar`` seconds, or,
    overlapped (``beside``: the GEMMs' seconds), four halves each under its GEMM."""
    if not beside or tp_ar <= 0:
        return 2 * tp_ar
    half = tp_ar / 2
    return sum(max(half / tp, half - g) for g in beside) + half * (4 - len(beside))


def _p2p(w: Workload, p: ParallelSpec, reps: list[int], src_vs: int, dst_vs: int, nbytes: float,
         dep: int, name: str) -> int:
    a, b = reps[src_vs % p.pp], reps[dst_vs % p.pp]
    if a == b:
        return dep
    return w.sendrecv(a, b, nbytes, name=name, stream=f"p2p {a}->{b}", deps=[dep],
                      category="pp")
