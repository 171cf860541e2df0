"""Greedy under a work budget (what the MIP's warm start gives it from its time limit), and the
shortcuts that keep its pricing cheap at hundreds of ranks: each must give the very numbers
of the long way."""

from __future__ import annotations

import numpy as np
import pytest

from planner.model.tables.generate import synthesize_tables
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import catalog
from planner.sharding.greedy import greedy_choices
from planner.sharding.greedy_work import SHORTLIST, Work


def _catalog(devices: int, topology: str | None = None, tables: int = 120):
    model = ModelSpec(name="work", tables=tuple(synthesize_tables(tables, seed=3)),
                      batch_size=65536)
    task = ShardingTask(model=model, topology=topology) if topology else ShardingTask(model=model)
    return catalog(prepare(task, devices))


def test_a_budget_that_is_not_binding_changes_nothing():
    cat = _catalog(32)
    free, free_notes = greedy_choices(cat)
    work = Work(1e12)
    ample, ample_notes = greedy_choices(cat, work=work)
    assert ample == free and ample_notes == free_notes
    assert 0 < work.spent < 1e12


def test_a_tight_budget_narrows_greedy_says_so_and_stays_deterministic():
    """A budget far below what the full run spends: one rule, a shortlist under SHORTLIST,
    both said in the notes; the same budget gives the same plan, and every table is placed
    with its step cost within reach of the full run's."""
    cat = _catalog(64)
    full = Work()
    best, _ = greedy_choices(cat, work=full)
    runs = []
    for _ in range(2):
        w = Work(full.spent / 8)
        choices, notes = greedy_choices(cat, work=w)
        runs.append((choices, notes, w.spent))
    (choices, notes, spent), again = runs
    assert again[0] == choices and again[1] == notes
    assert all(c is not None for c in choices)
    assert any("phase rule was skipped" in n for n in notes), notes
    short = [n for n in notes if n.startswith("greedy scored")]
    assert short and int(short[0].split()[2]) < SHORTLIST, notes
    assert spent < full.spent / 2
    step = lambda c: float(cat.cost.step_cost(cat.features(c)))  # noqa: E731
    assert step(choices) <= 1.5 * step(best)


@pytest.mark.parametrize("kind", ["twrw", "rw"])
def test_spread_features_shared_across_hosts_and_shards_equal_the_long_way(kind):
    """Table-row-wise features are computed once per host size and row-wise ones once per
    distinct shard size; both must equal the sum of every shard's own features."""
    cat = _catalog(32, "dgx-h100:nodes=4", tables=12)
    cost = cat.cost
    hosts = range(len(cost.hosts)) if kind == "twrw" else [-1]
    for t in range(cat.model.num_tables):
        for h in hosts:
            ts = cat.layout(t, (kind, h) if h >= 0 else (kind,))
            long_way = np.zeros_like(cat.uniform(t, kind, h))
            for s in ts.shards:
                long_way[s.rank] += cost.shard_features(t, s, ts.sharding_type)
            assert np.array_equal(cat.uniform(t, kind, h), long_way), (t, h)
            if kind == "twrw":
                assert ts.sharding_type == ShardingType.TABLE_ROW_WISE
                assert {s.rank for s in ts.shards} == set(cost.hosts[h])


def test_the_all_to_all_on_several_hosts_matches_its_closed_form():
    """Per rank: alpha + max(send, receive) inside its host / intra + outside / inter."""
    cm = _catalog(32, "dgx-h100:nodes=4", tables=4).cost.comm
    rng = np.random.default_rng(0)
    y = rng.uniform(0, 1e6, size=(3, 32))
    got = cm.a2a_times(y)
    node = np.asarray(cm.node_of)
    for b in range(3):
        for r in range(32):
            same = node == node[r]
            g = same.sum()
            intra = max(y[b, r] * (g - 1), y[b, same].sum() - y[b, r]) / cm.intra_Bps
            inter = max(y[b, r] * (32 - g), y[b, ~same].sum()) / cm.inter_Bps
            assert got[b, r] == pytest.approx(cm.a2a_alpha_s + intra + inter, rel=1e-12)
