"""The exported tower layout run by TorchRec's ShardedEmbeddingTowerCollection (gloo, CPU):
4 processes as 2 hosts of 2, outputs equal to the local reference."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("torchrec")

from planner.dmt.partition import partition_layout  # noqa: E402
from planner.dmt.towers import shard_hosts  # noqa: E402
from planner.export.dmt import tower_sharding_plan  # noqa: E402
from planner.measure.dmt.torchrec import run_torchrec_towers  # noqa: E402
from planner.model.dmt.layout import HostPlan
from planner.model.tables.shards import row_wise  # noqa: E402
from planner.model.tables.spec import ModelSpec, TableSpec  # noqa: E402
from planner.model.tables.task import ShardingTask, prepare  # noqa: E402


def test_torchrec_tower_sharding_matches_reference():
    rows = (400, 60, 2000, 90, 700, 50)
    pool = (2.0, 1.0, 3.0, 1.0, 2.0, 1.5)
    tabs = tuple(TableSpec(name=f"t{i}", num_embeddings=r, embedding_dim=8, pooling_factor=p)
                 for i, (r, p) in enumerate(zip(rows, pool)))
    task = ShardingTask(model=ModelSpec(name="tiny", tables=tabs, batch_size=64),
                        topology="dgx-h100:nodes=2,node.gpus=2,node.nics=2")
    part = partition_layout(task, 4, towers=2)
    hps = shard_hosts(task, part.layout)
    # host 1's tables row-wise inside the host (TorchRec's table_row_wise), host 0's as the
    # planner chose (table-wise: one-shard table_column_wise)
    mixed = tuple(hp if hp.host == 0 else HostPlan(hp.host, hp.tables, SimpleNamespace(
        shardings=tuple(row_wise(i, tabs[t].name, tabs[t].num_embeddings, 8, 2)
                        for i, t in enumerate(hp.tables))), hp.task) for hp in hps)
    doc = tower_sharding_plan(task.model, part.layout, mixed, prepare(task, 4).hosts)
    kinds = {e["host"]: e["sharding_type"] for e in doc["tables"].values()}
    assert kinds == {0: "table_column_wise", 1: "table_row_wise"}
    tables = {t.name: (t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in tabs}
    out = run_torchrec_towers(doc, tables, world=4, per_host=2, batch=6, seed=1)
    for r, o in enumerate(out):
        assert o["out"].shape == (6, 48)
        np.testing.assert_allclose(o["out"], o["ref"], rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")
