"""HugeCTR's ``auto`` / ``hier_auto`` plan, its ``subset_row_wise`` and
``hierarchical_row_wise`` layouts in the cost model and the step, and ``export --to hugectr``."""

from __future__ import annotations

import doctest
import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

from simulator.errors import SpecError

from planner.cli.planner_choice import planner_settings
from planner.export.hugectr import export_hugectr_plan
from planner.measure.tables.plan_work import comm_ops, rank_work
from planner.model.tables.features import F_HRS, F_IDS, F_OUT, K
from planner.model.tables.ids import model_ids
from planner.model.tables.shards import (ShardingType, hierarchical_row_wise,
                                         parse_sharding_types, subset_row_wise, table_row_wise,
                                         table_wise, validate_sharding)
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.hugectr_auto import HugeCtrSettings, search
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import simulate_step

SRW = ShardingType.SUBSET_ROW_WISE
HRW = ShardingType.HIERARCHICAL_ROW_WISE


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=cwd)


@pytest.mark.parametrize("name", ["planner.sharding.hugectr_auto", "planner.export.hugectr",
                                  "planner.cli.planner_choice"])
def test_doctests(name):
    res = doctest.testmod(importlib.import_module(name))
    assert res.failed == 0 and res.attempted > 0


def test_search_splits_the_hot_table_as_worked_by_hand():
    # 2 buckets, hotness 10 / 2 / 2, one unit per shard held, memory no constraint.
    # whole: [10+1] [2+1+2+1] → 11; table 0 halved: [5+1+2+1] [5+1+2+1] → 9 (kept);
    # then table 1, then table 2 halved: 11 and 10; every table split (the first candidate): 10
    s = HugeCtrSettings(mem_comm_bw_ratio=4.0, mem_comm_work_ratio=4.0, memory_cap_gb=100.0)
    buckets, dp, cost = search([10.0, 2.0, 2.0], [1.0, 1.0, 1.0], 2, s)
    assert cost == pytest.approx(9.0)
    assert buckets == [[0, 1], [0, 2]] and dp == []


def test_a_table_that_fits_no_bucket_is_split_and_small_ones_replicated():
    s = HugeCtrSettings(mem_comm_bw_ratio=1.0, mem_comm_work_ratio=1.0, memory_cap_gb=10.0,
                        dp_threshold_gb=0.5)
    # table 0 (12 GB) fits no 10 GB bucket whole; halves of 6 GB do; table 2 (0.1 GB) is replicated
    buckets, dp, _ = search([1.0, 1.0, 1.0], [12.0, 3.0, 0.1], 4, s)
    assert dp == [2]
    assert sum(0 in b for b in buckets) >= 2 and all(2 not in b for b in buckets)
    assert all(12.0 / sum(0 in c for c in buckets) <= 9.9 for b in buckets if 0 in b)
    with pytest.raises(SpecError) as e:
        search([1.0], [100.0], 4, s)                      # 25 GB a bucket even split 4 ways
    assert e.value.field == "memory_cap_gb"


def test_settings_are_checked():
    with pytest.raises(SpecError) as e:
        HugeCtrSettings(mode="hier")
    assert e.value.field == "mode" and "hier_auto" in e.value.fix
    with pytest.raises(SpecError):
        HugeCtrSettings(mem_comm_bw_ratio=0.0)
    with pytest.raises(SpecError):
        HugeCtrSettings(dp_threshold_gb=-1.0)
    with pytest.raises(SpecError) as e:
        planner_settings(["mem_comm_bw_ratio=fast"], "hugectr_auto")
    assert e.value.field == "mem_comm_bw_ratio"
    with pytest.raises(SpecError) as e:
        planner_settings(["x=1"], "greedy")
    assert "takes no settings" in e.value.fix
    with pytest.raises(SpecError):
        planner_settings(["dp_threshold_gb=inf"], "hugectr_auto")


def test_subset_row_wise_layout_rules():
    ts = subset_row_wise(3, "t", 1001, 32, [6, 1, 4])
    assert [s.rank for s in ts.shards] == [1, 4, 6] and sum(s.rows for s in ts.shards) == 1001
    assert validate_sharding(ts, 1001, 32, 8) == []
    with pytest.raises(ValueError):
        subset_row_wise(0, "t", 10, 4, [1, 1])
    with pytest.raises(SpecError) as e:
        parse_sharding_types("table_wise,srw")
    assert "hugectr_auto" in e.value.fix


