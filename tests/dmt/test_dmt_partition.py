"""Tower Partitioner: balance, affinity, baselines, hosts."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import SpecError

from planner.dmt.partition import (
    affinity_kept,
    affinity_matrix,
    assign_hosts,
    imbalance,
    partition_layout,
    resolve_towers,
    synthetic_coaccess,
)


def test_seeded_partition_balanced_within_5_percent(make_task):
    task = make_task(64, seed=3, topology="h100-ib:nodes=4")
    res = partition_layout(task, 32, towers=4, method="affinity", seed=0)
    assert res.imbalance <= 0.05
    assert len(res.layout.towers) == 4
    assert sorted(t for tw in res.layout.towers for t in tw.tables) == list(range(64))
    assert sorted(tw.host for tw in res.layout.towers) == [0, 1, 2, 3]


def test_affinity_beats_baselines_on_affinity_kept(make_task):
    task = make_task(64, seed=3, topology="h100-ib:nodes=4")
    act = synthetic_coaccess(task.model, seed=0)
    got = {m: partition_layout(task, 32, towers=4, method=m, coaccess=act, seed=0)
           for m in ("affinity", "balanced", "random")}
    assert got["affinity"].affinity_kept > got["balanced"].affinity_kept + 0.05
    assert got["affinity"].affinity_kept > got["random"].affinity_kept + 0.05
    assert got["balanced"].imbalance <= got["random"].imbalance


def test_partition_is_deterministic(make_task):
    task = make_task(48, seed=5, topology="h100-ib:nodes=4")
    a = partition_layout(task, 32, towers=4, seed=7)
    b = partition_layout(task, 32, towers=4, seed=7)
    assert np.array_equal(a.labels, b.labels)


def test_coaccess_groups_show_in_affinity(make_task):
    task = make_task(16, seed=1)
    act = synthetic_coaccess(task.model, samples=4000, groups=2, seed=0)
    assert act.shape == (4000, 16)
    a = affinity_matrix(act)
    assert np.allclose(np.diag(a), 0) and np.allclose(a, a.T)
    # pooling means are kept
    means = act.mean(axis=0)
    pf = np.array([t.pooling_factor for t in task.model.tables])
    assert np.allclose(means, pf, rtol=0.25, atol=0.05)


def test_metrics_and_hosts():
    assert imbalance([1, 1, 1, 1]) == 0
    assert imbalance([2, 1, 1, 0]) == pytest.approx(1.0)
    a = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0.0]])
    assert affinity_kept(a, [0, 0, 1]) == 1.0
    assert affinity_kept(a, [0, 1, 1]) == 0.0
    hosts = assign_hosts([5, 4, 3, 2, 1, 1], 3)
    assert sorted(hosts) == [0, 0, 1, 1, 2, 2]


def test_resolve_towers():
    assert resolve_towers("auto", 100, 8) == 8
    assert resolve_towers("auto", 3, 8) == 3
    assert resolve_towers("16", 100, 8) == 16
    for bad in ("x", 0, 101):
        with pytest.raises(SpecError):
            resolve_towers(bad, 100, 8)


def _affinity_problem(features: int, seed: int = 0):
    """A |corr| affinity of features drawn in latent groups, costs and widths."""
    rng = np.random.default_rng(seed)
    groups = features // 8 + 1
    x = rng.normal(size=(400, features)) + \
        rng.normal(size=(400, groups))[:, rng.integers(0, groups, features)]
    a = np.abs(np.corrcoef(x, rowvar=False))
    np.fill_diagonal(a, 0.0)
    return a, rng.uniform(1, 2, features), rng.choice([32, 64, 128], features).astype(float)


def test_a_mip_stopped_by_its_node_budget_repeats_exactly():
    """The budget is a function of the model's size and the limit, not of the clock: the
    incumbent it stops on is the same on every run (a clock-stopped one would vary with load)."""
    from planner.dmt.partition import partition_features
    from planner.dmt.tower_mip import node_budget
    a, w, width = _affinity_problem(200)
    runs = [partition_features(a, w, 8, time_limit_s=1.0, width=width) for _ in range(2)]
    assert runs[0][1]["solver"].startswith("mip (node limit")
    assert np.array_equal(runs[0][0], runs[1][0])
    assert node_budget(5_000, 0.5) == node_budget(5_000, 0.5) > 0
    assert node_budget(10_000_000, 5.0) is None            # the root alone would not fit


def test_a_mip_stopped_by_the_clock_is_not_used(monkeypatch):
    """With a budget too large for the time (as on a slow or busy machine) CBC's clock stops
    it; that incumbent depends on the machine, so the deterministic repair is kept."""
    import planner.dmt.partition as partition
    import planner.dmt.tower_mip as tower_mip
    monkeypatch.setattr(tower_mip, "node_budget", lambda nonzeros, limit_s: 10**6)
    a, w, width = _affinity_problem(200)
    lab, notes = partition.partition_features(a, w, 8, time_limit_s=0.15, width=width)
    assert notes["solver"] == "repair"
    assert all("stopped by the clock" in why for why in notes["mip_not_used"])
    assert np.bincount(lab, minlength=8).min() >= 1
