"""How long one micro-batch's forward and backward passes take, per pipeline stage and chunk.

:func:`pass_times` folds a transformer block's kernels (:mod:`planner.model.llm.kernels`, at the
compute profile's efficiency), its tensor-, context- and expert-parallel collectives (simulated
once on their real groups), and the trainer's host time per block into seconds per pass, for
:func:`planner.workloads.llm.step.build_step` and for the planner's quick search, which scores
layouts without building a step. :func:`offload_plan_for` is MEMO's activation swap for the
same block (:mod:`planner.model.llm.offload`); :func:`mb_times` rescales the passes for packed
documents of unequal length.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.collectives import simulate_collective
from simulator.compute import ComputeProfile, op_time
from simulator.errors import SpecError
from simulator.topology import Topology

from planner.model.llm.activations import block_terms
from planner.model.llm.host import HostOverhead, host_overhead_for
from planner.model.llm.kernels import block_kernels, bytes_per_element, kernels_time, logits_kernels
from planner.model.llm.layout import Layout
from planner.model.llm.offload import (
    OffloadPlan,
    alpha_closed_form,
    host_copy_Bps,
    skeletal_split,
)
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.model.llm.stages import chunk_layer_counts

__all__ = ["pass_times", "offload_plan_for", "offload_plan", "mb_times"]


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
    ``None`` for a trainer without that floor, e.g. CUDA graphs). CPU devices run ops
    synchronously and get no floor, unless ``host_serial``: then the host time is *added* to the kernels' (a CPU thread dispatches
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
    comm_cache = {} if comm_cache is None else comm_cache

    def coll(kind: str, ranks: list[int], size: float) -> float:
        key = (kind, tuple(ranks), size)
        if key not in comm_cache:
            comm_cache[key] = simulate_collective(topo, kind, ranks, size).time_s \
                if len(ranks) > 1 and size > 0 else 0.0
        return comm_cache[key]

    kprof = replace(prof, launch_overhead_s=0.0) if host_serial and host else prof
    blk = _block_times(spec, p, prof, kprof, attention, sequence_parallel, tp_comm_overlap)
    if isinstance(host, str):
        host = host_overhead_for(topo.gpu.name) if topo.gpu.name != "cpu" else None
    host_f = host.forward_s if host else 0.0
    host_b = host.backward_pass_s(t.activation_recompute) if host else 0.0

    def floor(kernel_s: float, host_s: float) -> float:
        return kernel_s + host_s if host_serial else max(kernel_s, host_s)
    ends = _end_times(spec, p, prof, blk)
    layers_per_chunk = chunk_layer_counts(m.layers, p.pp, p.vpp, tr.trim_first_last_stage)
    reps = [lay.rank(pp=s) for s in range(p.pp)]
    fwd_s, bwd_s, tpc_s = [], [], []
    for s in range(p.pp):
        tp_ar, cp_ag, ep_a2a = _stage_collectives(spec, p, lay, reps[s], coll) \
            if include_comm else (0.0, 0.0, 0.0)
        tp_x = _tp_exposed(tp_ar, blk.beside, p.tp)
        comm_f = tp_x + cp_ag + 2 * ep_a2a
        comm_b = tp_x + 2 * cp_ag + 2 * ep_a2a
        recompute = {"none": 0.0, "selective": blk.attn_f, "full": blk.fwd_s + comm_f}[
            t.activation_recompute]
        layer_f = floor(blk.fwd_s + comm_f, host_f)
        layer_b = floor(blk.bwd_s + comm_b + recompute, host_b)
        if detail is not None:
            _stage_detail(detail, blk, ep_a2a, layer_f, layer_b,
                          t.activation_recompute == "full" and not include_comm)
            detail.update(ends)
        per_layer_comm = comm_f + comm_b + (comm_f if t.activation_recompute == "full" else 0.0)
        f_row, b_row = _chunk_passes(p, s, layers_per_chunk[s], layer_f, layer_b, ends)
        fwd_s.append(f_row)
        bwd_s.append(b_row)
        tpc_s.append([n * per_layer_comm for n in layers_per_chunk[s]])
    return fwd_s, bwd_s, tpc_s, [layers_per_chunk[s] for s in range(p.pp)]


@dataclass(frozen=True)
class _BlockTimes:
    """One block's kernel seconds for one micro-batch on one rank (no communication, no host
    floor): forward and backward (``fwd_s``, ``bwd_s``), its attention kernels alone
    (``attn_f``, ``attn_b``), the attention half's share of the block (QKV, attention, output
    projection: ``frac_f``, ``frac_b``), the logits' (``logit_f``, ``logit_b``), and the four
    GEMMs a TP collective hides under with ``tp_comm_overlap`` (``beside``; empty without)."""

    fwd_s: float
    bwd_s: float
    attn_f: float
    attn_b: float
    frac_f: float
    frac_b: float
    logit_f: float
    logit_b: float
    beside: tuple[float, ...]


def _block_times(spec: LLMSpec, p: ParallelSpec, prof: ComputeProfile, kprof: ComputeProfile,
                 attention: str, sequence_parallel: bool, tp_comm_overlap: bool) -> _BlockTimes:
    """The block's kernels (:func:`block_kernels`) timed on ``kprof`` (the attention and
    logits kernels on ``prof``: they keep their launch overhead)."""
    m, t = spec.model, spec.training
    blk = block_kernels(m, b=t.micro_batch_size, tp=p.tp, cp=p.cp, precision=t.precision,
                        attention=attention, sequence_parallel=sequence_parallel, ep=p.ep)
    blk_f, blk_b = kernels_time(kprof, blk), kernels_time(kprof, blk, backward=True)
    attn = [k for k in blk if k.name.startswith("attention")]
    half = [k for k in blk if k.name in ("qkv", "attn_out") or k.name.startswith("attention")]
    logit = logits_kernels(m, b=t.micro_batch_size, tp=p.tp, cp=p.cp, precision=t.precision)
    beside = tuple(kernels_time(kprof, [k]) for k in blk
                   if k.name in ("qkv", "attn_out", "mlp_up", "mlp_down")) \
        if tp_comm_overlap else ()
    return _BlockTimes(
        fwd_s=blk_f, bwd_s=blk_b, attn_f=kernels_time(prof, attn),
        attn_b=kernels_time(prof, attn, backward=True),
        frac_f=kernels_time(kprof, half) / blk_f if blk_f > 0 else 0.5,
        frac_b=kernels_time(kprof, half, backward=True) / blk_b if blk_b > 0 else 0.5,
        logit_f=kernels_time(prof, logit), logit_b=kernels_time(prof, logit, backward=True),
        beside=beside)


def _end_times(spec: LLMSpec, p: ParallelSpec, prof: ComputeProfile,
               blk: _BlockTimes) -> dict[str, float]:
    """Seconds of the embedding (first virtual stage) and the logits (last), forward and
    backward (the logits' recomputed forward too under full recompute)."""
    m, t = spec.model, spec.training
    e = bytes_per_element("bf16" if t.precision == "fp8" else t.precision)
    T = t.micro_batch_size * m.seq_len / p.cp
    return {"embed_fwd_s": op_time(prof, flops=0, bytes_moved=2 * T * m.hidden_size * e),
            "embed_bwd_s": op_time(prof, flops=0, bytes_moved=3 * T * m.hidden_size * e),
            "logits_fwd_s": blk.logit_f,
            "logits_bwd_s": blk.logit_b + (blk.logit_f if t.activation_recompute == "full"
                                           else 0.0)}


def _stage_detail(detail: dict, blk: _BlockTimes, ep_a2a: float, layer_f: float,
                  layer_b: float, recompute_apart: bool) -> None:
    """Append one stage's block times to ``detail`` (see :func:`pass_times`); with
    ``recompute_apart`` a full recompute's forward is listed apart from the backward."""
    layer_r = blk.fwd_s if recompute_apart else 0.0
    for key, value in (("ep_a2a_s", ep_a2a), ("layer_attention_s", (blk.attn_f, blk.attn_b)),
                       ("layer_attn_frac_f", blk.frac_f), ("layer_attn_frac_b", blk.frac_b),
                       ("layer_fwd_s", layer_f), ("layer_recompute_s", layer_r),
                       ("layer_bwd_s", layer_b - layer_r)):
        detail.setdefault(key, []).append(value)


def _chunk_passes(p: ParallelSpec, s: int, layers: list[int], layer_f: float, layer_b: float,
                  ends: dict[str, float]) -> tuple[list[float], list[float]]:
    """Forward and backward seconds of each chunk of stage ``s`` (``layers`` blocks each),
    the first virtual stage with the embedding, the last with the logits."""
    f_row, b_row = [], []
    for c, n in enumerate(layers):
        vs = c * p.pp + s
        f, bw = n * layer_f, n * layer_b
        if vs == 0:
            f += ends["embed_fwd_s"]
            bw += ends["embed_bwd_s"]
        if vs == p.pp * p.vpp - 1:
            f += ends["logits_fwd_s"]
            bw += ends["logits_bwd_s"]
        f_row.append(f)
        b_row.append(bw)
    return f_row, b_row


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
    plan = offload_plan(spec, p, topo, detail, sp, tr.attention)
    fwd, attn = detail["layer_fwd_s"][0], detail["layer_attention_s"][0][0]
    return plan, (1 - plan.alpha) * max(0.0, fwd - attn) + max(0.0, plan.swap_s - fwd)


def offload_plan(spec: LLMSpec, p: ParallelSpec, topo: Topology, detail: dict,
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


def mb_times(fwd_s: list, bwd_s: list, detail: dict, chunk_layers: list,
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
