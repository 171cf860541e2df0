"""TorchRec's EmbeddingShardingPlanner as the ``torchrec`` planner: run, converted, costed."""

from __future__ import annotations

import builtins
import json

import pytest

from simulator.errors import SpecError

from planner.measure.tables.plans import cpu_topology_ref
from planner.model.tables.shards import ShardingType, validate_sharding
from planner.model.tables.task import prepare
from planner.sharding.planners import PLANNER_NAMES, get_planner


def _planner_cls():
    from planner.sharding.torchrec_planner import TorchRecPlanner
    return TorchRecPlanner


@pytest.fixture(scope="module")
def torchrec():
    return pytest.importorskip("torchrec")


def _check_plan(plan, task, devices, allowed):
    problem = prepare(task, devices)
    assert plan.planner == "torchrec" and plan.valid, plan.problems
    assert sorted(ts.table for ts in plan.shardings) == list(range(task.model.num_tables))
    for ts in plan.shardings:
        t = task.model.tables[ts.table]
        assert validate_sharding(ts, t.num_embeddings, t.embedding_dim, devices) == []
        assert ts.sharding_type in allowed
    assert plan.max_cost_s > 0
    assert all(m <= c for m, c in zip(plan.memory_per_rank_bytes, problem.capacity_bytes))


def test_cpu_plan_is_valid_covers_all_tables_and_is_deterministic(torchrec, make_task):
    task = make_task(14, seed=2, devices=4)
    task = type(task)(model=task.model, topology=cpu_topology_ref(4),
                      memory_bytes=task.memory_bytes)
    plan = get_planner("torchrec").plan(task, 4, seed=0)
    _check_plan(plan, task, 4, {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                ShardingType.DATA_PARALLEL})
    assert any("cpu planner" in n for n in plan.stats.notes)
    assert any("TorchRec's own estimate" in n for n in plan.stats.notes)
    again = get_planner("torchrec").plan(task, 4, seed=0)
    assert again.to_json(stable=True) == plan.to_json(stable=True)


def test_memory_cap_is_respected_and_column_splits_convert(torchrec):
    """A table larger than one device makes TorchRec split it column-wise; the shards come back
    as ours and the plan fits the cap."""
    from planner.model.tables.spec import ModelSpec, TableSpec
    from planner.model.tables.task import ShardingTask
    tables = (TableSpec(name="big", num_embeddings=200_000, embedding_dim=64, pooling_factor=4),
              TableSpec(name="a", num_embeddings=20_000, embedding_dim=64, pooling_factor=2),
              TableSpec(name="b", num_embeddings=20_000, embedding_dim=64, pooling_factor=2))
    model = ModelSpec(name="split", tables=tables, batch_size=2048, source="test")
    cap = int(0.75 * tables[0].weight_bytes)              # "big" fits on no single device
    task = ShardingTask(model=model, topology=cpu_topology_ref(2), memory_bytes=cap,
                        sharding_types=(ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE))
    plan = _planner_cls()(min_partition=16).plan(task, 2)
    _check_plan(plan, task, 2, {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE})
    big = plan.shardings[0]
    assert big.sharding_type == ShardingType.COLUMN_WISE and len(set(big.ranks)) == 2
    assert sum(s.cols for s in big.shards) == 64


def test_gpu_target_plans_with_cuda_topology(torchrec, make_task):
    task = make_task(10, seed=4, devices=8)
    plan = get_planner("torchrec").plan(task, 8)
    _check_plan(plan, task, 8, set(ShardingType))
    assert any("cuda planner" in n for n in plan.stats.notes)


