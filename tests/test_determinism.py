"""Same inputs and seed, same bytes: across two separate processes, for plans and simulations."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CASES = [
    ["plan", "criteo-dlrm", "--devices", "8", "--planner", "local_search", "--seed", "3",
     "--reproducible", "--json"],
    ["plan", "llama3-8b", "--topology", "h100-ib:nodes=2", "--top", "2", "--reproducible",
     "--json"],
    ["simulate", "dp-step", "--topology", "dgx-a100:nodes=2", "--straggler", "3=1.2", "--json"],
    ["collective", "alltoall", "--size", "64MiB", "--ranks", "16", "--topology", "h100-ib:nodes=2",
     "--json"],
]


def _run(args: list[str]) -> str:
    r = subprocess.run([sys.executable, "-m", "planner.cli.main", *args], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env={"PYTHONHASHSEED": "random", "PATH": ""})
    assert r.returncode == 0, r.stderr
    return r.stdout


def _strip_wall(text: str) -> str:
    import json
    def drop(o):
        if isinstance(o, dict):
            return {k: drop(v) for k, v in o.items() if k not in ("wall_s", "events_per_s")}
        if isinstance(o, list):
            return [drop(v) for v in o]
        return o
    return json.dumps(drop(json.loads(text)), sort_keys=True)


@pytest.mark.parametrize("args", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_two_processes_agree_bit_for_bit(args):
    a, b = _run(args), _run(args)
    if "--reproducible" in args:
        assert a == b                         # the plan bytes themselves
    else:
        assert _strip_wall(a) == _strip_wall(b)   # every simulated number, wall time aside