def test_hierarchical_row_wise_layout_rules():
    hosts = [tuple(range(8, 16)), tuple(range(8))]
    ts = hierarchical_row_wise(0, "t", 1601, 32, hosts)
    assert [s.rank for s in ts.shards] == list(range(16)) and sum(s.rows for s in ts.shards) == 1601
    assert validate_sharding(ts, 1601, 32, 16, hosts) == []
    part = hierarchical_row_wise(0, "t", 1601, 32, [range(4)])
    assert any("part of a host" in p for p in validate_sharding(part, 1601, 32, 16, hosts))
    with pytest.raises(SpecError) as e:
        parse_sharding_types("hrw")
    assert "hugectr_auto" in e.value.fix


def _model(batch=1024):
    tabs = (TableSpec(name="hot", num_embeddings=40_000, embedding_dim=64, pooling_factor=40.0),
            TableSpec(name="a", num_embeddings=10_000, embedding_dim=32, pooling_factor=4.0),
            TableSpec(name="b", num_embeddings=20_000, embedding_dim=64, pooling_factor=2.0))
    return ModelSpec(name="m", tables=tabs, batch_size=batch)


def test_cost_features_and_step_bytes_follow_the_partial_sum_exchange():
    """A table split over k ranks: each shard takes 1/k of the ids and sends a whole pooled
    partial sum per sample, so the pooled all-to-all moves (n-1)/n · B · dim · o per shard."""
    model = _model()
    n, k = 4, 2
    problem = prepare(ShardingTask(model=model, topology="dgx-a100:nodes=1"), n)
    layout = (subset_row_wise(0, "hot", 40_000, 64, [1, 3]), table_wise(1, "a", 10_000, 32, 0),
              table_wise(2, "b", 20_000, 64, 2))
    cm = problem.cost
    F = cm.plan_features(layout)
    o = cm.out_bytes
    assert F[1, F_OUT] == pytest.approx(64 * o) and F[3, F_OUT] == pytest.approx(64 * o)
    ids_share = F[1, F_IDS] - cm.config.length_bytes
    assert ids_share == pytest.approx(40.0 * cm.config.id_bytes / k)
    fwd_tw = cm.shard_features(0, table_wise(0, "hot", 40_000, 64, 0).shards[0],
                               ShardingType.TABLE_WISE)
    fwd_srw = cm.shard_features(0, layout[0].shards[0], SRW)
    assert fwd_srw[0] < fwd_tw[0]                        # half the ids gathered
    sim = simulate_step(problem, layout)
    B = model.batch_size
    want = (n - 1) / n * B * o * (64 + 64 + 32 + 64)     # shards: hot ×2, a, b
    assert sim.a2a_bytes["output_fwd"] == pytest.approx(want)
    assert sim.step_time_s > 0


def test_measured_work_splits_the_ids_and_sends_partial_sums():
    model = _model(batch=256)
    layout = (subset_row_wise(0, "hot", 40_000, 64, [0, 1]), table_wise(1, "a", 10_000, 32, 0),
              table_wise(2, "b", 20_000, 64, 1))
    ids = model_ids(model)
    work = rank_work(model, layout, ids, 2)
    hot = [w for r in work for w in r if w.name == "hot"]
    assert len(hot) == 2 and sum(len(w.indices) for w in hot) == len(ids[0].indices)
    ops = {name: m for kind, name, m in comm_ops(model, layout, ids, 2)}
    out = np.array(ops["output_a2a_fwd_s"])
    # rank 0 sends rank 1 its partial sums of "hot" and its "a" pooled rows for 128 samples
    assert out[0, 1] == pytest.approx(128 * (64 + 32) * 4)


def test_mlperf_plan_is_valid_splits_the_hot_table_and_exports(tmp_path):
    task = ShardingTask(model=load_model_spec("mlperf-dcnv2"), topology="dgx-h100")
    plan = get_planner("hugectr_auto", mem_comm_bw_ratio=9.0, dp_threshold_gb=0.008).plan(task, 8)
    assert plan.valid, plan.problems
    by_name = {ts.name: ts for ts in plan.shardings}
    assert by_name["cat_20"].sharding_type == SRW and len(by_name["cat_20"].shards) >= 4
    assert by_name["cat_5"].sharding_type == ShardingType.DATA_PARALLEL      # 3 rows
    out = export_hugectr_plan(plan.to_dict())
    for r, row in enumerate(out["shard_matrix"]):
        held = {str(ts.table) for ts in plan.shardings if r in ts.ranks}
        assert set(row) == held
    mp, dp = dict(out["shard_strategy"])["mp"], dict(out["shard_strategy"])["dp"]
    assert sorted(mp + dp, key=int) == [str(i) for i in range(26)]
    path = tmp_path / "plan.json"
    plan.write(path)
    r = _cli("export", str(path), "--to", "torchrec")
    assert r.returncode == 2 and "--to hugectr" in r.stderr and "Traceback" not in r.stderr
    r = _cli("export", str(path), "--to", "hugectr", "--out", str(tmp_path / "h.json"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "h.json").read_text()) == out


