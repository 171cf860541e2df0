"""Analytic cost model and the simulated DLRM step."""

from __future__ import annotations

import numpy as np
import pytest

from planner.model.tables.cost_config import CostConfig
from planner.model.tables.features import F_BWD, F_FWD, F_IDS, F_OUT
from planner.model.tables.lookup_cost import state_bytes_per_row
from planner.model.tables.shards import Shard, ShardingType
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import catalog
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import build_step_workload, simulate_step


@pytest.mark.parametrize("ref,n", [("dgx-a100", 8), ("dgx-a100:nodes=2", 16)])
def test_a2a_closed_form_matches_simulator(ref, n):
    from simulator.collectives import simulate_collective
    task = ShardingTask(model=load_model_spec("criteo-dlrm"), topology=ref)
    problem = prepare(task, n)
    comm = problem.cost.comm
    rng = np.random.default_rng(0)
    for trial in range(3):
        y = rng.uniform(0, 1, n) ** 3 * 2e6 * (trial + 1)
        m = np.tile(y[:, None], (1, n))
        np.fill_diagonal(m, 0.0)
        sim = simulate_collective(problem.topology, "alltoall", range(n), 1.0, splits=m).time_s
        pred = float(comm.a2a_times(y).max())
        assert pred == pytest.approx(sim, rel=0.10)


def _one_table_model(**kw):
    t = TableSpec(name="t", num_embeddings=1_000_000, embedding_dim=64, pooling_factor=10, **kw)
    return ModelSpec(name="m", tables=(t,), batch_size=65536)


def test_lookup_cost_terms():
    """The priors (no measured lookup file: ``CostConfig(device_profile=None)``)."""
    priors = CostConfig(device_profile=None)
    hot = prepare(ShardingTask(model=_one_table_model(zipf_exponent=1.2), cost=priors), 4).cost
    flat = prepare(ShardingTask(model=_one_table_model(zipf_exponent=0.0), cost=priors), 4).cost
    s = Shard(0, 0, 0, 1_000_000, 64)
    fh = hot.shard_features(0, s, ShardingType.TABLE_WISE)
    ff = flat.shard_features(0, s, ShardingType.TABLE_WISE)
    assert fh[F_FWD] < ff[F_FWD]                         # cache-hit discount for skewed access
    assert ff[F_BWD] == pytest.approx(2 * ff[F_FWD], rel=0.05)   # SGD: backward ≈ 2× forward
    assert ff[F_OUT] == 64 * 4 and ff[F_IDS] == 10 * 8 + 4
    # roughly bandwidth-bound: 655k ids × (~256 B + 64 B + 8 B) at 80% of 2.039 TB/s
    ids = 65536 * 10
    assert 0.5 < ff[F_FWD] / (ids * 330 / (0.8 * 2.039e12)) < 1.5
    # column-wise halves: each half reads half the rows' bytes but all ids
    half = flat.shard_features(0, Shard(0, 0, 0, 1_000_000, 32), ShardingType.COLUMN_WISE)
    assert 0.5 * ff[F_FWD] < half[F_FWD] < ff[F_FWD]
    # row-wise: a quarter of the ids per rank, reduce-scatter instead of the pooled all-to-all
    rw = flat.sharding_features(catalog(prepare(ShardingTask(model=_one_table_model(
        zipf_exponent=0.0), cost=priors), 4)).layout(0, ("rw",)))
    assert rw[:, F_FWD].max() < 0.5 * ff[F_FWD] and rw[:, F_OUT].sum() == 0


def test_each_lookup_group_on_a_rank_is_one_call():
    """A rank pays one fused call's fixed costs (forward launch, backward ``call_s``) per
    sharding type and precision it holds, none when it holds nothing: table-wise fp32 and
    fp16 tables and a row-wise table on 2 ranks."""
    tabs = tuple(TableSpec(name=f"t{i}", num_embeddings=100_000, embedding_dim=64,
                           pooling_factor=4, precision=p)
                 for i, p in enumerate(("fp32", "fp32", "fp16", "fp32")))
    problem = prepare(ShardingTask(model=ModelSpec(name="m", tables=tabs, batch_size=8192),
                                   topology="dgx-h100"), 2)
    cm, cat = problem.cost, catalog(problem)
    layouts = lambda ch: [cat.layout(t, c) for t, c in enumerate(ch)]  # noqa: E731
    cases = {(("tw", 0), ("tw", 0), ("tw", 1), ("rw",)): [2, 2],   # tw32 + rw | tw16 + rw
             (("tw", 0), ("tw", 0), ("tw", 0), ("tw", 0)): [2, 0],  # tw32 + tw16 | nothing
             (("tw", 0), ("tw", 1), ("tw", 1), ("tw", 1)): [1, 2]}
    for choices, want in cases.items():
        F = cm.plan_features(layouts(choices))
        assert cm.calls(F).tolist() == want
        comp = cm.components(F)
        alone = cm.components(F[..., :len(F[0]) - len(cm.groups)])     # no group counts
        for r, k in enumerate(want):
            assert comp["lookup_fwd_s"][r] - alone["lookup_fwd_s"][r] == \
                pytest.approx(k * cm.launch_s)
            assert comp["lookup_bwd_s"][r] - alone["lookup_bwd_s"][r] == \
                pytest.approx(k * cm.bwd_call_s)
    assert cm.bwd_call_s > 1e-4                       # the measured H100 backward's fixed cost