def test_conversion_of_each_sharding_type(torchrec, make_task):
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.types import ParameterSharding

    from planner.sharding.torchrec_planner import from_torchrec_plan
    task = make_task(4, seed=1, dims=(32,), devices=2)
    problem = prepare(task, 2)
    t = task.model.tables

    def spec(items):
        return EnumerableShardingSpec([ShardMetadata(shard_offsets=o, shard_sizes=s,
                                                     placement=f"rank:{r}/cpu")
                                       for o, s, r in items])
    rows = [x.num_embeddings for x in t]
    half = -(-rows[2] // 2)
    mp = {t[0].name: ParameterSharding(sharding_type="table_wise", compute_kernel="fused",
                                       ranks=[1], sharding_spec=spec([([0, 0], [rows[0], 32], 1)])),
          t[1].name: ParameterSharding(sharding_type="column_wise", compute_kernel="fused",
                                       ranks=[0, 1], sharding_spec=spec(
                                           [([0, 0], [rows[1], 16], 0),
                                            ([0, 16], [rows[1], 16], 1)])),
          t[2].name: ParameterSharding(sharding_type="row_wise", compute_kernel="fused",
                                       ranks=[0, 1], sharding_spec=spec(
                                           [([0, 0], [half, 32], 0),
                                            ([half, 0], [rows[2] - half, 32], 1)])),
          t[3].name: ParameterSharding(sharding_type="data_parallel", compute_kernel="dense",
                                       ranks=[0, 1], sharding_spec=None)}
    out, notes = from_torchrec_plan(problem, mp)
    by = {ts.table: ts for ts in out}
    assert by[0].sharding_type == ShardingType.TABLE_WISE and by[0].ranks == (1,)
    assert by[1].sharding_type == ShardingType.COLUMN_WISE and by[1].ranks == (0, 1)
    assert by[2].sharding_type == ShardingType.ROW_WISE
    assert by[3].sharding_type == ShardingType.DATA_PARALLEL and by[3].ranks == (0, 1)
    for ts in out:
        x = t[ts.table]
        assert validate_sharding(ts, x.num_embeddings, x.embedding_dim, 2) == []
    assert "data_parallel/dense" in notes[-1]


def test_cli_planner_torchrec(torchrec, tmp_path, capsys, make_task):
    from planner.cli.main import main
    assert "torchrec" in PLANNER_NAMES
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   + "".join(f"t{i},{2000 * (i + 1)},{[8, 16, 32][i % 3]},{1 + i % 5}\n"
                             for i in range(8)))
    code = main(["plan", str(csv), "--devices", "2", "--planner", "torchrec", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["planner"] == "torchrec" and doc["valid"]
    assert len(doc["shards"]) == 8
    assert doc["planner_stats"]["solver"] == "torchrec"


def test_cpu_sharder_cannot_take_row_wise_only_tables(torchrec, make_task):
    task = make_task(3, seed=0, devices=2, types=(ShardingType.ROW_WISE,))
    task = type(task)(model=task.model, topology=cpu_topology_ref(2),
                      sharding_types=task.sharding_types)
    with pytest.raises(SpecError, match="does not offer"):
        get_planner("torchrec").plan(task, 2)


def test_missing_torchrec_says_how_to_install(monkeypatch, tmp_path, capsys, make_task):
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "torchrec" or name.startswith("torchrec."):
            raise ImportError("No module named 'torchrec'", name="torchrec")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    task = make_task(3, seed=0, devices=2)
    with pytest.raises(SpecError, match="make setup-torchrec"):
        get_planner("torchrec").plan(task, 2)
    from planner.cli.main import main
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\na,100,8,1\nb,200,8,2\n")
    assert main(["plan", str(csv), "--devices", "2", "--planner", "torchrec"]) == 2
    assert "make setup-torchrec" in capsys.readouterr().err


def test_data_parallel_tables_raise_no_torchrec_notice(torchrec, caplog):
    """TorchRec logs "Sharding spec not found" on the root logger for every data-parallel
    table of its own plan (they have none, by design); the planner keeps that off the user's
    screen and leaves the root logger as it found it."""
    import logging

    from planner.model.tables.spec import ModelSpec, TableSpec
    from planner.model.tables.task import ShardingTask
    tables = tuple(TableSpec(name=f"t{i}", num_embeddings=n, embedding_dim=4, pooling_factor=40)
                   for i, n in enumerate((2000, 3000, 50_000)))
    task = ShardingTask(model=ModelSpec(name="dp", tables=tables, batch_size=4096, source="t"),
                        topology=cpu_topology_ref(4), memory_bytes=2 ** 28)
    with caplog.at_level(logging.WARNING):
        plan = get_planner("torchrec").plan(task, 4)
    assert plan.type_counts().get("data_parallel", 0) > 0
    assert not [r for r in caplog.records if "Sharding spec not found" in r.getMessage()]
    assert not logging.getLogger().filters


def test_local_search_from_torchrec_plan_is_never_worse_by_our_cost(torchrec, make_task):
    """``local_search`` with ``start=torchrec`` refines TorchRec's plan: valid, within every
    memory cap, and its step cost under our model at most that of TorchRec's plan."""
    for seed, devices in ((3, 4), (5, 8)):
        task = make_task(24, seed=seed, devices=devices)
        task = type(task)(model=task.model, topology=cpu_topology_ref(devices),
                          memory_bytes=task.memory_bytes)
        theirs = get_planner("torchrec").plan(task, devices, seed=0)
        ours = get_planner("local_search", start="torchrec").plan(task, devices, seed=0)
        assert ours.valid and ours.planner == "local_search", ours.problems
        assert ours.step_cost_s <= theirs.step_cost_s * (1 + 1e-12)
        assert any(n.startswith("start torchrec: step cost") for n in ours.stats.notes)
        problem = prepare(task, devices)
        assert all(m <= c for m, c in zip(ours.memory_per_rank_bytes, problem.capacity_bytes))


def test_cli_local_search_start_setting(torchrec, tmp_path, capsys, tables_csv):
    from planner.cli.main import main
    csv = tables_csv()
    code = main(["plan", str(csv), "--devices", "4", "--planner", "local_search",
                 "--planner-set", "start=torchrec", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["planner"] == "local_search" and doc["valid"]
    assert any("start torchrec" in n for n in doc["planner_stats"]["notes"])
    code = main(["plan", str(csv), "--devices", "4", "--planner", "local_search",
                 "--planner-set", "start=local_search"])
    err = capsys.readouterr().err
    assert code == 2 and "start" in err and "torchrec" in err and "Traceback" not in err


def test_local_search_start_names_a_planner():
    with pytest.raises(SpecError, match="cannot start from 'nope'") as exc:
        get_planner("local_search", start="nope")
    assert exc.value.field == "start"
