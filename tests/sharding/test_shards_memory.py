"""Shard layouts (TorchRec's rules) and memory accounting."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import SpecError

from planner.model.tables.feasible import InfeasibleError, check_feasible
from planner.model.tables.memory import device_capacity_bytes, shard_memory_bytes, table_bytes
from planner.model.tables.shards import (
    ShardingType,
    column_widths,
    column_wise_counts,
    data_parallel,
    parse_sharding_types,
    row_blocks,
    row_wise,
    table_row_wise,
    table_wise,
    validate_sharding,
)
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare


def test_row_blocks_torchrec_examples():
    assert row_blocks(10, 4) == (3, 3, 3, 1)
    assert row_blocks(5, 4) == (2, 2, 1, 0)
    assert row_blocks(8, 4) == (2, 2, 2, 2)
    assert row_blocks(3, 8) == (1, 1, 1, 0, 0, 0, 0, 0)


@given(st.integers(1, 10**9), st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_row_blocks_property(rows, world):
    b = row_blocks(rows, world)
    block = math.ceil(rows / world)
    assert sum(b) == rows and len(b) == world
    full = [x for x in b if x == block]
    assert all(x <= block for x in b)
    # full blocks first, then at most one partial block, then empties
    k = len(full)
    assert all(x == 0 for x in b[k + 1:])
    ts = row_wise(0, "t", rows, 8, world)
    assert validate_sharding(ts, rows, 8, world) == []
    assert [s.row_offset for s in ts.shards] == [sum(b[:i]) for i in range(world)]


@given(st.integers(1, 128).map(lambda u: 4 * u), st.integers(1, 32))
@settings(max_examples=200, deadline=None)
def test_column_widths_multiples_of_4(dim, parts):
    if parts > dim // 4:
        with pytest.raises(ValueError):
            column_widths(dim, parts)
        return
    w = column_widths(dim, parts)
    assert sum(w) == dim and all(x % 4 == 0 and x > 0 for x in w)
    assert max(w) - min(w) <= 4


def test_column_wise_any_width_and_merge():
    assert column_widths(40, 3) == (16, 12, 12)      # not only halves
    ts = column_wise_counts(3, "t", 100, 64, 4, [1, 0, 3, 0])
    assert ts.sharding_type == ShardingType.COLUMN_WISE
    assert [(s.rank, s.col_offset, s.cols) for s in ts.shards] == [(0, 0, 16), (2, 16, 48)]
    assert ts.ranks == (0, 2) and validate_sharding(ts, 100, 64, 4) == []
    assert column_wise_counts(3, "t", 100, 64, 4, [0, 4]).sharding_type == ShardingType.TABLE_WISE
    with pytest.raises(ValueError):
        column_wise_counts(0, "t", 10, 20, 4, [1, 1, 1, 1])     # 5 is not a multiple of 4


def test_other_layouts_validate():
    assert validate_sharding(table_wise(0, "t", 10, 8, 1), 10, 8, 2) == []
    dp = data_parallel(0, "t", 10, 8, 3)
    assert validate_sharding(dp, 10, 8, 3) == [] and dp.ranks == (0, 1, 2)
    tw = table_row_wise(0, "t", 10, 8, 1, (4, 5, 6, 7))
    assert [s.rows for s in tw.shards] == [3, 3, 3, 1] and tw.ranks == (4, 5, 6, 7)
    bad = table_wise(0, "t", 10, 8, 5)
    assert validate_sharding(bad, 10, 8, 2)


def test_parse_sharding_types():
    assert parse_sharding_types("rw, tw") == (ShardingType.TABLE_WISE, ShardingType.ROW_WISE)
    with pytest.raises(SpecError):
        parse_sharding_types("zigzag")


def test_shard_memory():
    t = TableSpec(name="t", num_embeddings=1000, embedding_dim=64, precision="fp32")
    w = 1000 * 64 * 4
    assert shard_memory_bytes(t, 1000, 64, ShardingType.TABLE_WISE, "sgd") == w
    assert shard_memory_bytes(t, 1000, 64, ShardingType.TABLE_WISE, "adam") == 3 * w
    assert shard_memory_bytes(t, 1000, 64, ShardingType.TABLE_WISE, "adagrad") == 2 * w
    assert shard_memory_bytes(t, 1000, 64, ShardingType.TABLE_WISE, "rowwise_adagrad") == w + 4000
    assert shard_memory_bytes(t, 1000, 64, ShardingType.DATA_PARALLEL, "sgd") == 2 * w  # + grad
    h = TableSpec(name="h", num_embeddings=1000, embedding_dim=64, precision="fp16")
    assert shard_memory_bytes(h, 1000, 64, ShardingType.TABLE_WISE, "sgd") == w // 2
    assert table_bytes(t, "adam") == 3 * w


def test_capacity_and_per_rank_memory_of_plans():
    m = load_model_spec("criteo-dlrm")
    cap = device_capacity_bytes(80_000_000_000, m)
    assert cap == int(0.85 * 80e9) - 16 * m.dense.param_count([128] * 26)  # reserve + dense state
    from planner.sharding.planners import get_planner
    plan = get_planner("size").plan(ShardingTask(model=m), 8)
    assert sum(plan.memory_per_rank_bytes) == sum(t.weight_bytes for t in m.tables)
    # the small tables data-parallel, the others table-wise round robin
    from planner.model.tables.plan import PlannerStats, make_plan
    from planner.sharding.common import catalog
    problem = prepare(ShardingTask(model=m), 8)
    cat = catalog(problem)
    small = [t.num_embeddings < 10_000 for t in m.tables]
    dp = make_plan(problem, cat.layouts([("dp",) if sm else ("tw", i % 8)
                                         for i, sm in enumerate(small)]), "hand", PlannerStats())
    assert dp.valid and dp.type_counts()["data_parallel"] == sum(small) > 0
    # a data-parallel table is a full copy (and its gradient) on every rank
    dp_bytes = sum(2 * m.tables[ts.table].weight_bytes for ts in dp.shardings
                   if ts.sharding_type == ShardingType.DATA_PARALLEL)
    tw_bytes = [0] * 8
    for ts in dp.shardings:
        if ts.sharding_type == ShardingType.TABLE_WISE:
            tw_bytes[ts.shards[0].rank] += m.tables[ts.table].weight_bytes
    assert list(dp.memory_per_rank_bytes) == [dp_bytes + x for x in tw_bytes]


def test_infeasibility_report_names_tables_numbers_and_fix():
    tabs = (TableSpec(name="huge", num_embeddings=10_000_000, embedding_dim=128),
            TableSpec(name="ok", num_embeddings=100, embedding_dim=8))
    model = ModelSpec(name="m", tables=tabs, source="m.yaml")
    task = ShardingTask(model=model, memory_bytes=2 * 1024**3,
                        sharding_types=(ShardingType.TABLE_WISE,))
    with pytest.raises(InfeasibleError) as e:
        check_feasible(prepare(task, 4), (ShardingType.TABLE_WISE, ShardingType.ROW_WISE,
                                          ShardingType.COLUMN_WISE))
    err = e.value
    assert err.tables[0][1] == "huge" and err.field == "tables[0]" and err.source == "m.yaml"
    assert "10,000,000" in err.message and "4.77 GiB" in err.message and "2.00 GiB" in err.message
    assert "allow row-wise" in err.fix and "1.19 GiB per device" in err.fix
    # total too large although each table fits somewhere
    many = tuple(TableSpec(name=f"t{i}", num_embeddings=1_000_000, embedding_dim=128)
                 for i in range(10))
    task = ShardingTask(model=ModelSpec(name="m2", tables=many), memory_bytes=1024**3)
    with pytest.raises(InfeasibleError) as e:
        check_feasible(prepare(task, 4), tuple(ShardingType))
    assert "≥ 5 devices" in e.value.fix
