"""Random placement: each table table-wise on a uniformly drawn device that still has room.

NeuroShard's random baseline ignores memory; this one draws among the devices with room (and
reports an invalid plan when none has), so it is a fair lower anchor for "Valid x / N".
"""

from __future__ import annotations

import time

import numpy as np

from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import catalog, place_table_wise, rowwise_prepass

__all__ = ["RandomPlanner"]


class RandomPlanner:
    """Seeded random table-wise placement (tables in spec order)."""

    name = "random"

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.ROW_WISE))
        cat = catalog(problem)
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x52414E44]))
        choices: list = [None] * problem.num_tables
        notes = rowwise_prepass(cat, choices)
        notes += place_table_wise(cat, range(problem.num_tables), choices,
                                  lambda t, room, mem: int(room[rng.integers(room.size)]))
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
