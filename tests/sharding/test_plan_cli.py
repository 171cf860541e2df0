"""Plan JSON, determinism (in process and across processes) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.model.tables.plan import FORMAT_VERSION, read_plan_json
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.planners import get_planner

REPO = Path(__file__).resolve().parents[2]

KEYS = {"planner", "devices", "per_rank_cost_s", "max_cost_s", "memory_per_rank_bytes", "shards",
        "valid", "task", "topology", "planner_stats", "format_version"}


def test_plan_json_keys_and_round_trip(tmp_path):
    task = ShardingTask(model=load_model_spec("mlperf-dcnv2"))
    plan = get_planner("mip").plan(task, 8, time_limit_s=2)
    doc = plan.to_dict()
    assert KEYS <= set(doc) and doc["format_version"] == FORMAT_VERSION
    assert {"wall_s", "gap", "status"} <= set(doc["planner_stats"])
    for e in doc["shards"]:
        assert {"table", "sharding_type", "ranks", "shards"} <= set(e)
        assert len(e["ranks"]) == len(e["shards"])
        for s in e["shards"]:
            assert len(s["offsets"]) == 2 and len(s["sizes"]) == 2
    out = tmp_path / "plan.json"
    plan.write(out)
    back = json.loads(out.read_text())
    assert back == json.loads(json.dumps(doc))
    again = read_plan_json(back, prepare(task, 8))
    assert [ts.key() for ts in again] == [ts.key() for ts in plan.shardings]
    assert not list(tmp_path.glob(".plan.json.*"))          # no temporary file left


@pytest.mark.parametrize("name", ["random", "size_lookup", "greedy", "local_search"])
def test_same_seed_same_bytes(name):
    task = ShardingTask(model=load_model_spec("criteo-dlrm"))
    a = get_planner(name).plan(task, 8, seed=3).to_json(stable=True)
    b = get_planner(name).plan(task, 8, seed=3).to_json(stable=True)
    assert a == b and "wall_s" not in a


def test_same_bytes_across_processes(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   + "".join(f"t{i},{1000 * (i + 1) ** 3},{[16, 32, 64][i % 3]},{1 + i % 5}\n"
                             for i in range(20)))
    outs = []
    for k in range(2):
        out = tmp_path / f"p{k}.json"
        cmd = [sys.executable, "-m", "planner.cli.tables", str(csv), "--devices", "4",
               "--planner", "local_search", "--seed", "11", "--reproducible", "--json",
               "--out", str(out)]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        outs.append((r.stdout, out.read_bytes()))
    assert outs[0] == outs[1]
    assert json.loads(outs[0][0])["planner"] == "local_search"


def test_mip_optimal_runs_are_deterministic(make_task):
    task = make_task(6, seed=2, memory_fraction=0.7)
    a = get_planner("mip").plan(task, 2, seed=5, time_limit_s=20)
    b = get_planner("mip").plan(task, 2, seed=5, time_limit_s=20)
    assert a.stats.status == "optimal"
    assert a.to_json(stable=True) == b.to_json(stable=True)


def test_cli_run_human_and_json(cli, capsys, tmp_path):
    assert cli("criteo-dlrm", "--devices", "8", "--planner", "size_lookup") == 0
    out = capsys.readouterr().out
    assert "rank" in out and "imbalance" in out and "valid" in out and "GiB" in out
    out_file = tmp_path / "plan.json"
    assert cli("mlperf-dcnv2", "--devices", "8", "--planner", "greedy", "--json",
               "--out", str(out_file), "--simulate") == 0
    doc = json.loads(capsys.readouterr().out)
    assert KEYS <= set(doc) and doc["devices"] == 8 and doc["valid"] is True
    assert doc["simulation"]["step_time_s"] > 0
    assert json.loads(out_file.read_text())["max_cost_s"] == doc["max_cost_s"]


def test_cli_invalid_plan_exits_1(cli, capsys, tmp_path):
    # two tables of 60% of a device each on 2 devices: table-wise fits; a third does not
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   "a,1000000,64,1\nb,1000000,64,1\nc,1000000,64,1\n")
    code = cli(str(csv), "--devices", "2", "--memory", "400MB", "--planner", "size",
               "--sharding-types", "tw")
    out = capsys.readouterr().out
    assert code == 1 and "INVALID" in out


def test_an_invalid_plan_leaves_out_alone_and_does_not_export(cli, capsys, tmp_path):
    """Exit 1 writes nothing over --out, and an invalid plan file is refused by the export."""
    from planner.cli.main import main
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   "a,1000000,64,1\nb,1000000,64,1\nc,1000000,64,1\n")
    out_file = tmp_path / "plan.json"
    out_file.write_text('{"earlier": true}')
    code = cli(str(csv), "--devices", "2", "--memory", "400MB", "--planner", "size",
               "--sharding-types", "tw", "--out", str(out_file), "--json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["valid"] is False
    assert json.loads(out_file.read_text()) == {"earlier": True}
    bad = tmp_path / "invalid.json"
    bad.write_text(json.dumps(doc))
    assert main(["export", str(bad), "--to", "torchrec", "--out", str(tmp_path / "x.json")]) == 2
    assert "not valid" in capsys.readouterr().err
