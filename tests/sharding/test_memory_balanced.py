"""``--planner memory_balanced``: distributed-embeddings' placement (DeepLearningExamples' TF2
DLRM), checked against its rule written out independently here: slices sorted by elements,
dealt to ranks ``i`` and ``2W - 1 - i`` of every ``2W`` positions, column slices over the
threshold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.model.tables.shards import ShardingType
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask
from planner.sharding.memory_balanced import MemoryBalancedPlanner, column_slices
from planner.sharding.planners import get_planner

REPO = Path(__file__).resolve().parents[2]


def _library_rule(sizes: list[float], world: int) -> list[list[int]]:
    """The strategy as the library states it: indices sorted by size, largest first (equal
    sizes: higher index first), rank i takes sorted[i::2W] + sorted[2W-1-i::2W]."""
    order = [i for _, i in sorted(zip(sizes, range(len(sizes))), reverse=True)]
    return [sorted(order[i::2 * world] + order[2 * world - 1 - i::2 * world])
            for i in range(world)]


def test_criteo_tables_stay_whole_and_follow_the_snake():
    model = load_model_spec("criteo-dlrm")
    plan = get_planner("memory_balanced").plan(ShardingTask(model=model, topology="dgx-a100"), 8)
    assert plan.valid, plan.problems
    assert {ts.sharding_type for ts in plan.shardings} == {ShardingType.TABLE_WISE}
    sizes = [float(t.num_embeddings * t.embedding_dim) for t in model.tables]
    got = [sorted(ts.table for ts in plan.shardings if ts.ranks == (r,)) for r in range(8)]
    assert got == _library_rule(sizes, 8)
    counts = sorted(len(g) for g in got)
    assert counts == [3] * 6 + [4] * 2              # 26 tables: even counts, not even bytes


def test_tables_over_the_threshold_become_column_slices():
    model = load_model_spec("criteo-dlrm")
    planner = MemoryBalancedPlanner(column_slice_threshold=1e9)
    plan = planner.plan(ShardingTask(model=model, topology="dgx-a100"), 8)
    assert plan.valid, plan.problems
    big = [t for t, tab in enumerate(model.tables) if tab.num_embeddings * 128 > 1e9]
    assert len(big) == 5              # four ~40M-row tables (8 slices) and a 25.6M one (4)
    units = [(t, w) for t, tab in enumerate(model.tables)
             for w in column_slices(tab.num_embeddings, tab.embedding_dim, 1e9, 8)]
    assert sorted(len([u for u in units if u[0] == t]) for t in big) == [4, 8, 8, 8, 8]
    want = _library_rule([float(model.tables[t].num_embeddings * w) for t, w in units], 8)
    for ts in plan.shardings:
        assert sum(s.cols for s in ts.shards) == model.tables[ts.table].embedding_dim
        cols = {s.rank: s.cols for s in ts.shards}
        for r in range(8):
            assert cols.get(r, 0) == sum(units[u][1] for u in want[r] if units[u][0] == ts.table)
        assert (ts.sharding_type == ShardingType.COLUMN_WISE) == (ts.table in big)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_cli_plans_with_it_and_refuses_a_bad_threshold():
    r = _cli("plan", "criteo-dlrm", "--devices", "8", "--planner", "memory_balanced", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["planner"] == "memory_balanced"
    for args, word in ((("--planner", "memory_balanced", "--column-slice-threshold", "0"),
                        "positive"),
                       (("--planner", "greedy", "--column-slice-threshold", "1e9"),
                        "memory_balanced")):
        bad = _cli("plan", "criteo-dlrm", "--devices", "8", *args)
        assert bad.returncode == 2 and "Traceback" not in bad.stderr
        assert "--column-slice-threshold" in bad.stderr and word in bad.stderr


def test_odd_slice_widths_are_refused_with_the_fix(tmp_path):
    spec = tmp_path / "t.yaml"
    spec.write_text("name: odd\nbatch_size: 64\ntables:\n"
                    "  - {name: a, num_embeddings: 1000, embedding_dim: 6}\n"
                    "  - {name: b, num_embeddings: 10, embedding_dim: 8}\n")
    from simulator.errors import SpecError
    with pytest.raises(SpecError) as e:
        MemoryBalancedPlanner(column_slice_threshold=3000).plan(
            ShardingTask(model=load_model_spec(spec), topology="dgx-a100"), 2)
    assert "multiples of 4" in str(e.value) and "threshold" in e.value.fix
