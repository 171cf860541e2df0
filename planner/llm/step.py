"""One training step of a transformer as a simulator workload.

Representative ranks: all data-parallel replicas, tensor-parallel and context-parallel ranks of a
pipeline stage do the same work at the same time, so compute and pipeline sends are issued for
one representative per stage (``tp = cp = dp = 0``). Tensor- and context-parallel collectives
are blocking inside each block (Megatron), so their time, simulated once on the actual TP/CP
group, is part of the block's time. Data-parallel traffic is issued for real: every TP×CP
position of every stage reduces its gradient buckets over its whole DP group, overlapping the
last micro-batch's backward, so DP traffic of the whole cluster shares the fabric.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from simulator.collectives import simulate_collective
from simulator.compute import ComputeProfile, load_compute_profile, op_time
from simulator.errors import SpecError
from simulator.topology import Topology
from simulator.workload import Workload

from .kernels import block_kernels, bytes_per_element, kernels_time, logits_kernels
from .host import HostOverhead, load_host_overhead
from .layout import Layout
from .memory import stage_layers
from .schedule import schedule
from .spec import LLMSpec, ParallelSpec

__all__ = ["StepPlan", "build_step", "resolve_parallel", "pass_times"]


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
               dp_buckets: int = 4, attention: str = "flash",
               sequence_parallel: bool = True) -> StepPlan:
    """Build the workload of one step; ``p`` must be resolved (see :func:`resolve_parallel`)."""
    m, t = spec.model, spec.training
    prof = profile or load_compute_profile(topo.gpu)
    lay = Layout(p.tp, p.cp, p.dp, p.pp, order)
    b = t.micro_batch_size
    micro = t.global_batch_size // (b * p.dp)
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    e_w = 2 if t.precision == "fp8" else e
    T = b * m.seq_len / p.cp
    reps = [lay.rank(pp=s) for s in range(p.pp)]

    detail: dict = {}
    fwd_s, bwd_s, tpc_s, chunk_layers = pass_times(spec, p, topo, lay, prof, detail=detail,
                                                   attention=attention,
                                                   sequence_parallel=sequence_parallel)

    w = Workload(name=f"{m.name} step")
    # parameters held per rank in each (stage, chunk), for DP traffic and the optimizer
    def chunk_params(s: int, c: int) -> float:
        n = chunk_layers[s][c] * m.layer_params_per_rank(p.ep)
        vs = c * p.pp + s
        if vs == 0 or vs == p.pp * p.vpp - 1:
            n += m.embedding_params
        return n / p.tp

    zero3 = p.fsdp in ("zero3", "hsdp")
    dp_reduce = "allreduce" if p.fsdp == "none" else "reducescatter"
    grad_bytes = 4
    dp_groups = {}
    for s in range(p.pp):
        dp_groups[s] = [lay.group("dp", lay.rank(tp=i, cp=j, pp=s))
                        for i in range(p.tp) for j in range(p.cp)]

    def dp_collectives(kind: str, s: int, size: float, deps: list[int], name: str) -> list[int]:
        if p.dp == 1 or size <= 0:
            return []
        # nccl-tests sizes: the full per-rank buffer (gradients in, parameters out)
        return [w.collective(kind, g, size, name=name, stream="dp", deps=deps, category="dp")
                for g in dp_groups[s]]

    # FSDP (ZeRO-3): gather each chunk's weights before its first forward and first backward
    gathered: dict[tuple[int, int, str], list[int]] = {}
    if zero3:
        for s in range(p.pp):
            for c in range(p.vpp):
                gathered[(s, c, "F")] = dp_collectives("allgather", s, chunk_params(s, c) * e_w,
                                                       [], f"fsdp gather s{s}c{c}")
    items = {s: schedule(schedule_name, p.pp, micro, s, p.vpp) for s in range(p.pp)}
    pos = {s: 0 for s in range(p.pp)}
    done: dict[tuple[str, int, int], int] = {}     # (kind, vstage, mb) -> op id
    first_b: dict[tuple[int, int], bool] = {}
    last_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
    dp_ops: dict[int, list[int]] = {s: [] for s in range(p.pp)}
    act = T * m.hidden_size * e / p.tp              # scatter-gather: 1/tp of the activation
    nv = p.pp * p.vpp
    remaining = sum(len(v) for v in items.values())
    while remaining:
        progressed = False
        for s in range(p.pp):
            while pos[s] < len(items[s]):
                kind, mb, c = items[s][pos[s]]
                vs = c * p.pp + s
                deps: list[int] = []
                if kind == "F":
                    if vs > 0:
                        if ("F", vs - 1, mb) not in done:
                            break
                        deps.append(_p2p(w, p, reps, vs - 1, vs, act, done[("F", vs - 1, mb)],
                                         f"act mb{mb}"))
                    deps += gathered.get((s, c, "F"), [])
                    oid = w.compute(reps[s], f"F mb{mb} c{c}", duration_s=fwd_s[s][c],
                                    deps=deps, category="fwd")
                else:
                    if vs < nv - 1:
                        if ("B", vs + 1, mb) not in done:
                            break
                        deps.append(_p2p(w, p, reps, vs + 1, vs, act, done[("B", vs + 1, mb)],
                                         f"grad mb{mb}"))
                    deps.append(done[("F", vs, mb)])
                    if zero3 and not first_b.get((s, c)):
                        first_b[(s, c)] = True
                        deps += dp_collectives("allgather", s, chunk_params(s, c) * e_w, [],
                                               f"fsdp regather s{s}c{c}")
                    last_mb = mb == micro - 1
                    if last_mb and p.dp > 1:
                        # the last micro-batch's backward in buckets, each reduced as it lands
                        k = max(1, min(dp_buckets, chunk_layers[s][c]))
                        prev = None
                        for j in range(k):
                            oid = w.compute(reps[s], f"B mb{mb} c{c} bucket{j}",
                                            duration_s=bwd_s[s][c] / k,
                                            deps=deps if prev is None else [prev], category="bwd")
                            prev = oid
                            dp_ops[s] += dp_collectives(dp_reduce, s,
                                                        chunk_params(s, c) * grad_bytes / k,
                                                        [oid], f"grads s{s}c{c}b{j}")
                    else:
                        oid = w.compute(reps[s], f"B mb{mb} c{c}", duration_s=bwd_s[s][c],
                                        deps=deps, category="bwd")
                done[(kind, vs, mb)] = oid
                last_ops[s].append(oid)
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise SpecError("pipeline schedule cannot make progress", field="parallel",
                            fix="report this configuration as a bug")
    # optimizer step (and ZeRO-1/2 parameter all-gather) on each stage
    for s in range(p.pp):
        params = sum(chunk_params(s, c) for c in range(p.vpp))
        shard = p.dp if p.fsdp != "none" else 1
        opt = w.compute(reps[s], "optimizer", bytes_moved=30 * params / shard,
                        deps=dp_ops[s] + last_ops[s][-1:], category="optimizer")
        if p.fsdp in ("zero1", "zero2"):
            dp_collectives("allgather", s, params * e_w, [opt], f"param gather s{s}")
    return StepPlan(workload=w, layout=lay, parallel=p, microbatches=micro, fwd_s=fwd_s,
                    bwd_s=bwd_s, tp_comm_s=tpc_s, representatives=reps,
                    info={"chunk_layers": chunk_layers, **detail})


def pass_times(spec: LLMSpec, p: ParallelSpec, topo: Topology, lay: Layout,
               prof: ComputeProfile, comm_cache: dict | None = None, *,
               attention: str = "flash", sequence_parallel: bool = True,
               detail: dict | None = None, host: HostOverhead | None | str = "measured"):
    """Per (stage, chunk): forward and backward seconds of one micro-batch on the stage's
    representative (TP/CP collectives included, timed on their actual groups), the TP/CP part
    of it, and the blocks per chunk. ``comm_cache`` may be shared across calls.

    Each block pass takes at least the trainer's host time (``host``, planner/llm/host.py:
    eager PyTorch measured by ``clusterplan calibrate host``; ``None`` for a trainer without
    that floor, e.g. CUDA graphs). CPU devices run ops synchronously and get no floor."""
    m, t = spec.model, spec.training
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
    blk_f, blk_b = kernels_time(prof, blk), kernels_time(prof, blk, backward=True)
    attn = [k for k in blk if k.name.startswith("attention")]
    attn_f = kernels_time(prof, attn)
    logit = logits_kernels(m, b=b, tp=p.tp, cp=p.cp, precision=t.precision)
    logit_f, logit_b = kernels_time(prof, logit), kernels_time(prof, logit, backward=True)

    if isinstance(host, str):
        host = load_host_overhead() if topo.gpu.name != "cpu" else None
    host_f = host.forward_s if host else 0.0
    host_b = host.backward_pass_s(t.activation_recompute) if host else 0.0
    layers_per_stage = stage_layers(m.layers, p.pp)
    fwd_s, bwd_s, tpc_s = [], [], []
    chunk_layers = []
    for s in range(p.pp):
        tp_group = lay.group("tp", reps[s])
        cp_group = lay.group("cp", reps[s])
        tp_ar = coll("allreduce", tp_group, T * m.hidden_size * e)
        kv = m.num_kv_heads * m.head_dim
        cp_ag = coll("allgather", cp_group, p.cp * 2 * T * kv * e / min(p.tp, m.num_kv_heads))
        # MoE: token dispatch and combine all-to-alls over the EP group (each rank sends its
        # top_k copies of its 1/tp token slice), forward and again in backward
        ep_a2a = coll("alltoall", lay.ep_group(reps[s], p.ep),
                      m.top_k * T * m.hidden_size * e / p.tp) if m.is_moe else 0.0
        if detail is not None:   # EP all-to-all seconds per micro-batch and layer, per stage
            detail.setdefault("ep_a2a_s", []).append(ep_a2a)
        comm_f = 2 * tp_ar + cp_ag + 2 * ep_a2a
        comm_b = 2 * tp_ar + 2 * cp_ag + 2 * ep_a2a
        recompute = {"none": 0.0, "selective": attn_f, "full": blk_f + comm_f}[
            t.activation_recompute]
        base, extra = divmod(layers_per_stage[s], p.vpp)
        per_chunk = [base + (1 if c < extra else 0) for c in range(p.vpp)]
        chunk_layers.append(per_chunk)
        f_row, b_row, c_row = [], [], []
        for c, n in enumerate(per_chunk):
            vs = c * p.pp + s
            f = n * max(blk_f + comm_f, host_f)
            bw = n * max(blk_b + comm_b + recompute, host_b)
            if vs == 0:
                f += op_time(prof, flops=0, bytes_moved=2 * T * m.hidden_size * e)
                bw += op_time(prof, flops=0, bytes_moved=3 * T * m.hidden_size * e)
            if vs == p.pp * p.vpp - 1:
                f += logit_f
                bw += logit_b + (logit_f if t.activation_recompute == "full" else 0.0)
            f_row.append(f)
            b_row.append(bw)
            c_row.append(n * (comm_f + comm_b + (comm_f if t.activation_recompute == "full"
                                                 else 0.0)))
        fwd_s.append(f_row)
        bwd_s.append(b_row)
        tpc_s.append(c_row)

    return fwd_s, bwd_s, tpc_s, chunk_layers


def _p2p(w: Workload, p: ParallelSpec, reps: list[int], src_vs: int, dst_vs: int, nbytes: float,
         dep: int, name: str) -> int:
    a, b = reps[src_vs % p.pp], reps[dst_vs % p.pp]
    if a == b:
        return dep
    return w.sendrecv(a, b, nbytes, name=name, stream=f"p2p {a}->{b}", deps=[dep],
                      category="pp")
