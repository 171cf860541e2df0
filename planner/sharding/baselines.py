"""NeuroShard's greedy baselines: size, dim, lookup and size-lookup greedy.

Tables are sorted by a key, largest first (ties: table order), and each goes table-wise to the
device with the smallest sum of that key among the devices that still have room (ties: lowest
rank) — LPT on a proxy of cost. Keys: ``size`` = rows·dim, ``dim``, ``lookup`` =
dim·pooling_factor, ``size_lookup`` = dim·pooling_factor·log10(rows). Unlike NeuroShard's code,
a table that fits nowhere is reported (the plan is marked invalid) instead of silently dropped on
the last device, and tables larger than any device go row-wise when allowed.
"""

from __future__ import annotations

import math
import time

import numpy as np

from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import catalog, place_table_wise, rowwise_prepass

__all__ = ["KeyGreedyPlanner", "KEYS"]

KEYS = {
    "size": lambda t: float(t.num_embeddings * t.embedding_dim),
    "dim": lambda t: float(t.embedding_dim),
    "lookup": lambda t: float(t.embedding_dim * t.pooling_factor),
    "size_lookup": lambda t: float(t.embedding_dim * t.pooling_factor
                                   * math.log10(max(t.num_embeddings, 1))),
}


class KeyGreedyPlanner:
    """Greedy by one of :data:`KEYS` (see the module docstring)."""

    def __init__(self, key: str = "size_lookup") -> None:
        if key not in KEYS:
            raise ValueError(f"key must be one of {', '.join(KEYS)}")
        self.key = key
        self.name = key

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.ROW_WISE))
        cat = catalog(problem)
        tables = problem.model.tables
        keys = np.array([KEYS[self.key](t) for t in tables])
        choices: list = [None] * len(tables)
        notes = rowwise_prepass(cat, choices)
        order = sorted(range(len(tables)), key=lambda i: (-keys[i], i))
        load = np.zeros(problem.devices)

        def pick(t: int, room: np.ndarray, mem: np.ndarray) -> int:
            d = int(room[np.argmin(load[room])])       # argmin keeps the lowest rank on ties
            load[d] += keys[t]
            return d

        notes += place_table_wise(cat, order, choices, pick)
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
