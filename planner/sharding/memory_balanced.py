"""``memory_balanced``: the table placement of NVIDIA's ``distributed-embeddings`` (TensorFlow 2),
the default of NVIDIA DeepLearningExamples' TF2 DLRM and DCNv2 (``--dist_strategy``).

Its rule, read from the library's ``DistEmbeddingStrategy`` (the cost of a plan plays no part):

1. **Column slices.** A table of more than ``column_slice_threshold`` elements (rows × dim) is
   cut into ``min(n, world, dim)`` column slices, ``n`` the smallest power of two that brings
   each slice under the threshold (DLE's default threshold is 10¹⁰ elements, so Criteo's 40M ×
   128 tables stay whole).
2. **Snake order.** The slices are sorted by elements, largest first, and dealt in a snake over
   the ranks: rank ``i`` takes positions ``i, i + 2W, ...`` and ``2W - 1 - i, 4W - 1 - i, ...``
   (``W`` ranks), so every rank gets the same count and sizes alternate big-small.
3. Slices of one table that land on one rank merge into one wider block.

Ties in size keep the tables' order (the library sorts (size, table) pairs in reverse, so equal
sizes go highest table index first; we follow it). A slice width that is not a multiple of 4
(TorchRec's column rule, kept by every plan here) is refused with the fix. No memory check
steers it: a rank over its memory gets an invalid plan, as the library would run out of memory.
"""

from __future__ import annotations

import time

from simulator.errors import SpecError

from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import TableSharding, column_wise, table_wise
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["MemoryBalancedPlanner", "column_slices", "snake_ranks", "DLE_COLUMN_SLICE_THRESHOLD"]

#: DeepLearningExamples TF2 DLRM's ``--column_slice_threshold`` default (elements)
DLE_COLUMN_SLICE_THRESHOLD = 10 * 1000 * 1000 * 1000


def column_slices(rows: int, dim: int, threshold: float, world: int) -> tuple[int, ...]:
    """Widths of a table's column slices under ``threshold`` elements (one: uncut).

    >>> column_slices(40_000_000, 128, 1e10, 8)
    (128,)
    >>> column_slices(40_000_000, 128, 1e9, 8)          # 5.12e9 elements: 8 slices of 6.4e8
    (16, 16, 16, 16, 16, 16, 16, 16)
    >>> column_slices(40_000_000, 128, 1e9, 4)          # no more slices than ranks
    (32, 32, 32, 32)
    """
    size, n = float(rows) * dim, 1
    while size > threshold:
        n *= 2
        size /= 2
    n = min(n, world, dim)
    base, extra = divmod(dim, n)
    return tuple(base + (1 if i < extra else 0) for i in range(n))


def snake_ranks(sizes: list[float], world: int) -> list[int]:
    """The rank of each item (sizes in any order) under the snake deal of rule 2.

    >>> snake_ranks([8, 7, 6, 5, 4, 3, 2, 1], 2)        # ranks 0 and 1 take 8+5+4+1, 7+6+3+2
    [0, 1, 1, 0, 0, 1, 1, 0]
    """
    order = [i for _, i in sorted(zip(sizes, range(len(sizes))), reverse=True)]
    out = [0] * len(sizes)
    for pos, item in enumerate(order):
        k = pos % (2 * world)
        out[item] = k if k < world else 2 * world - 1 - k
    return out


class MemoryBalancedPlanner:
    """``distributed-embeddings``' ``memory_balanced`` strategy (see the module docstring)."""

    name = "memory_balanced"

    def __init__(self, column_slice_threshold: float = DLE_COLUMN_SLICE_THRESHOLD) -> None:
        if column_slice_threshold <= 0:
            raise ValueError("column_slice_threshold must be positive (elements)")
        self.threshold = float(column_slice_threshold)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        tables = problem.model.tables
        slices = [(t, w) for t, tab in enumerate(tables)
                  for w in column_slices(tab.num_embeddings, tab.embedding_dim, self.threshold,
                                         devices)]
        ranks = snake_ranks([float(tables[t].num_embeddings) * w for t, w in slices], devices)
        source = problem.model.source or None
        layouts = [self._layout(t, tab, [(r, w) for (u, w), r in zip(slices, ranks) if u == t],
                                source)
                   for t, tab in enumerate(tables)]
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s,
                             notes=(f"column_slice_threshold {self.threshold:.3g} elements",))
        return make_plan(problem, tuple(layouts), self.name, stats)

    @staticmethod
    def _layout(t: int, tab, parts: list[tuple[int, int]], source: str | None) -> TableSharding:
        """Table ``t``'s slices ``(rank, width)`` in column order, merged per rank."""
        rows, dim = tab.num_embeddings, tab.embedding_dim
        if len({r for r, _ in parts}) == 1:
            return table_wise(t, tab.name, rows, dim, parts[0][0])
        merged: dict[int, int] = {}
        for r, w in parts:
            merged[r] = merged.get(r, 0) + w
        if any(w % 4 for w in merged.values()):
            raise SpecError(f"table {tab.name!r}: memory_balanced slices of widths "
                            f"{sorted(merged.values())} are not multiples of 4, which a "
                            "column-wise shard needs", source=source,
                            field=f"tables.{tab.name}.embedding_dim",
                            fix="raise --column-slice-threshold so the table stays whole, or "
                                "use a dim that divides into multiples of 4")
        ranks = list(merged)
        return column_wise(t, tab.name, rows, dim, ranks, [merged[r] for r in ranks],
                           parts=len(parts))

