"""The Tower Partitioner's MIP: features to towers by affinity within the balance caps, solved
by CBC on a node budget planned from the model's size, so the same inputs give the same towers
on any machine (:mod:`planner.dmt.partition` builds its inputs and falls back on its repair).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pulp

from planner.lp import variable
from planner.sharding.mip_cbc import run_cbc

__all__ = ["tower_mip", "node_budget"]


def tower_mip(s: np.ndarray, w: np.ndarray, mem: np.ndarray, cap: float, mem_cap: float,
              start: np.ndarray, *, time_limit_s: float, seed: int,
              width: np.ndarray | None = None, width_cap: float = math.inf
              ) -> tuple[np.ndarray | None, str]:
    """The tower of each feature maximising its affinity ``s[f, t]`` to its tower's cluster,
    with tower cost ``w`` ≤ ``cap``, memory ``mem`` ≤ ``mem_cap`` and pooled ``width`` ≤
    ``width_cap``, warm-started from ``start``: labels and how CBC stopped, or None and why
    (see :func:`_solve`)."""
    F, T = s.shape
    prob = pulp.LpProblem("towers", pulp.LpMinimize)       # MPS carries no sense: minimise −s
    x = {(f, t): variable(prob, f"x_{f}_{t}", cat="Binary") for f in range(F) for t in range(T)}
    scale = 1.0 / max(w.max(), 1e-30)
    prob += pulp.lpSum(-float(s[f, t]) * x[f, t] for f in range(F) for t in range(T))
    for f in range(F):
        prob += pulp.lpSum(x[f, t] for t in range(T)) == 1
    for t in range(T):
        prob += pulp.lpSum(x[f, t] for f in range(F)) >= 1
        prob += pulp.lpSum(float(w[f] * scale) * x[f, t] for f in range(F)) <= cap * scale
        if math.isfinite(mem_cap):
            prob += pulp.lpSum(float(mem[f] / mem_cap) * x[f, t] for f in range(F)) <= 1.0
        if width is not None and math.isfinite(width_cap):
            prob += pulp.lpSum(float(width[f]) * x[f, t] for f in range(F)) <= width_cap
    for (f, t), v in x.items():
        v.setInitialValue(1 if start[f] == t else 0)
    values, status = _solve(prob, time_limit_s=time_limit_s, seed=seed)
    if values is None:
        return None, status
    return np.array([max(range(T), key=lambda t: values.get(x[f, t].name, 0.0))
                     for f in range(F)]), status


#: CBC on this MIP, measured on a 2-core Xeon VM (busy) from 29 k to 154 k nonzeros: the root
#: node 47-55 µs per nonzero, a node 0.62-0.72 µs per nonzero; planned a little above both
ROOT_S_PER_NZ, NODE_S_PER_NZ = 6e-5, 1e-6
#: the node budget plans for this share of the time after the root: the rest is margin for a
#: slower or busier machine before the clock's safety stop fires
BUDGET_SHARE = 0.5
#: the clock stops CBC at this many times the planned limit (a machine that much slower)
SAFETY = 2.0


def node_budget(nonzeros: int, time_limit_s: float) -> int | None:
    """CBC nodes planned into ``time_limit_s`` (seconds) for a model of ``nonzeros``; None when
    the root node alone would not fit. Planned, not enforced: the clock stops CBC only at
    ``SAFETY`` times the limit."""
    spare = time_limit_s - ROOT_S_PER_NZ * nonzeros
    return int(BUDGET_SHARE * spare / (NODE_S_PER_NZ * max(nonzeros, 1))) if spare > 0 else None


def _solve(prob: pulp.LpProblem, *, time_limit_s: float, seed: int) -> tuple[dict | None, str]:
    """CBC, serial, seeded, warm-started, stopped by a node budget: a function of the
    model's size and ``time_limit_s`` alone (:func:`node_budget`), so the same inputs give the
    same towers on any machine. The clock is only a safety stop; a run it stops is discarded
    (its incumbent would depend on the machine's speed and load)."""
    nonzeros = sum(len(c) for c in prob.constraints()) + len(prob.objective)
    nodes = node_budget(nonzeros, time_limit_s)
    if nodes is None:
        return None, f"not run: its root node would not finish in {time_limit_s:g} s"
    values, info = run_cbc(prob, start=True, seconds=SAFETY * time_limit_s, max_nodes=nodes,
                           hard_deadline=time.perf_counter() + SAFETY * time_limit_s + 1.0,
                           seed=seed)
    result = info.get("result", "").lower()
    if info.get("killed") or not ("optimal" in result or "node limit" in result):
        return None, "stopped by the clock (a slow or busy machine), not used"
    if values is None:
        return None, "no assignment within the caps"
    return values, "optimal" if "optimal" in result else f"node limit ({nodes} nodes), incumbent"
