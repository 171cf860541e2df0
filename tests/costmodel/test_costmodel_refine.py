"""The local search on the learned objective, the row-wise pieces of that objective, and the
fast (torch-free) evaluation paths of the shipped nets."""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner.costmodel.objective import Objective  # noqa: E402
from planner.costmodel.refine import refine, split_widths  # noqa: E402
from planner.costmodel.weights import load_predictor  # noqa: E402
from planner.model.tables.shards import ShardingType as S  # noqa: E402


@pytest.fixture(scope="module")
def pred():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_predictor(check_hardware=False)


def _scaled_task(seed: int):
    from planner.measure.tables.plans import cpu_topology_ref, scale_model
    from planner.model.tables.generate import neuroshard_tasks
    bt = neuroshard_tasks(seed, 1)[0]
    return bt.task(model=scale_model(bt.model, 1 / 16), memory_bytes=bt.memory_bytes // 16,
                   topology=cpu_topology_ref(4))


def _hot_task(types):
    """Twelve modest tables and one narrow (dim 4, no column split possible) hot one: 600
    lookups per sample, where the others have at most 8."""
    from planner.measure.tables.plans import cpu_topology_ref
    from planner.model.tables.generate import synthesize_tables
    from planner.model.tables.spec import ModelSpec
    from planner.model.tables.task import ShardingTask
    base = synthesize_tables(12, seed=1)
    tables = [replace(t, num_embeddings=min(t.num_embeddings, 50_000),
                      embedding_dim=(16, 32)[i % 2], pooling_factor=min(t.pooling_factor, 8))
              for i, t in enumerate(base)]
    tables[0] = replace(tables[0], name="hot", embedding_dim=4, pooling_factor=600.0,
                        num_embeddings=200_000)
    model = ModelSpec(name="hot", tables=tuple(tables), batch_size=4096, optimizer="sgd",
                      source="test")
    return ShardingTask(model=model, memory_bytes=None, sharding_types=types,
                        topology=cpu_topology_ref(4))


def test_split_widths_are_multiples_of_four_and_not_only_halves():
    assert split_widths(64) == [16, 20, 32]
    assert split_widths(8) == [4]
    assert split_widths(4) == []
    for w in range(8, 257, 4):
        assert all(q % 4 == 0 and 4 <= q <= w - 4 for q in split_widths(w))


def test_refine_never_worsens_keeps_memory_and_is_deterministic(pred):
    from planner.model.tables.task import prepare
    problem = prepare(_scaled_task(2), 4)
    obj = Objective(problem, pred)
    model = problem.model
    # a poor but feasible start: tables dealt round-robin by size
    order = sorted(range(model.num_tables), key=lambda i: -obj.unit_mem((i, 0, 0)))
    units = [(i, 0, model.tables[i].embedding_dim) for i in order]
    ranks = [k % 4 for k in range(len(units))]
    assert np.all(obj.memory(units, ranks) <= obj.cap)
    start = obj.score(units, ranks)
    a = refine(obj, units, ranks, max_evals=3000)
    b = refine(Objective(problem, pred), units, ranks, max_evals=3000)
    assert a.start_ms == pytest.approx(start)
    assert a.score_ms < start and sum(a.moves.values()) >= 1
    assert (a.units, a.ranks, a.score_ms) == (b.units, b.ranks, b.score_ms)
    assert a.score_ms == pytest.approx(obj.score(a.units, a.ranks))
    assert np.all(obj.memory(a.units, a.ranks) <= obj.cap * (1 + 1e-12))
    assert a.evals <= 3000
    for t in range(model.num_tables):           # every table's columns exactly once
        assert sum(u[2] for u in a.units if u[0] == t) == model.tables[t].embedding_dim


def test_neuroshard_turns_a_hot_narrow_table_row_wise_when_allowed(pred):
    from planner.costmodel.planner import learned_plan_cost_ms
    from planner.sharding.planners import get_planner
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        twcw = get_planner("neuroshard").plan(_hot_task((S.TABLE_WISE, S.COLUMN_WISE)), 4,
                                              time_limit_s=120)
        task = _hot_task((S.TABLE_WISE, S.COLUMN_WISE, S.ROW_WISE))
        rw = get_planner("neuroshard").plan(task, 4, time_limit_s=120)
    assert twcw.valid and rw.valid
    assert twcw.shardings[0].sharding_type == S.TABLE_WISE       # dim 4: nothing to split
    assert rw.shardings[0].sharding_type == S.ROW_WISE
    assert any("rowwise" in n for n in rw.stats.notes)
    # one rank serving all 600 lookups per sample bounds the step; row blocks spread them
    # (measured on this CPU, 2026-11-23: 62.7 ms vs 25.8 ms, see planner/costmodel/README.md)
    a = learned_plan_cost_ms(task, 4, twcw.shardings, predictor=pred)
    b = learned_plan_cost_ms(task, 4, rw.shardings, predictor=pred)
    assert b < 0.6 * a


def test_row_blocks_costed_as_their_share_of_rows_and_lookups(pred):
    from planner.model.tables.task import prepare
    problem = prepare(_hot_task((S.TABLE_WISE, S.COLUMN_WISE, S.ROW_WISE)), 4)
    obj = Objective(problem, pred)
    t = problem.model.tables[0]
    recs = obj.rw_recs(0)
    assert len(recs) == 4
    assert sum(r[0] for r in recs) == pytest.approx(t.num_embeddings * obj.factor, abs=4)
    assert sum(r[2] for r in recs) == pytest.approx(t.pooling_factor)
    assert all(r[1] == t.embedding_dim for r in recs)
    whole = pred.compute_ms([[obj.rec((0, 0, 4))]])[0]
    block = pred.compute_ms([[recs[0]]])[0]
    assert block < 0.5 * whole
    rwc = obj.rowwise_comm_ms((0,))
    assert np.all(rwc > 0) and np.all(obj.rowwise_comm_ms(()) == 0)
    assert np.all(obj.rw_mem(0) > 0)


def test_fast_paths_equal_the_torch_nets(pred):
    from planner.costmodel.features import table_matrix
    from planner.costmodel.model import predict_compute
    from planner.model.tables.access import default_reuse_bins
    rng = np.random.default_rng(0)
    devices = [[[float(rng.integers(100, 200_000)), float(rng.choice([4, 8, 16, 32, 64, 128])),
                 float(rng.uniform(1, 30))] + list(default_reuse_bins())
                for _ in range(int(rng.integers(1, 15)))] for _ in range(30)]
    assert pred.additive
    fast = pred.compute_ms(devices)
    slow = predict_compute(pred.compute_net, [table_matrix(d, batch=pred.batch)
                                              for d in devices])
    np.testing.assert_allclose(fast, slow, rtol=1e-5)
    for d in devices[:5]:                # the grid search's incremental sums agree too
        summed = sum(pred.terms(r) for r in d)
        assert pred.combine(summed) == pytest.approx(pred.compute_ms([d])[0], rel=1e-9)
    for _ in range(20):
        dims, waits = list(rng.uniform(0, 2000, 4)), list(rng.uniform(0, 20, 4))
        f, b = pred.comm_ms(dims, waits)
        with torch.no_grad():
            f2 = np.exp(pred.fwd_net(torch.tensor([dims + waits], dtype=torch.float32)).numpy()[0])
            b2 = np.exp(pred.bwd_net(torch.tensor([dims], dtype=torch.float32)).numpy()[0])
        np.testing.assert_allclose(f, f2, rtol=1e-5)
        np.testing.assert_allclose(b, b2, rtol=1e-5)
