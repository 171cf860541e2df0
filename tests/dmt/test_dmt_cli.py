"""clusterplan plan --dmt: the plan JSON's dmt section, errors, the TorchRec tower export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _plan(*argv):
    from planner.cli.tables import main
    return main(list(argv))


def test_plan_json_has_dmt_section(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc = _plan("criteo-dlrm", "--devices", "16", "--topology", "dgx-h100:nodes=2", "--dmt",
               "--towers", "auto", "--out", str(out), "--json", "--reproducible")
    assert rc == 0
    doc = json.loads(out.read_text())
    d = doc["dmt"]
    assert d["num_towers"] == 2 and d["hosts"] == 2 and d["gpus_per_host"] == 8
    names = sorted(n for tw in d["towers"] for n in tw["tables"])
    assert names == sorted(t["table"] for t in doc["shards"])
    for tw in d["towers"]:
        assert {"tower", "host", "tables", "in_width", "module_width", "cost_s"} <= set(tw)
        # auto module on one-width tables: mix, ceil(F / 4) vectors of dim 128
        assert tw["module_width"] == -(-len(tw["tables"]) // 4) * 128
    assert d["module"]["kind"] == "mix"
    s = d["simulation"]
    assert s["speedup"] == pytest.approx(s["flat_step_s"] / s["dmt_step_s"])
    assert d["partitioner"]["imbalance"] <= 0.05
    # every table in the host layout of its tower's host, on that host's ranks
    host_of = {n: tw["host"] for tw in d["towers"] for n in tw["tables"]}
    for hp in d["host_plans"]:
        for e in hp["shards"]:
            assert host_of[e["table"]] == hp["host"]
            assert set(e["ranks"]) <= set(hp["ranks"])
    tr = d["torchrec"]
    assert set(tr["tables"]) == set(names)
    assert {e["sharding_type"] for e in tr["tables"].values()} <= {"table_row_wise",
                                                                  "table_column_wise"}


def test_identity_module_and_partitioner_choice(capsys):
    rc = _plan("criteo-dlrm", "--devices", "16", "--topology", "dgx-h100:nodes=2", "--dmt",
               "--tower-module", "identity", "--partitioner", "balanced", "--towers", "4")
    assert rc == 0
    text = capsys.readouterr().out
    assert "DMT: 4 towers on 2 hosts" in text and "module identity" in text


def test_coaccess_file(tmp_path, capsys):
    f = tmp_path / "co.csv"
    rng = np.random.default_rng(0)
    np.savetxt(f, rng.poisson(1.0, size=(200, 26)), delimiter=",")
    assert _plan("criteo-dlrm", "--devices", "16", "--topology", "dgx-h100:nodes=2", "--dmt",
                 "--coaccess", str(f)) == 0
    bad = tmp_path / "bad.csv"
    np.savetxt(bad, np.ones((5, 3)), delimiter=",")
    assert _plan("criteo-dlrm", "--devices", "16", "--topology", "dgx-h100:nodes=2", "--dmt",
                 "--coaccess", str(bad)) == 2
    assert "expected (samples, 26)" in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--towers", "0"], "--towers 0"),
    (["--towers", "many"], "auto or a whole number"),
    (["--tm-ratio", "0.5"], "ratio must be"),
    (["--balance", "-1"], "--balance"),
])
def test_errors_exit_2_one_line(argv, needle):
    r = subprocess.run([sys.executable, "-m", "planner.cli.tables", "criteo-dlrm", "--devices",
                        "16", "--topology", "dgx-h100:nodes=2", "--dmt", *argv],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0]


def test_uneven_hosts_refused():
    assert _plan("criteo-dlrm", "--devices", "12", "--topology", "dgx-h100:nodes=2",
                 "--dmt") == 2


def test_torchrec_parameter_shardings_build():
    pytest.importorskip("torchrec")
    from planner.dmt.partition import partition_layout
    from planner.dmt.towers import shard_hosts
    from planner.export.dmt import to_parameter_shardings, tower_sharding_plan
    from planner.model.tables.spec_file import load_model_spec
    from planner.model.tables.task import ShardingTask, prepare
    task = ShardingTask(model=load_model_spec("criteo-dlrm"), topology="dgx-h100:nodes=2")
    part = partition_layout(task, 16)
    hps = shard_hosts(task, part.layout)
    doc = tower_sharding_plan(task.model, part.layout, hps, prepare(task, 16).hosts)
    ps = to_parameter_shardings(doc)
    assert len(ps) == 26
    for name, p in ps.items():
        host = doc["tables"][name]["host"]
        assert {r // 8 for r in p.ranks} == {host}
