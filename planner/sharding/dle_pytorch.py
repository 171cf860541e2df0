"""``dle_pytorch``: the table placement of NVIDIA DeepLearningExamples' PyTorch DLRM
(``dlrm/utils/distributed.py``, ``get_device_mapping``), which its hybrid-parallel training
always uses (the cost of a plan plays no part).

Its rule, read from that code:

1. **Rank 0 keeps the bottom MLP.** The trainer runs the bottom MLP on rank 0 alone over the
   global batch (trainer ``bottom_mlp: rank0``); on more than 4 ranks rank 0 holds no table,
   and the tables go to the other ``n − 1``; on 2–4 ranks every rank holds tables.
2. **Buckets of at most ``⌈T / k⌉`` tables** (``T`` tables, ``k`` ranks that hold them): the
   tables in order of rows, largest first (equal rows keep their order), each into the bucket
   whose rows sum least so far (the first such bucket), a bucket leaving the deal once full.
3. **Buckets to ranks** in the order they filled, then the unfilled ones in order of their
   rows, lightest first: the first bucket to the first rank that holds tables, and so on.

Every table stays whole (table-wise); rows, not bytes or lookups, are what is balanced. No
memory check steers it: a rank over its memory gets an invalid plan, as the trainer would run
out of memory.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import table_wise
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["DlePyTorchPlanner", "row_buckets", "dle_table_ranks"]

#: above this many ranks rank 0 holds the bottom MLP and no table
BOTTOM_ONLY_ABOVE = 4


def row_buckets(rows: Sequence[int], buckets: int) -> list[list[int]]:
    """Table indices per bucket under rules 2 and 3 (see the module docstring).

    >>> row_buckets([10, 9, 8, 7, 1], 2)      # buckets of at most 3; [0, 3, 4] fills first
    [[0, 3, 4], [1, 2]]
    >>> row_buckets([5, 5, 5], 4)             # more buckets than tables: one stays empty
    [[0], [1], [2], []]
    """
    cap = math.ceil(len(rows) / buckets)
    order = sorted(range(len(rows)), key=lambda i: -rows[i])     # stable: ties keep order
    open_: list[list[int]] = [[] for _ in range(buckets)]
    full: list[list[int]] = []
    for t in order:
        open_[0].append(t)
        if len(open_[0]) == cap:
            full.append(open_.pop(0))
        open_.sort(key=lambda b: sum(rows[i] for i in b))       # stable: ties keep order
    return full + open_


def dle_table_ranks(rows: Sequence[int], ranks: int) -> list[int]:
    """The rank of each table (rules 1–3).

    >>> dle_table_ranks([10, 9, 8, 7, 1], 2)
    [0, 1, 1, 0, 0]
    >>> dle_table_ranks([10, 9, 8, 7, 1, 1], 6)    # rank 0 keeps the bottom MLP alone
    [5, 4, 3, 2, 1, 1]
    """
    first = 1 if ranks > BOTTOM_ONLY_ABOVE else 0
    out = [0] * len(rows)
    for k, bucket in enumerate(row_buckets(rows, ranks - first)):
        for t in bucket:
            out[t] = first + k
    return out


class DlePyTorchPlanner:
    """DeepLearningExamples' PyTorch DLRM placement (see the module docstring)."""

    name = "dle_pytorch"

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        tables = problem.model.tables
        ranks = dle_table_ranks([t.num_embeddings for t in tables], devices)
        layouts = tuple(table_wise(i, t.name, t.num_embeddings, t.embedding_dim, r)
                        for i, (t, r) in enumerate(zip(tables, ranks)))
        holders = devices - 1 if devices > BOTTOM_ONLY_ABOVE else devices
        notes = [f"buckets of at most {math.ceil(len(tables) / holders)} tables, balanced by rows"]
        if devices > BOTTOM_ONLY_ABOVE:
            notes.append("rank 0 holds no table: DeepLearningExamples keeps it for the bottom "
                         "MLP (trainer bottom_mlp: rank0, as --trainer dle-pytorch sets)")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, layouts, self.name, stats)
