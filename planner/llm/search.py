"""Search TP/CP/PP/DP/vpp/micro-batch/FSDP layouts: prune with closed forms, simulate survivors.

1. **Enumerate** every layout whose product is the GPU count: TP dividing the GPUs per node and
   the heads, CP with ``seq % 2cp == 0``, PP dividing nothing in particular (uneven stages are
   allowed) but at most the layer count, vpp ∈ {1, 2, 4} where the interleaved schedule applies,
   micro-batch ∈ {1, 2, 4, 8}, FSDP level ∈ {none, zero1, zero3}, and for a mixture of experts
   the expert-parallel degree ep ∈ {1, 2, 4, …} dividing both the experts and dp.
2. **Prune** layouts that break a divisibility rule or do not fit in memory. When the spec
   asks for MEMO's token-wise activation swap (``training.offload``), every layout is tried
   with full recompute instead, and layouts of one pipeline stage also with the swap (when the
   topology states host memory): the plan says which it chose.
3. **Estimate** each survivor in closed form from its per-micro-batch pass times (the same
   kernel and collective models the simulator uses): ``(m + (pp − 1)/vpp) · W`` with ``W`` the
   busiest stage's forward + backward per micro-batch, plus its last gradient bucket's reduction
   and the optimizer.
4. **Simulate** the best ``simulate_top`` estimates with the discrete-event engine and rank them
   by simulated step time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from simulator.collectives import simulate_collective
from simulator.compute import load_compute_profile, op_time
from simulator.errors import SpecError
from simulator.topology import Topology

from planner.llm.metrics import LLMResult, simulate_llm
from planner.llm.placement import crossing_axes, stages_per_building
from planner.model.llm.layout import Layout
from planner.model.llm.memory import memory_per_gpu
from planner.model.llm.offload import OffloadSpec
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.progress import track
from planner.workloads.llm.passes import offload_plan_for, pass_times
from planner.workloads.llm.step import resolve_parallel

__all__ = ["Candidate", "search"]


@dataclass(frozen=True, slots=True)
class Candidate:
    parallel: ParallelSpec
    micro_batch_size: int
    estimate_s: float
    memory_bytes: float
    order: str = "tp-cp-dp-pp"
    offload: bool = False          # MEMO's token-wise swap instead of the spec's recompute

    @property
    def crossing_axis(self) -> str:
        """Outermost axis with degree > 1: the one that crosses buildings."""
        return _crossing(self.order, self.parallel)


def _crossing(order: str, p: ParallelSpec) -> str:
    for ax in reversed(order.split("-")):
        if getattr(p, ax) > 1:
            return ax
    return "none"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(spec: LLMSpec, num_gpus: int, gpus_per_node: int):
    m, t = spec.model, spec.training
    for tp in _divisors(gpus_per_node):
        if m.num_heads % tp or (tp > m.num_kv_heads and tp % m.num_kv_heads):
            continue
        for cp in (1, 2, 4, 8):
            if cp > 1 and m.seq_len % (2 * cp):
                continue
            if num_gpus % (tp * cp):
                continue
            for pp in _divisors(num_gpus // (tp * cp)):
                if pp > m.layers:
                    continue
                dp = num_gpus // (tp * cp * pp)
                for mbs in (1, 2, 4, 8):
                    if t.global_batch_size % (mbs * dp):
                        continue
                    micro = t.global_batch_size // (mbs * dp)
                    for vpp in ((1, 2, 4) if pp > 1 else (1,)):
                        if vpp > 1 and (micro % pp or m.layers < pp * vpp):
                            continue
                        for fsdp in ("none", "zero1", "zero3"):
                            if dp == 1 and fsdp != "none":
                                continue
                            for ep in _expert_degrees(m.num_experts, dp):
                                yield ParallelSpec(tp=tp, cp=cp, pp=pp, dp=dp, vpp=vpp, fsdp=fsdp,
                                                   ep=ep), mbs


def _expert_degrees(num_experts: int, dp: int) -> list[int]:
    """EP degrees worth trying: 1 for dense models, else powers of two dividing E and dp."""
    if num_experts <= 1:
        return [1]
    return [e for e in (1, 2, 4, 8, 16, 32, 64) if num_experts % e == 0 and dp % e == 0]


def search(spec: LLMSpec, topo: Topology, *, top: int = 5, simulate_top: int = 8,
           orders: tuple[str, ...] | None = None,
           allow: Callable[[ParallelSpec, int, str], bool] | None = None
           ) -> tuple[list[LLMResult], dict]:
    """Best layouts by simulated step time, and statistics of the search.

    ``allow(parallel, micro_batch_size, order)``: only layouts it accepts are searched (a
    user's constraints, or what the trainer the plan goes to can run); the others are counted
    in ``stats["excluded"]``.

    On a multi-building topology the placement order is searched too (ScaleAcross): PP
    outermost (``tp-cp-dp-pp``: pipeline stages split across buildings) or DP outermost
    (``tp-cp-pp-dp``: replicas per building, gradients reduced across); with more buildings
    than pipeline stages both cross ("mixed"). ``stats["scale_across"]`` reports every
    crossing axis, the pipeline stages held in each building, and the gain of the best layout
    over the baseline "DP across buildings, default 1F1B schedule" (the best simulated layout
    with DP outermost and vpp = 1).
    """
    buildings = int(topo.params.get("buildings", 1) or 1)
    if orders is None:
        orders = ("tp-cp-dp-pp", "tp-cp-pp-dp") if buildings > 1 else ("tp-cp-dp-pp",)
    t0 = time.perf_counter()
    stats = {"enumerated": 0, "invalid": 0, "excluded": 0, "out_of_memory": 0, "estimated": 0,
             "simulated": 0}
    swapping = spec.training.offload is not None
    if swapping:                       # each layout without the swap: MEMO's baseline
        spec = replace(spec, training=replace(spec.training, offload=None,
                                              activation_recompute="full"))
    cands = _estimated(spec, topo, orders, allow, stats, swapping=swapping)
    if not cands:
        raise SpecError(f"no layout of {spec.model.name} fits on {topo.num_gpus} × {topo.gpu.name}"
                        f" ({stats['out_of_memory']} out of memory, {stats['invalid']} invalid, "
                        f"{stats['excluded']} excluded by constraints)",
                        source=spec.source, field="training",
                        fix="add GPUs (--gpus), enable activation_recompute, or lower the batch")
    cands.sort(key=lambda c: (c.estimate_s, c.parallel.tp, c.parallel.pp, c.micro_batch_size,
                              c.parallel.fsdp, c.order))
    chosen = cands[:simulate_top]
    baseline = None
    if buildings > 1:
        base = [c for c in cands if c.crossing_axis == "dp" and c.parallel.vpp == 1]
        baseline = base[0] if base else None
        if baseline is not None and baseline not in chosen:
            chosen.append(baseline)
    sims: dict[Candidate, LLMResult] = {}
    for c in track(chosen, len(chosen), f"simulating {len(chosen)} layouts"):
        s = replace(spec, training=replace(spec.training, micro_batch_size=c.micro_batch_size))
        if c.offload:
            s = _with_offload(s)
        sims[c] = simulate_llm(s, c.parallel, topo, order=c.order,
                               schedule_name="interleaved" if c.parallel.vpp > 1 else "1f1b")
        stats["simulated"] += 1
    results = sorted(sims.values(), key=lambda r: r.step_time_s)
    if baseline is not None:
        stats["scale_across"] = _scale_across(results[0], baseline, sims[baseline], topo)
    stats["wall_s"] = time.perf_counter() - t0
    return results[:top], stats


def _estimated(spec: LLMSpec, topo: Topology, orders: tuple[str, ...], allow, stats: dict, *,
               swapping: bool) -> list[Candidate]:
    """Every layout and micro-batch that is valid, allowed and fits memory, in each allowed
    placement order, with its estimated step time (:func:`_estimate`); with ``swapping``
    also its MEMO swap candidate where one applies. ``stats`` counts what was left out why."""
    prof = load_compute_profile(topo.gpu)
    cache: dict = {}
    cands: list[Candidate] = []
    layouts = enumerate_layouts(spec, topo.num_gpus, topo.gpus_per_node)
    for par, mbs in track(layouts, None, f"plan {spec.model.name}: layouts enumerated"):
        stats["enumerated"] += 1
        if spec.training.documents is not None and mbs != 1:
            stats["invalid"] += 1          # a micro-batch is one packed sequence
            continue
        s = replace(spec, training=replace(spec.training, micro_batch_size=mbs))
        try:
            p = resolve_parallel(s, par, topo.num_gpus)
        except SpecError:
            stats["invalid"] += 1
            continue
        kept = [o for o in orders if allow is None or allow(p, mbs, o)]
        if not kept:
            stats["excluded"] += 1
            continue
        mem = memory_per_gpu(s.model, s.training, p, capacity_bytes=topo.gpu.hbm_bytes,
                             trainer=s.trainer,
                             schedule_name="interleaved" if p.vpp > 1 else "1f1b")
        swap = _offload_candidate(s, p, topo, prof, cache, kept[0]) \
            if swapping and _can_offload(s, p, topo) else None
        if swap is not None:
            cands.append(swap)
            stats["estimated"] += 1
            stats["offload_candidates"] = stats.get("offload_candidates", 0) + 1
        if not mem.fits:
            stats["out_of_memory"] += 1
            continue
        # with pp or dp of 1 both orders place ranks identically: keep one
        for order in (kept if p.pp > 1 and p.dp > 1 else kept[:1]):
            cands.append(Candidate(p, mbs, _estimate(s, p, topo, prof, cache, order),
                                   mem.total_bytes, order))
            stats["estimated"] += 1
    return cands


def _scale_across(best: LLMResult, baseline: Candidate, base_res: LLMResult,
                  topo: Topology) -> dict:
    """``stats["scale_across"]`` of :func:`search`: where the best layout crosses buildings
    and its gain over the baseline (DP across buildings, 1F1B)."""
    axes = crossing_axes(best.plan.layout, topo)
    return {
        "buildings": int(topo.params.get("buildings", 1) or 1),
        "crossing_axis": _crossing(best.plan.layout.order, best.parallel),
        "crossing_axes": axes,
        "placement": "mixed" if len(axes) > 1 else (f"{axes[0]} across" if axes else
                                                     "inside one building"),
        "stages_per_building": stages_per_building(best.plan.layout, topo),
        "step_time_s": best.step_time_s,
        "baseline": "DP across buildings, 1F1B, best such layout",
        "baseline_step_time_s": base_res.step_time_s,
        "baseline_parallel": {k: getattr(baseline.parallel, k)
                              for k in ("tp", "cp", "pp", "dp", "vpp", "fsdp", "ep")},
        "gain": base_res.step_time_s / best.step_time_s - 1,
    }


def _can_offload(spec: LLMSpec, p: ParallelSpec, topo: Topology) -> bool:
    """Whether MEMO's swap applies to layout ``p``: one pipeline stage, a dense model, no
    packed documents, and a topology that states host memory."""
    return (p.pp == 1 and not spec.model.is_moe and spec.training.documents is None
            and float(topo.params.get("host_memory_bytes", 0) or 0) > 0)


def _with_offload(spec: LLMSpec) -> LLMSpec:
    return replace(spec, training=replace(spec.training, activation_recompute="none",
                                          offload=OffloadSpec()))


def _offload_candidate(spec: LLMSpec, p: ParallelSpec, topo: Topology, prof, cache: dict,
                       order: str) -> Candidate | None:
    """Layout ``p`` with the swap (alpha from MEMO's closed form) if it fits then; its estimate
    is the step without recompute plus each block's token-wise recompute and swap stall."""
    s = _with_offload(spec)
    plan, extra = offload_plan_for(s, p, topo, prof, cache)
    mem = memory_per_gpu(s.model, s.training, p, capacity_bytes=topo.gpu.hbm_bytes,
                         trainer=s.trainer, offload=plan)
    if not mem.fits or plan.host_bytes > plan.host_bytes_per_gpu:
        return None
    micro = s.training.global_batch_size // (s.training.micro_batch_size * p.dp)
    est = _estimate(s, p, topo, prof, cache, order) + micro * s.model.layers * extra
    return Candidate(p, spec.training.micro_batch_size, est, mem.total_bytes, order,
                     offload=True)


def _estimate(spec: LLMSpec, p: ParallelSpec, topo: Topology, prof, cache: dict,
              order: str) -> float:
    lay = Layout(p.tp, p.cp, p.dp, p.pp, order)
    fwd, bwd, _, chunks = pass_times(spec, p, topo, lay, prof, cache)
    w = max(sum(f) + sum(b) for f, b in zip(fwd, bwd))
    micro = spec.training.global_batch_size // (spec.training.micro_batch_size * p.dp)
    est = (micro + (p.pp - 1) / p.vpp) * w
    m = spec.model
    params = (max(sum(c) for c in chunks) * m.layer_params_per_rank(p.ep) / p.tp
              + m.embedding_params / p.tp)
    if p.dp * p.cp > 1:    # gradients are reduced over the dp·cp ranks of a TP position
        group = sorted(lay.rank(cp=j, dp=d) for j in range(p.cp) for d in range(p.dp))
        kind = "allreduce" if p.fsdp == "none" else "reducescatter"
        buckets = spec.trainer.dp_buckets
        size = spec.trainer.grad_bytes * params / max(1, min(buckets, max(sum(c) for c in chunks)))
        key = (kind, tuple(group), size)
        if key not in cache:
            cache[key] = simulate_collective(topo, kind, group, size).time_s
        est += cache[key]
    est += op_time(prof, flops=0,
                   bytes_moved=30 * params / (p.dp * p.cp if p.fsdp != "none" else 1))
    return est
