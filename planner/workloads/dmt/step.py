"""One DLRM training step with SPTT towers simulated beside the flat step on the same topology
(:func:`simulate_sptt`, :func:`simulate_flat`; the SPTT op graph is
:mod:`planner.workloads.dmt.sptt`'s), with the busiest rank's seconds per category.
:func:`planner.dmt.compare.compare_flat_dmt` plans both and compares them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from simulator.engine import simulate
from simulator.result import SimResult
from simulator.workload import Workload

from planner.model.dmt.layout import HostPlan, TowerLayout
from planner.model.tables.task import Problem, ShardingTask, prepare
from planner.workloads.dlrm.step import CATEGORIES as FLAT_CATEGORIES
from planner.workloads.dlrm.step import StepSimulation, build_step_workload, simulate_step
from planner.workloads.dmt.sptt import build_sptt_workload

__all__ = ["DmtStep", "Comparison", "simulate_sptt", "cross_host_bytes", "simulate_flat",
           "with_a2a_algo", "CATEGORIES"]

CATEGORIES = ("a2a_cross", "a2a_intra", "emb_fwd", "emb_bwd", "tm_fwd", "tm_bwd", "mlp_fwd",
              "mlp_bwd", "rw_comm", "tm_allreduce", "dense_allreduce", "optimizer")


@dataclass
class DmtStep:
    """Result of :func:`simulate_sptt`: step time, per-category busiest-rank time, bytes."""

    step_time_s: float
    breakdown_s: dict
    bytes: dict
    result: SimResult = field(repr=False)


@dataclass
class Comparison:
    """A flat plan and an SPTT layout of one task, both simulated."""

    flat: StepSimulation
    dmt: DmtStep
    layout: TowerLayout
    host_plans: tuple
    flat_plan: object
    flat_cross_host_bytes: float

    @property
    def speedup(self) -> float:
        return self.flat.step_time_s / self.dmt.step_time_s

    def to_dict(self) -> dict:
        fb = dict(self.flat.breakdown_s)
        return {"flat_step_s": self.flat.step_time_s, "dmt_step_s": self.dmt.step_time_s,
                "speedup": self.speedup, "flat_breakdown_s": fb,
                "dmt_breakdown_s": dict(self.dmt.breakdown_s),
                "flat_cross_host_bytes": self.flat_cross_host_bytes,
                "dmt_bytes": dict(self.dmt.bytes)}


def cross_host_bytes(problem: Problem, mats: dict) -> float:
    """Bytes of the flat step's all-to-alls (ids, pooled forward and backward) that cross hosts."""
    host = problem.cost.host_of
    cross = host[:, None] != host[None, :]
    return float(sum((m * cross).sum() for m in mats.values()))


def with_a2a_algo(w: Workload, algo: str) -> Workload:
    """The workload with every all-to-all run by ``algo`` (``direct``: all pairs at once, one
    latency per collective, the default; ``pairwise``: ``p − 1`` rounds, one latency each, so
    an exchange over ``p`` ranks pays ``(p − 1)·α``, the per-peer cost of the volume model).
    """
    if algo in ("auto", "direct"):
        return w
    ops = [replace(op, algo=algo) if op.kind == "collective" and op.collective == "alltoall"
           else op for op in w.ops]
    return Workload(ops=ops, name=w.name)


def _breakdown(res: SimResult, categories) -> dict:
    per = res.per_device()
    out = {}
    for cat in categories:
        sel = per[per.category == cat]
        out[cat] = float(sel.groupby("rank").duration_s.sum().max()) if len(sel) else 0.0
    return out


def simulate_sptt(task: ShardingTask, devices: int, layout: TowerLayout,
                  host_plans: Sequence[HostPlan], *, mode: str = "explicit",
                  a2a_algo: str = "direct") -> DmtStep:
    """Simulate the SPTT step (see the module docstring)."""
    w, totals = build_sptt_workload(task, devices, layout, host_plans)
    problem = prepare(task, devices)
    res = simulate(problem.topology, with_a2a_algo(w, a2a_algo), mode=mode)
    totals["cross_host"] = (totals["ids_cross"] + totals["pooled_cross_fwd"]
                            + totals["pooled_cross_bwd"])
    return DmtStep(step_time_s=res.step_time_s, breakdown_s=_breakdown(res, CATEGORIES),
                   bytes=totals, result=res)


def simulate_flat(problem: Problem, shardings, *, mode: str = "explicit",
                  a2a_algo: str = "direct") -> StepSimulation:
    """The flat step (:func:`planner.workloads.dlrm.step.simulate_step`) with a choice of
    all-to-all algorithm (:func:`with_a2a_algo`)."""
    if a2a_algo in ("auto", "direct"):
        return simulate_step(problem, shardings, mode=mode)
    w, mats = build_step_workload(problem, shardings)
    res = simulate(problem.topology, with_a2a_algo(w, a2a_algo), mode=mode)
    return StepSimulation(step_time_s=res.step_time_s,
                          breakdown_s=_breakdown(res, FLAT_CATEGORIES),
                          a2a_bytes={k: float(v.sum()) for k, v in mats.items()}, result=res)
