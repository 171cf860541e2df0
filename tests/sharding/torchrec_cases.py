"""The tables and hand-made sharding plans the TorchRec export tests share: every sharding
type (and a mix) on 2 or 4 ranks, uneven column widths, and a row-wise layout that leaves a
rank an empty shard. ``test_torchrec_plan.py`` exports them; ``test_torchrec_dmp.py`` runs them
under DistributedModelParallel and ``tests/validate/test_dlrm_structure.py`` validates them
(both load this file by path: the DMP launcher runs as a script, and the other folder's tests
do not have this one on their path).
"""

from __future__ import annotations

from planner.model.tables import shards as sh
from planner.model.tables.plan import PlannerStats, make_plan
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask, prepare

TABLES = (("t0", 40, 16), ("t1", 37, 32), ("t2", 7, 8), ("t3", 23, 12), ("t4", 64, 20))
#: row-wise on 4 ranks leaves e0's last shard empty (5 rows → 2, 2, 1, 0)
EMPTY_SHARD_TABLES = (("e0", 5, 8), ("e1", 23, 12))
TOPOLOGY = {2: "localhost-gloo:node.gpus=2", 4: "dgx-a100:nodes=2,node.gpus=2,node.nics=2"}
KINDS = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel", "mixed")


def _uneven_widths(dim: int, parts: int) -> tuple[int, ...]:
    """Column widths (multiples of 4) that are not all equal where the dim allows it."""
    w = list(sh.column_widths(dim, parts))
    if parts > 1 and w[-1] > 4:
        w[0], w[-1] = w[0] + 4, w[-1] - 4
    return tuple(w)


def layouts(kind: str, world: int, lws: int, tables=TABLES) -> list[sh.TableSharding]:
    out = []
    hosts = world // lws
    for i, (name, rows, dim) in enumerate(tables):
        k = kind if kind != "mixed" else KINDS[i]
        if k == "table_wise":
            out.append(sh.table_wise(i, name, rows, dim, (world - 1 - i) % world))
        elif k == "column_wise":
            parts = min(world, dim // 4)
            ranks = [(world - 1 - j + i) % world for j in range(parts)]
            out.append(sh.column_wise(i, name, rows, dim, ranks, _uneven_widths(dim, parts)))
        elif k == "row_wise":
            out.append(sh.row_wise(i, name, rows, dim, world))
        elif k == "table_row_wise":
            host = i % hosts
            out.append(sh.table_row_wise(i, name, rows, dim, host,
                                         range(host * lws, host * lws + lws)))
        else:
            out.append(sh.data_parallel(i, name, rows, dim, world))
    return out


def sharding_problem(world: int, tables=TABLES):
    """The prepared problem of ``tables`` on ``world`` ranks (its cost model prices plans)."""
    model = ModelSpec(name="trx-test", tables=tuple(
        TableSpec(name=n, num_embeddings=r, embedding_dim=d, pooling_factor=2.0)
        for n, r, d in tables), batch_size=8 * world, source="test")
    return prepare(ShardingTask(model=model, topology=TOPOLOGY[world]), world)


def sharding_plan(kind: str, world: int, tables=TABLES):
    """A clusterplan Plan for ``tables`` on ``world`` ranks, every table ``kind`` (``mixed``:
    table i gets the i-th type)."""
    problem = sharding_problem(world, tables)
    lws = len(problem.hosts[0])
    plan = make_plan(problem, layouts(kind, world, lws, tables), "hand", PlannerStats())
    assert plan.valid, plan.problems
    return plan
