"""The sharding README's TorchRec hand-off, run exactly as written.

The section "Export to TorchRec" of ``planner/sharding/README.md`` has a table CSV, two
``clusterplan`` commands and the trainer's Python. This test writes the CSV, runs the commands,
then runs the Python in 2 gloo processes after ``init_process_group`` (as its first comment
says), with clusterplan made impossible to import there: the trainer needs torch and TorchRec
only. Each rank's ``DistributedModelParallel`` must hold exactly the plan that was exported.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from isolation import NO_CLUSTERPLAN

REPO = Path(__file__).resolve().parents[2]
README = REPO / "planner" / "sharding" / "README.md"
WORLD = 2

_RANK = NO_CLUSTERPLAN + """
import json, sys
import datetime
import torch.distributed as dist
rank, store = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD,
                        timeout=datetime.timedelta(seconds=60))
exec(compile(open("snippet.py").read(), "README.md", "exec"))
print(json.dumps(model.plan._serialize()["plan"]))
dist.destroy_process_group()
"""


def _blocks(text: str) -> dict[str, str]:
    """The first ``text``, ``bash`` and ``python`` blocks of the TorchRec export section."""
    section = text[text.index("## Export to TorchRec"):]
    section = section[:section.index("\n## ", 5)]
    out = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", section, flags=re.S):
        out.setdefault(lang, body)
    return out


def test_readme_torchrec_handoff_runs_as_written(tmp_path):
    pytest.importorskip("torchrec")
    blocks = _blocks(README.read_text())
    assert set(blocks) >= {"text", "bash", "python"}
    (tmp_path / "tables.csv").write_text(blocks["text"])
    for line in blocks["bash"].splitlines():
        args = shlex.split(line, comments=True)
        if not args:
            continue
        assert args[0] == "clusterplan"
        r = subprocess.run([sys.executable, "-m", "planner.cli", *args[1:]], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (line, r.stderr[-1500:])
    r = subprocess.run([sys.executable, "-m", "planner.cli", "export", "plan.json", "--to",
                        "torchrec", "--out", "plan.torchrec.json"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    expected = json.loads((tmp_path / "plan.torchrec.json").read_text())["plan"]
    (tmp_path / "snippet.py").write_text(blocks["python"])
    (tmp_path / "rank.py").write_text(_RANK.replace("WORLD", str(WORLD)))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", "rank.py", str(r),
                               str(tmp_path / "store")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(WORLD)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            assert p.returncode == 0, err[-2000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for got in outs:
        assert got == expected
    kinds = {e["sharding_type"] for e in expected[""].values()}
    assert kinds and kinds <= {"table_wise", "column_wise", "row_wise", "data_parallel"}
