"""Every planner returns a valid plan; MIP equals brute force on tiny tasks; MIP keeps its time
limit and reports its gap; local search never worsens a plan."""

from __future__ import annotations

import itertools
import time
from contextlib import nullcontext

import numpy as np
import pytest

from planner.costmodel.weights import HardwareMismatchWarning
from planner.model.tables.features import F_MEM
from planner.model.tables.generate import neuroshard_tasks
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import catalog
from planner.sharding.local_search import improve_choices
from planner.sharding.mip import MipPlanner
from planner.sharding.planners import PLANNER_NAMES, get_planner
from planner.sharding.protocols import Planner


@pytest.mark.parametrize("name", PLANNER_NAMES)
def test_every_planner_returns_a_valid_plan(name, make_task):
    task = make_task(12, seed=3, memory_fraction=0.4)
    p = get_planner(name)
    assert isinstance(p, Planner)
    # no learned cost model for this GPU: neuroshard plans on the analytic model and warns
    with (pytest.warns(HardwareMismatchWarning) if name == "neuroshard" else nullcontext()):
        plan = p.plan(task, 4, seed=1, time_limit_s=2.0)
    assert plan.valid, plan.problems
    assert plan.planner == name and len(plan.shardings) == 12
    assert sorted(ts.table for ts in plan.shardings) == list(range(12))
    assert plan.max_cost_s == max(plan.per_rank_cost_s) > 0
    phases = sum(max(v) for v in plan.breakdown_s.values())
    assert plan.step_cost_s == pytest.approx(phases, rel=1e-12)
    assert plan.step_cost_s >= plan.max_cost_s * (1 - 1e-12)
    assert all(m <= c for m, c in zip(plan.memory_per_rank_bytes, plan.memory_capacity_bytes))


def test_planners_on_neuroshard_tasks_and_ordering():
    """Cost-aware planners beat the proxies; local search and MIP never lose to greedy."""
    costs = {n: [] for n in ("random", "size", "size_lookup", "greedy", "local_search")}
    for bt in neuroshard_tasks(0, 4):
        for n in costs:
            plan = get_planner(n).plan(bt.task(), bt.devices, seed=0)
            assert plan.valid
            costs[n].append(plan.step_cost_s)
    mean = {n: float(np.mean(v)) for n, v in costs.items()}
    assert mean["greedy"] < mean["size_lookup"] < mean["random"]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(costs["local_search"], costs["greedy"]))


def _brute_force(problem, parts):
    """Minimum step cost over every assignment of the MIP's options (2 devices)."""
    cat = catalog(problem)
    n = problem.devices
    opts = []
    for t in range(problem.num_tables):
        ch = [("tw", d) for d in range(n)]
        for k in cat.cw_parts(t, parts):
            for counts in itertools.product(range(k + 1), repeat=n):
                if sum(counts) == k and sum(c > 0 for c in counts) >= 2:
                    ch.append(("cw", k, counts))
        for kind, st in (("rw", ShardingType.ROW_WISE), ("dp", ShardingType.DATA_PARALLEL)):
            if cat.can(t, st):
                ch.append((kind,))
        opts.append((ch, np.stack([cat.contrib(t, c) for c in ch])))
    shapes = [len(c) for c, _ in opts]
    best = np.inf
    combos = itertools.product(*[range(s) for s in shapes])
    cap = cat.cap
    chunk = 200_000
    while True:
        block = list(itertools.islice(combos, chunk))
        if not block:
            break
        idx = np.array(block)
        F = sum(a[idx[:, t]] for t, (_, a) in enumerate(opts))
        ok = (F[:, :, F_MEM] <= cap[None, :]).all(axis=1)
        if ok.any():
            best = min(best, float(problem.cost.step_cost(F[ok]).min()))
    return best, int(np.prod(shapes))


@pytest.mark.parametrize("n_tables,seed,parts,frac,opt", [
    (8, 0, (2,), 0.6, "sgd"), (7, 1, (2,), 0.7, "adam"), (6, 2, (2, 4), 0.8, "rowwise_adagrad"),
    (5, 5, (2, 4, 8), 0.9, "sgd")])
