"""Choose the rank order of one collective: candidates from the solvers, judged by the model.

For a ring all-reduce the candidates are the given order, the minimum-total ring (exact MIP up to
``exact_max_n`` ranks, 2-opt/Or-opt above) and the bottleneck ring; the model of
:mod:`.model` (with link sharing when the matrix has it) picks the fastest. Trees and all-to-alls
start from the same candidates and improve them by random pair swaps scored with their own model,
within a time budget. The given order is always a candidate, so the speedup is never below 1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from simulator.costmatrix import CostMatrix

from planner.reorder.bottleneck import bottleneck_ring
from planner.reorder.model import collective_time, ring_edge_cost
from planner.reorder.tsp_exact import mip_ring, ring_cost
from planner.reorder.tsp_local import heuristic_ring

__all__ = ["ReorderResult", "reorder", "best_ring", "swap_search"]


@dataclass(frozen=True)
class ReorderResult:
    """The chosen order (``order[k]`` = matrix rank that becomes rank k) and its model times."""

    collective: str
    nbytes: float
    order: tuple[int, ...]
    time_before_s: float
    time_after_s: float
    method: str
    candidates_s: dict[str, float] = field(default_factory=dict)
    solve_s: float = 0.0
    #: the pair-swap search ran out of time before its evaluation budget: the order then
    #: depends on the machine's speed and load (a larger --time-limit makes it repeatable)
    clock_stopped: bool = False

    @property
    def speedup(self) -> float:
        return self.time_before_s / self.time_after_s if self.time_after_s > 0 else 1.0

    def to_dict(self) -> dict:
        return {"collective": self.collective, "size_bytes": self.nbytes, "order": list(self.order),
                "time_before_s": self.time_before_s, "time_after_s": self.time_after_s,
                "speedup": self.speedup, "method": self.method,
                "candidates_time_s": dict(self.candidates_s), "solve_s": self.solve_s,
                "stopped_by_clock": self.clock_stopped}


def best_ring(cm: CostMatrix, nbytes: float, *, exact_max_n: int = 16,
              time_limit_s: float = 20.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Candidate rings: ``tsp`` (exact or heuristic minimum total) and ``bottleneck``."""
    n = cm.n
    c = ring_edge_cost(cm, nbytes)
    if n <= exact_max_n:
        ex = mip_ring(c, time_limit_s=time_limit_s)
        tsp = np.asarray(ex.order, dtype=np.int64)
        name = "tsp-mip"
        if not ex.optimal:          # time ran out: keep the better of it and the heuristic
            h = heuristic_ring(c, seed=seed, time_limit_s=time_limit_s, init=tsp)
            if ring_cost(c, h) < ex.cost:
                tsp, name = h, "tsp-2opt"
    else:
        tsp = heuristic_ring(c, seed=seed, time_limit_s=time_limit_s)
        name = "tsp-2opt"
    bott = bottleneck_ring(c, init=tsp, seed=seed, time_limit_s=time_limit_s)
    return {name: tsp, "bottleneck": bott}


#: pair swaps the search evaluates at most; it stops sooner after ``STALE_PER_PAIR`` × n²
#: evaluations in a row without a gain (a 64-rank plan still gained at 18,000 swaps)
MAX_SWAPS, STALE_PER_PAIR = 20_000, 2


def swap_search(cost: Callable[[np.ndarray], float], init: np.ndarray, *, time_limit_s: float,
                seed: int = 0, max_evals: int = MAX_SWAPS) -> tuple[np.ndarray, float, bool]:
    """Random pair swaps, kept when they lower ``cost``: ``(order, its cost, clock_stopped)``.

    The search stops on its evaluation budget, or after 2·n² swaps in a row without a gain:
    both functions of the inputs, so the same inputs give the same order. ``time_limit_s``
    (seconds) is a safety stop; ``clock_stopped`` says it fired (the order is then the
    machine's)."""
    rng = np.random.default_rng(seed)
    best = np.asarray(init, dtype=np.int64).copy()
    best_v = cost(best)
    n = len(best)
    deadline = time.perf_counter() + time_limit_s
    stale = 0
    for _ in range(max_evals if n > 2 else 0):
        if stale >= STALE_PER_PAIR * n * n:
            break
        if time.perf_counter() > deadline:
            return best, best_v, True
        i, j = rng.choice(n, size=2, replace=False)
        best[i], best[j] = best[j], best[i]
        v = cost(best)
        if v < best_v * (1 - 1e-12):
            best_v, stale = v, 0
        else:
            best[i], best[j] = best[j], best[i]
            stale += 1
    return best, best_v, False


def reorder(cm: CostMatrix, collective: str, nbytes: float, *, exact_max_n: int = 16,
            time_limit_s: float = 20.0, seed: int = 0,
            group_size: int | None = None) -> ReorderResult:
    """Best order found for ``collective`` (allreduce, tree, alltoall or hierarchical, the
    latter with ``group_size``) of ``nbytes`` per rank.

    For ``hierarchical`` the order also assigns VMs to groups (consecutive blocks): the ring
    candidates pack VMs that are close on the ring into the same group, and pair swaps refine.
    """
    t0 = time.perf_counter()
    ident = np.arange(cm.n)
    cands = {"given": ident} | best_ring(cm, nbytes, exact_max_n=exact_max_n,
                                         time_limit_s=time_limit_s, seed=seed)

    def cost(o) -> float:
        return collective_time(cm, collective, o, nbytes, group_size=group_size)

    times = {k: cost(o) for k, o in cands.items()}
    clock = False
    if collective != "allreduce":
        start = min(times, key=times.get)
        left = max(0.2, time_limit_s - (time.perf_counter() - t0))
        cands["swaps"], times["swaps"], clock = swap_search(cost, cands[start],
                                                            time_limit_s=left, seed=seed)
    method = min(times, key=times.get)
    return ReorderResult(collective, float(nbytes), tuple(int(x) for x in cands[method]),
                         times["given"], times[method], method, times,
                         time.perf_counter() - t0, clock)
