"""The shipped weights load with weights_only and predict; --planner neuroshard plans."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner.costmodel.weights import load_predictor, shipped_weights_path  # noqa: E402


def test_shipped_weights_load_and_predict():
    path = shipped_weights_path()
    state = torch.load(path, weights_only=True)
    assert state and all(isinstance(v, torch.Tensor) for v in state.values())
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["collection"]["hardware"][0]["cpu_model"]
    assert meta["data_file"] == "cpu-epyc.csv"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # other hardware only warns
        pred = load_predictor()
    recs = [[[r, d, p] + [0.5, 0.3] + [0.2 / 15] * 15 for r, d, p in
             [(1000, 16, 3.0), (50000, 128, 20.0)]],
            [[2000, 4, 1.0] + [1.0] + [0.0] * 16]]
    ms = pred.compute_ms(recs)
    assert np.all(np.isfinite(ms)) and np.all(ms > 0)
    f, b = pred.comm_ms([100, 200, 300, 400], [0.0, 1.0, 2.0, 3.0])
    assert np.all(np.isfinite(f)) and np.all(f > 0) and np.all(b > 0)


def _scaled_task():
    """A NeuroShard-shaped task scaled to this CPU (1/16 of the rows and memory), 4 ranks."""
    from planner.measure.tables.plans import cpu_topology_ref, scale_model
    from planner.model.tables.generate import neuroshard_tasks
    bt = neuroshard_tasks(3, 1)[0]
    model = scale_model(bt.model, 1 / 16)
    return model, bt.task(model=model, memory_bytes=bt.memory_bytes // 16,
                          topology=cpu_topology_ref(4))


def test_planner_neuroshard_returns_a_valid_plan():
    from planner.sharding.planners import PLANNER_NAMES, get_planner
    assert "neuroshard" in PLANNER_NAMES
    model, task = _scaled_task()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tw = get_planner("neuroshard", beam=0, refine=False).plan(task, 4, seed=0)
        cw = get_planner("neuroshard", refine=False).plan(task, 4, seed=0, time_limit_s=120)
        # a generous safety stop: the work is counted, the clock must not cut it on a busy CI
        full = get_planner("neuroshard").plan(task, 4, seed=0, time_limit_s=120)
        again = get_planner("neuroshard").plan(task, 4, seed=0, time_limit_s=120)
    for plan in (tw, cw, full):
        assert plan.valid and plan.planner == "neuroshard"
        assert len(plan.shardings) == model.num_tables
        for ts in plan.shardings:         # every table's columns covered exactly once
            t = model.tables[ts.table]
            assert sum(s.cols for s in ts.shards) == t.embedding_dim
            assert all(s.cols % 4 == 0 and s.rows == t.num_embeddings for s in ts.shards)
    assert {ts.sharding_type.value for ts in tw.shardings} == {"table_wise"}
    assert {ts.sharding_type.value for ts in cw.shardings} <= {"table_wise", "column_wise"}
    assert any("learned cost" in n for n in cw.stats.notes)
    assert full.shardings == again.shardings            # counted work: same plan every run

    def learned(plan):
        note = next(n for n in plan.stats.notes if n.startswith("learned cost"))
        return float(note.split("predicted max ")[1].split(" ms")[0])
    assert learned(cw) <= learned(tw) + 1e-9   # the beam keeps the best, halvings or not
    # any TW/CW/RW plan is costed as the search scores its own states; other types are not
    from planner.costmodel.planner import learned_plan_cost_ms
    from planner.model.tables.shards import data_parallel
    assert learned_plan_cost_ms(task, 4, tw.shardings) == pytest.approx(learned(tw), abs=1e-3)
    assert learned_plan_cost_ms(task, 4, cw.shardings) == pytest.approx(learned(cw), abs=1e-3)
    # the local search starts from those plans and only takes improvements
    assert learned_plan_cost_ms(task, 4, full.shardings) <= learned(cw) + 1e-3
    t0 = model.tables[0]
    dp = (data_parallel(0, t0.name, t0.num_embeddings, t0.embedding_dim, 4),) + tw.shardings[1:]
    assert learned_plan_cost_ms(task, 4, dp) is None


def test_neuroshard_plans_the_same_on_a_machine_ten_times_slower(monkeypatch):
    """Its work is budgeted from the time limit, not cut by the clock. A fake clock that
    advances 1 ms or 10 ms per reading stands for a fast and a slow machine (the search reads
    it once per candidate and per evaluation): the same plan and notes on both, its budget
    spent, no time limit hit. (With fixed counts, the slow clock cut the beam at 3 s.)"""
    import time

    from planner.costmodel.budget import work_budget
    from planner.sharding.planners import get_planner
    model, task = _scaled_task()

    def clock(step_s: float):
        now = [0.0]

        def read() -> float:
            now[0] += step_s
            return now[0]
        return read

    plans = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in (1e-3, 1e-2):
            monkeypatch.setattr(time, "perf_counter", clock(step))
            plans.append(get_planner("neuroshard").plan(task, 4, seed=0, time_limit_s=3))
    fast, slow = plans
    assert slow.shardings == fast.shardings
    assert slow.stats.notes == fast.stats.notes
    assert any("work budget for 3 s is spent" in n for n in slow.stats.notes)
    assert not any("time limit 3 s" in n for n in slow.stats.notes)
    units, evals = work_budget(8.0, model.num_tables, learned_comm=True)
    assert units > 0 and evals > 0
    assert work_budget(16.0, model.num_tables, learned_comm=True)[0] == 2 * units
