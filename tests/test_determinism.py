"""Same inputs and seed, same bytes without any flag: across two separate processes, for plans,
simulations and reorderings; their wall-clock figures go to stderr or --timings, never the result."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CASES = [
    ["plan", "criteo-dlrm", "--devices", "8", "--planner", "local_search", "--seed", "3",
     "--json"],
    ["plan", "criteo-dlrm", "--devices", "8", "--planner", "greedy"],
    ["plan", "llama3-8b", "--topology", "h100-ib:nodes=2", "--top", "2", "--json"],
    ["plan", "llama3-8b", "--topology", "h100-ib:nodes=2", "--top", "2"],
    ["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--straggler", "3=1.2", "--json"],
    ["simulate", "llama3-8b", "--topology", "h100-ib:nodes=2", "--parallel", "tp=8,pp=2,dp=1"],
    ["reorder", "--topology", "cloud-64", "--collective", "allreduce", "--json"],
    ["reorder", "--topology", "cloud-64", "--collective", "hierarchical", "--group-size", "4",
     "--json"],
    ["plan", "criteo-dlrm", "--devices", "16", "--topology", "dgx-a100:nodes=2", "--dmt",
     "--towers", "4", "--json"],
    ["collective", "alltoall", "--size", "64MiB", "--ranks", "16", "--topology", "h100-ib:nodes=2",
     "--json"],
]


def _run(args: list[str]) -> tuple[str, str]:
    r = subprocess.run([sys.executable, "-m", "planner.cli.main", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={"PYTHONHASHSEED": "random", "PATH": ""})
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


@pytest.mark.parametrize("args", CASES, ids=[" ".join(c[:2] + c[-1:]) for c in CASES])
def test_two_processes_agree_bit_for_bit(args):
    (a, err), (b, _) = _run(args), _run(args)
    assert a == b
    assert "wall_s" not in a and " s wall" not in a
    if args[0] in ("plan", "simulate", "reorder"):
        assert "timings:" in err              # the run's wall clock went to stderr


def test_timings_file_holds_the_wall_clock(tmp_path):
    out = tmp_path / "t.json"
    stdout, err = _run(["plan", "criteo-dlrm", "--devices", "4", "--planner", "greedy",
                        "--json", "--timings", str(out)])
    t = json.loads(out.read_text())
    assert t["planner_stats.wall_s"] > 0 and "timings:" not in err
    assert "planner_stats" in json.loads(stdout) and "wall_s" not in stdout


def test_a_timings_path_in_a_missing_folder_exits_2_before_any_work(tmp_path, capsys):
    from planner.cli.main import main
    with pytest.raises(SystemExit) as info:
        main(["plan", "criteo-dlrm", "--devices", "2", "--timings", str(tmp_path / "no" / "t.json")])
    err = capsys.readouterr()
    assert info.value.code == 2 and "--timings" in err.err and "does not exist" in err.err
    assert err.out == ""                            # nothing planned, nothing printed