def test_mip_equals_brute_force(make_task, n_tables, seed, parts, frac, opt):
    task = make_task(n_tables, seed=seed, memory_fraction=frac, devices=2, optimizer=opt,
                     dims=(8, 16, 32, 4, 64))
    problem = prepare(task, 2)
    brute, combos = _brute_force(problem, parts)
    assert combos > 1000 and np.isfinite(brute)
    for warm in (True, False):
        plan = MipPlanner(parts=parts, warm_start=warm).plan(task, 2, seed=0, time_limit_s=20)
        assert plan.valid
        assert plan.stats.status == "optimal" and plan.stats.gap == 0.0
        assert plan.step_cost_s == pytest.approx(brute, rel=1e-6)
        assert plan.stats.objective_s == pytest.approx(plan.step_cost_s, rel=1e-12)


def test_mip_time_limit_and_gap():
    bt = neuroshard_tasks(3, 1, devices=8, table_range=(60, 60))[0]
    task = bt.task(sharding_types=None)
    limit = 2.5
    t0 = time.perf_counter()
    plan = get_planner("mip").plan(task, 8, seed=0, time_limit_s=limit)
    wall = time.perf_counter() - t0
    # 110% is the bench's figure (tests/bench/bench_sharding.py); here 0.3 s more is allowed
    # for another tenant's scheduler slices on a shared 2-core machine
    assert wall <= 1.10 * limit + 0.3, wall
    assert plan.valid and plan.stats.time_limit_s == limit and plan.stats.wall_s <= wall
    assert plan.stats.status in ("node_limit", "optimal", "fallback")
    if plan.stats.status != "fallback":      # a fallback after a safety stop has no bound
        assert plan.stats.gap is not None and 0.0 <= plan.stats.gap < 1.0
        assert plan.stats.bound_s <= plan.step_cost_s
    greedy = get_planner("greedy").plan(task, 8)
    assert plan.step_cost_s <= greedy.step_cost_s * (1 + 1e-9)


def test_mip_tiny_limit_still_returns_within_110_percent():
    bt = neuroshard_tasks(4, 1, devices=8, table_range=(59, 59))[0]
    t0 = time.perf_counter()
    plan = get_planner("mip").plan(bt.task(), 8, seed=0, time_limit_s=0.6)
    assert time.perf_counter() - t0 <= 0.66 + 0.3          # see test_mip_time_limit_and_gap
    assert plan.valid


@pytest.mark.parametrize("seed", range(5))
def test_local_search_never_worsens(make_task, seed):
    task = make_task(20, seed=seed, memory_fraction=0.35)
    problem = prepare(task, 4)
    cat = catalog(problem)
    start = get_planner("random").plan(task, 4, seed=seed)
    choices0 = cat.choices_of(start.shardings)
    before = float(problem.cost.step_cost(cat.features(choices0)))
    best, info = improve_choices(cat, choices0, seed=seed, rounds=3)
    F = cat.features(best)
    after = float(problem.cost.step_cost(F))
    assert after <= before and (F[:, F_MEM] <= cat.cap + 0.5).all()
    assert after < before          # a random start is always improvable here
    again, _ = improve_choices(cat, choices0, seed=seed, rounds=3)
    assert again == best           # deterministic given the seed


def test_greedy_60x8_is_fast():
    bt = neuroshard_tasks(5, 1, devices=8, table_range=(60, 60))[0]
    task = bt.task()
    prepare(task, 8)
    t0 = time.perf_counter()
    plan = get_planner("greedy").plan(task, 8)
    assert time.perf_counter() - t0 < 5.0 and plan.valid    # the benchmark asserts ≤ 2 s


def _one_heavy_table_task(topology: str, types=None):
    """24 ordinary tables and one whose ids alone outweigh a rank's share (pooling 200)."""
    from planner.model.tables.spec import ModelSpec, TableSpec
    from planner.model.tables.task import ShardingTask
    tables = [TableSpec(name="heavy", num_embeddings=1_000_000, embedding_dim=128,
                        pooling_factor=200.0)]
    tables += [TableSpec(name=f"t{i}", num_embeddings=100_000 + 20_000 * i, embedding_dim=64,
                         pooling_factor=4.0 + i % 5) for i in range(24)]
    model = ModelSpec(name="one-heavy", tables=tuple(tables), batch_size=65536)
    return ShardingTask(model=model, topology=topology, sharding_types=types)


