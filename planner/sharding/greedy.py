"""Cost-driven LPT greedy with column splitting.

1. Tables that fit on no single device are cut into the fewest equal column parts (2, 4 or 8,
   widths multiples of 4) whose part fits, or go row-wise when column-wise cannot help.
2. Every table's *standalone cost* is the rise of the maximum per-rank cost (analytic model,
   communication included) when it alone is added to an empty plan. Tables costing more than the
   per-rank average of all tables are cut into the fewest parts that bring each part under it.
3. Units (whole tables and column parts), costliest first, each go to the rank that minimises the
   resulting maximum per-rank cost, then that rank's own cost, then the rank index; only ranks
   with memory room are candidates, and of those at most :data:`SHORTLIST`, the cheapest now. Parts of one table that land on one rank merge into one
   shard (no duplicated ids), so the cost of a unit depends on where its siblings are.
"""

from __future__ import annotations

import time

import numpy as np

from simulator.errors import SpecError

from planner.model.tables.cost import F_MEM, K
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import CW_PARTS, Catalog, catalog

__all__ = ["GreedyPlanner", "greedy_choices", "SHORTLIST"]

#: ranks scored per unit: with more ranks that have room, the ones with the lowest cost now
#: (scoring all is O(ranks²) per unit: 3.4 s for 300 tables on 256 ranks, 0.5 s with 32)
SHORTLIST = 32


def greedy_choices(cat: Catalog, *, split: bool = True, parts=CW_PARTS
                   ) -> tuple[list, list[str]]:
    """The greedy plan's choices (one per table) and notes."""
    n = cat.n
    cm = cat.cost
    T = cat.model.num_tables
    choices: list = [None] * T
    notes: list[str] = []
    capmax = float(cat.cap.max())
    forced_k: dict[int, int] = {}
    for t in range(T):
        if cat.tw(t)[F_MEM] <= capmax:
            continue
        ks = [k for k in cat.cw_parts(t, parts)
              if cat.cw(t, k)[0][F_MEM] + cat.cw(t, k)[1][F_MEM] <= capmax]
        if ks:
            forced_k[t] = ks[0]
            notes.append(f"{cat.model.tables[t].name}: {ks[0]} column parts (fits no single "
                         "device)")
        elif cat.can(t, ShardingType.ROW_WISE):
            choices[t] = ("rw",)
            notes.append(f"{cat.model.tables[t].name}: row-wise (fits no single device)")
    F = cat.features(choices)
    empty = float(cm.rank_costs(F).max())
    one = np.zeros((T, n, K))
    for t in range(T):
        one[t] = F
        one[t, 0] += cat.tw(t)
    standalone = cm.rank_costs(one).max(axis=1) - empty
    free = [t for t in range(T) if choices[t] is None]
    target = float(standalone[free].sum()) / n if free else 0.0
    units: list[tuple[float, int, int]] = []
    parts_of: dict[int, int] = {}
    for t in free:
        k = forced_k.get(t, 1)
        if split and k == 1 and standalone[t] > target > 0:
            ks = cat.cw_parts(t, parts)
            fitting = [q for q in ks if standalone[t] / q <= target]
            if fitting:
                k = fitting[0]
            elif ks:
                k = ks[-1]
        parts_of[t] = k
        for _ in range(k):
            units.append((float(standalone[t]) / k, t, k))
    units.sort(key=lambda u: (-u[0], u[1]))
    counts: dict[int, np.ndarray] = {}
    for _, t, k in units:
        if k == 1:
            delta = np.broadcast_to(cat.tw(t), (n, K))
        else:
            base, part = cat.cw(t, k)
            held = counts.setdefault(t, np.zeros(n, dtype=int)) > 0
            delta = part[None, :] + (~held)[:, None] * base[None, :]
        room = F[:, F_MEM] + delta[:, F_MEM] <= cat.cap
        cands = np.flatnonzero(room)
        if cands.size == 0:
            d = int(np.argmax(cat.cap - F[:, F_MEM]))
            notes.append(f"{cat.model.tables[t].name}: no rank has room; put on rank {d} "
                         "(over capacity)")
        else:
            if cands.size > SHORTLIST:
                now = cm.rank_costs(F)[cands]
                cands = np.sort(cands[np.lexsort((cands, now))[:SHORTLIST]])
            Fc = np.repeat(F[None], cands.size, axis=0)
            Fc[np.arange(cands.size), cands] += delta[cands]
            costs = cm.rank_costs(Fc)
            worst = costs.max(axis=1)
            own = costs[np.arange(cands.size), cands]
            order = np.lexsort((cands, own, worst))
            d = int(cands[order[0]])
        F = F.copy()
        F[d] += delta[d]
        if k == 1:
            choices[t] = ("tw", d)
        else:
            counts[t][d] += 1
    for t, c in counts.items():
        choices[t] = cat.normalise(("cw", parts_of[t], tuple(int(x) for x in c)))
    return choices, notes


class GreedyPlanner:
    """LPT on the analytic cost with column splitting (see the module docstring)."""

    name = "greedy"

    def __init__(self, *, split: bool = True, parts=CW_PARTS) -> None:
        self.split = split
        self.parts = tuple(parts)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                 ShardingType.ROW_WISE))
        no_tw = [problem.model.tables[i].name for i in range(problem.num_tables)
                 if not problem.allowed(i, ShardingType.TABLE_WISE)]
        if no_tw:
            raise SpecError(f"the greedy planner places tables table-wise (column-split when "
                            f"that helps), but {len(no_tw)} table(s) may not be table-wise "
                            f"({', '.join(no_tw[:4])}{', …' if len(no_tw) > 4 else ''})",
                            field="--sharding-types",
                            fix="allow table_wise, or use --planner local_search or mip, "
                                "which choose among any allowed types")
        cat = catalog(problem)
        choices, notes = greedy_choices(cat, split=self.split, parts=self.parts)
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
