"""The MIP planner's limits: the whole call within its time limit at 16-256 ranks, the same
plan on every run of a time-limited solve, and no CBC process or temporary folder left behind
when the planner is terminated or killed. Figures at more sizes and limits:
tests/bench/bench_mip_limits.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from planner.cli.output import split_timings
from planner.model.tables.generate import NEUROSHARD_DIMS, neuroshard_tasks, synthesize_tables
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask
from planner.sharding.mip_cbc import TEMP_PREFIX
from planner.sharding.planners import get_planner

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _tables_csv(path: Path, n: int = 300, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    rows = ["name,num_embeddings,embedding_dim,pooling_factor"]
    rows += [f"{t.name},{t.num_embeddings},{int(rng.choice(NEUROSHARD_DIMS))},{t.pooling_factor}"
             for t in synthesize_tables(n, seed=seed)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("devices", [16, 64, 256])
def test_the_mip_keeps_its_limit_with_300_tables(tmp_path, devices):
    """The model's build and solve stay within the limit, and greedy's work budget keeps the
    warm start's greedy narrow enough. The whole call against the issue's bound 1.1·limit + 1 s
    is a speed goal of the machine it runs on, measured by tests/bench/bench_mip_limits.py."""
    task = ShardingTask(model=load_model_spec(_tables_csv(tmp_path / "t.csv")))
    limit = 1.0
    plan = get_planner("mip").plan(task, devices, seed=0, time_limit_s=limit)
    t = dict(plan.stats.timings_s)
    assert t["build_s"] + t["solve_s"] <= 1.1 * limit, t
    assert plan.valid and plan.stats.time_limit_s == limit
    if devices == 256:
        assert any(n.startswith("greedy scored") for n in plan.stats.notes), plan.stats.notes


def test_a_time_limited_solve_gives_the_same_plan_every_run():
    """The node budget and the local search's work budget are the stops, not the clock (at
    10 s the budgets plan for about a third of what the safety stops allow: a machine up to
    ~3x slower than the calibration still stops on the budgets)."""
    task = neuroshard_tasks(3, 1, devices=8, table_range=(60, 60))[0].task(sharding_types=None)
    docs = []
    for _ in range(2):
        plan = get_planner("mip").plan(task, 8, seed=0, time_limit_s=10.0)
        assert plan.stats.status in ("node_limit", "fallback"), plan.stats
        docs.append(split_timings(plan.to_dict())[0])
    assert docs[0] == docs[1]


def _children(pid: int, name: str) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            if comm == name and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(p))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _plan_until_cbc_runs(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    csv = _tables_csv(tmp_path / "t.csv", n=60)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "planner.cli.main", "plan", str(csv),
                             "--devices", "16", "--planner", "mip", "--time-limit", "60"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = _children(proc.pid, "cbc")
        if kids:
            return proc, kids[0]
        if proc.poll() is not None:
            pytest.fail(f"plan ended before CBC started: {proc.stderr.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail("CBC never started")


@linux_only
def test_sigterm_stops_cbc_and_removes_its_folder(tmp_path):
    proc, cbc = _plan_until_cbc_runs(tmp_path)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    with proc.stderr:
        err = proc.stderr.read()
    assert rc == 128 + signal.SIGTERM and "terminated" in err
    assert not _alive(cbc)
    assert not list(tmp_path.glob(TEMP_PREFIX + "*"))


@linux_only
def test_a_killed_planner_takes_cbc_with_it(tmp_path):
    proc, cbc = _plan_until_cbc_runs(tmp_path)
    proc.kill()
    proc.wait(timeout=30)
    proc.stderr.close()
    deadline = time.monotonic() + 5
    while _alive(cbc) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(cbc), "CBC outlived the planner that started it"