@pytest.mark.parametrize("name", ["greedy", "local_search"])
def test_a_table_heavier_than_a_rank_share_is_spread_over_a_host(name):
    """On two DGX hosts (16 GPUs) a table whose per-id backward alone outweighs a rank's
    share cannot be balanced by column parts (each part still serves every id): the planners
    split its ids (table-row-wise over one host or row-wise over all), and the plan's step
    cost is lower than the best they find without those types. On one host there is no
    table-row-wise spread to choose."""
    tw_cw = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)
    spread = get_planner(name).plan(_one_heavy_table_task("dgx-h100:nodes=2"), 16, seed=0)
    kept = get_planner(name).plan(_one_heavy_table_task("dgx-h100:nodes=2", tw_cw), 16, seed=0)
    assert spread.valid and kept.valid
    heavy = next(ts for ts in spread.shardings if ts.table == 0)
    assert heavy.sharding_type in (ShardingType.TABLE_ROW_WISE, ShardingType.ROW_WISE)
    if heavy.sharding_type == ShardingType.TABLE_ROW_WISE:
        assert len({s.rank // 8 for s in heavy.shards}) == 1 and len(heavy.shards) == 8
    else:
        assert len(heavy.shards) == 16
    assert spread.step_cost_s < 0.8 * kept.step_cost_s
    one_host = get_planner(name).plan(_one_heavy_table_task("dgx-h100:nodes=1"), 8, seed=0)
    assert ShardingType.TABLE_ROW_WISE.value not in one_host.type_counts()


def test_greedy_counts_the_row_wise_share_every_rank_carries():
    """MLPerf DCNv2 on 8 A100s: cat_20 (pooling 100) is spread row-wise over every rank, which
    puts its share on the rank that also holds cat_21 (pooling 27, about one rank's average
    alone). Greedy must see that rank's load as cat_21 plus that share, not cat_21 alone, and
    split it too; before it did, its step cost was 1.27x local search's (5.47 vs 4.31 ms).
    Once cat_20 is row-wise every rank makes a row-wise lookup call, so spreading cat_21 too
    adds no call, while column parts beside table-wise shards would (greedy prices each
    spread with the calls already made: 5.79 ms against local search's 5.17 when it did not).
    With the host-free lookup backward (0.16 ms per call, not 0.79) greedy's plan costs 3.56 ms
    against local search's 3.52, its ranks within 5.1% of their mean."""
    task = ShardingTask(model=load_model_spec("mlperf-dcnv2"), topology="dgx-a100:nodes=1")
    greedy = get_planner("greedy").plan(task, 8, seed=0)
    ls = get_planner("local_search").plan(task, 8, seed=0)
    assert greedy.valid and ls.valid
    assert greedy.type_counts().get("row_wise", 0) >= 1
    cat21 = next(ts for ts in greedy.shardings if ts.table == 21)
    assert len(cat21.shards) > 1
    assert greedy.step_cost_s <= 1.03 * ls.step_cost_s
    assert greedy.imbalance < 1.06


def test_greedy_tries_plans_of_one_lookup_call_per_rank():
    """A rank pays a fused call per sharding type it holds, so a plan of one type throughout
    (every table table-row-wise on 2 hosts of 8 H100s) is a candidate greedy's own steps
    cannot reach table by table. Its plan is never dearer than either one-type plan, and it
    says when it is one; the step cost counts each rank's calls."""
    tasks = neuroshard_tasks(0, 3, devices=16, table_range=(20, 40))
    picked = 0
    for bt in tasks:
        task = bt.task(topology="dgx-h100:nodes=2", sharding_types=None)
        problem = prepare(task, 16)
        cat, cm = catalog(problem), problem.cost
        plan = get_planner("greedy").plan(task, 16, seed=0)
        again = get_planner("greedy").plan(task, 16, seed=0)
        for kind in ("rw", "twrw"):
            choices = ([("rw",)] * cat.model.num_tables if kind == "rw" else
                       [("twrw", t % 2) for t in range(cat.model.num_tables)])
            assert plan.step_cost_s <= cm.step_cost(cat.features(choices)) * (1 + 1e-9)
        one = [n for n in plan.stats.notes if "every table" in n]
        if one:
            picked += 1
            assert len(plan.type_counts()) == 1
            F = cm.plan_features(plan.shardings)
            assert cm.calls(F).tolist() == [1.0] * 16
        assert plan.shardings == again.shardings               # deterministic
    assert picked >= 2