def test_measured_backward_terms_on_a_gpu():
    """With the measured fused-lookup file the backward is its terms: the sort per id, the
    gradient per id and column, the update per distinct row and column, the state."""
    cm = prepare(ShardingTask(model=_one_table_model(zipf_exponent=0.0)), 4).cost
    b = cm.config.backward
    assert b is not None and cm.gpu_lookup.transferred           # dgx-a100: H200's constants
    ids, unique = 65536 * 10, min(65536 * 10 / cm.accesses_per_row[0], 1_000_000)
    f = cm.shard_features(0, Shard(0, 0, 0, 1_000_000, 64), ShardingType.TABLE_WISE)
    want = (ids * (b.id_bytes + 64 * b.grad_element_bytes) + unique * 64 * b.update_element_bytes
            + 2 * unique * state_bytes_per_row(cm.model.optimizer, cm.model.tables[0], 64)
            ) / cm.hbm_Bps
    assert f[F_BWD] == pytest.approx(want, rel=1e-9)


def test_breakdown_sums_and_dense_part():
    m = load_model_spec("mlperf-dcnv2")
    task = ShardingTask(model=m)
    plan = get_planner("greedy").plan(task, 8)
    total = np.sum([plan.breakdown_s[k] for k in plan.breakdown_s], axis=0)
    assert np.allclose(total, plan.per_rank_cost_s, rtol=1e-12)
    assert plan.dense_s["mlp_fwd_s"] > 0 and plan.dense_s["dense_allreduce_s"] > 0
    # backward runs two GEMMs per forward one plus more elementwise passes (op by op)
    assert 1.5 * plan.dense_s["mlp_fwd_s"] < plan.dense_s["mlp_bwd_s"] < 2.5 * plan.dense_s["mlp_fwd_s"]


def test_workload_a2a_bytes_equal_the_plans():
    task = ShardingTask(model=load_model_spec("mlperf-dcnv2"))
    plan = get_planner("local_search").plan(task, 8)
    problem = prepare(task, 8)
    w, mats = build_step_workload(problem, plan.shardings)
    F = problem.cost.plan_features(plan.shardings)
    b = problem.cost.local_batch
    a2a = {op.name: np.array(op.splits) for op in w.ops if op.collective == "alltoall"}
    assert set(a2a) == {"input_a2a", "output_a2a_fwd", "output_a2a_bwd"}
    # pooled outputs: rank i sends b × (its owned bytes per sample) to each peer
    assert a2a["output_a2a_fwd"].sum(axis=1) == pytest.approx(7 * b * F[:, F_OUT])
    assert a2a["output_a2a_bwd"].sum(axis=0) == pytest.approx(7 * b * F[:, F_OUT])
    assert a2a["input_a2a"].sum(axis=0) == pytest.approx(7 * b * F[:, F_IDS])
    for k, name in (("input", "input_a2a"), ("output_fwd", "output_a2a_fwd"),
                    ("output_bwd", "output_a2a_bwd")):
        assert np.array_equal(a2a[name], mats[k])
    total_out = sum(b * m.tables[ts.table].embedding_dim * 4 * 7 for ts in plan.shardings
                    for m in [problem.model] if ts.sharding_type == ShardingType.TABLE_WISE)
    total_out += sum(b * s.cols * 4 * 7 for ts in plan.shardings for s in ts.shards
                     if ts.sharding_type == ShardingType.COLUMN_WISE)
    assert a2a["output_a2a_fwd"].sum() == pytest.approx(total_out)
    sim = simulate_step(problem, plan.shardings)
    assert sim.a2a_bytes["output_fwd"] == pytest.approx(total_out)
    assert sim.step_time_s > plan.dense_s["mlp_fwd_s"]


def test_more_imbalance_simulates_slower(make_task):
    task = make_task(16, seed=4)
    problem = prepare(task, 4)
    cat = catalog(problem)
    balanced = cat.layouts(cat.choices_of(get_planner("local_search").plan(task, 4).shardings))
    skewed = cat.layouts([("tw", 0 if t < 10 else 1 + t % 3) for t in range(16)])
    worst = cat.layouts([("tw", 0) for _ in range(16)])
    times = [simulate_step(problem, s).step_time_s for s in (balanced, skewed, worst)]
    assert times[0] < times[1] < times[2]
    # the analytic maximum orders them the same way and the simulation agrees within 35%
    cm = problem.cost
    est = [float(cm.rank_costs(cm.plan_features(s)).max()) for s in (balanced, skewed, worst)]
    assert est[0] < est[1] < est[2]
    for e, t in zip(est, times):
        assert t == pytest.approx(e, rel=0.35)


def test_the_step_cost_is_what_the_simulated_step_pays():
    """Ranks wait for each other at every all-to-all, so a step pays each phase's slowest
    rank: the step cost (their sum) stays within a few percent above the simulated step for
    balanced and unbalanced plans alike (the excess: the pipelined ids all-to-all, which the
    simulator overlaps), while the slowest rank's own sum misses by more where ranks are even
    in total but not phase by phase."""
    from planner.model.tables.generate import neuroshard_tasks
    from planner.workloads.dlrm.step import simulate_plan
    step, slowest = [], []
    for bt in neuroshard_tasks(8, 2, devices=8, table_range=(20, 40)):
        task = bt.task(topology="dgx-h100:nodes=1", sharding_types=None)
        for name, seed in (("random", 0), ("random", 1), ("greedy", 0)):
            plan = get_planner(name).plan(task, 8, seed=seed)
            sim = simulate_plan(plan, task).step_time_s
            step.append(plan.step_cost_s / sim)
            slowest.append(plan.max_cost_s / sim)
    assert all(1.0 <= r <= 1.06 for r in step), step
    assert max(step) - min(step) < 0.03
    assert min(slowest) < 0.97 and max(slowest) - min(slowest) > 2 * (max(step) - min(step))