def test_simulate_takes_the_planner_and_its_settings():
    r = _cli("simulate", "mlperf-dcnv2", "--topology", "dgx-h100", "--gpus", "8", "--trainer",
             "hugectr", "--planner", "hugectr_auto", "--planner-set", "mem_comm_bw_ratio=9",
             "--planner-set", "dp_threshold_gb=0.008", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["planner"] == "hugectr_auto" and doc["step_time_s"] > 0
    bad = _cli("simulate", "mlperf-dcnv2", "--topology", "dgx-h100", "--gpus", "8",
               "--planner", "hugectr_auto", "--planner-set", "mode=hier_auto")
    assert bad.returncode == 2 and "mode=auto" in bad.stderr and "Traceback" not in bad.stderr


def test_hier_auto_keeps_a_nodes_tables_on_all_its_gpus():
    task = ShardingTask(model=load_model_spec("mlperf-dcnv2"), topology="dgx-h100:nodes=2")
    plan = get_planner("hugectr_auto", mode="hier_auto", mem_comm_bw_ratio=67.0,
                       dp_threshold_gb=0.0125).plan(task, 16)
    assert plan.valid, plan.problems
    for ts in plan.shardings:
        if ts.sharding_type == ShardingType.DATA_PARALLEL:
            continue
        assert ts.sharding_type == HRW
        nodes = {r // 8 for r in ts.ranks}
        assert sorted(ts.ranks) == [r for h in sorted(nodes) for r in range(8 * h, 8 * h + 8)]
    out = export_hugectr_plan(plan.to_dict())
    assert out["comm_strategy"] == "hierarchical"


def test_hierarchical_row_wise_on_one_host_costs_what_table_row_wise_costs():
    model = _model()
    problem = prepare(ShardingTask(model=model, topology="dgx-a100:nodes=2"), 16)
    cm = problem.cost
    hrw = hierarchical_row_wise(0, "hot", 40_000, 64, [problem.hosts[1]])
    twrw = table_row_wise(0, "hot", 40_000, 64, 1, problem.hosts[1])
    # the same features but the fused lookup group (one kernel call per type)
    assert np.array_equal(cm.sharding_features(hrw)[:, :K], cm.sharding_features(twrw)[:, :K])


def test_hierarchical_row_wise_sends_one_reduced_vector_per_host_across_hosts():
    """A table over 2 hosts × 8 GPUs: each host reduce-scatters B · dim · o of partial sums
    inside itself, and each rank sends (n-1) · b · dim · o / 8 in the pooled all-to-all, 1/8 of
    what the same shards send as subset_row_wise (every rank's own partial sum): at a large
    batch, a faster step, the reduction riding NVLink."""
    model = _model(batch=65_536)
    n, g = 16, 8
    problem = prepare(ShardingTask(model=model, topology="dgx-a100:nodes=2"), n)
    cm = problem.cost
    o, B = cm.out_bytes, model.batch_size
    rest = (table_wise(1, "a", 10_000, 32, 0), table_wise(2, "b", 20_000, 64, 9))
    hier = (hierarchical_row_wise(0, "hot", 40_000, 64, problem.hosts),) + rest
    flat = (subset_row_wise(0, "hot", 40_000, 64, range(n)),) + rest
    F = cm.plan_features(hier)
    assert F[3, F_OUT] == pytest.approx(64 * o / g)
    assert F[3, F_HRS] == pytest.approx(B * 64 * o)
    h, s = simulate_step(problem, hier), simulate_step(problem, flat)
    tw = (n - 1) / n * B * o * (32 + 64)
    assert h.a2a_bytes["output_fwd"] - tw == pytest.approx(
        (s.a2a_bytes["output_fwd"] - tw) / g)
    rs = [op for op in h.result.per_device().itertuples() if op.name.startswith("twrw_rs")]
    assert {op.rank for op in rs} == set(range(n))
    assert h.step_time_s < s.step_time_s


def test_export_refuses_a_plan_mixing_the_communication_strategies():
    doc = {"format": "clusterplan.sharding-plan", "devices": 2, "valid": True, "shards": [
        {"table": "a", "sharding_type": "subset_row_wise", "ranks": [0, 1]},
        {"table": "b", "sharding_type": "hierarchical_row_wise", "ranks": [0, 1]}]}
    with pytest.raises(SpecError) as e:
        export_hugectr_plan(doc, source="plan.json")
    assert e.value.field == "shards" and "hugectr_auto" in e.value.fix
