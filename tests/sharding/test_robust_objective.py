"""The expected step cost under the lookup model's own error (``planner/model/tables/robust.py``)
against closed forms, the error read from the fits in use, and ``local_search`` with
``objective=expected``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from simulator.errors import SpecError

from planner.measure.tables.plans import cpu_topology_ref
from planner.model.tables.gpu_lookup import load_gpu_lookup
from planner.model.tables.robust import (DEFAULT_SIGMA, error_factors, expected_step_cost,
                                         sigma_from_mape)
from planner.sharding.common import catalog
from planner.model.tables.task import prepare
from planner.sharding.planners import get_planner



def _comp(fwd, bwd=None, a2a=None):
    fwd = np.asarray(fwd, dtype=float)
    return {"lookup_fwd_s": fwd, "lookup_bwd_s": np.zeros_like(fwd) if bwd is None else
            np.asarray(bwd, dtype=float),
            "output_a2a_fwd_s": np.zeros_like(fwd) if a2a is None else np.asarray(a2a, float)}


def test_one_rank_keeps_its_prediction_and_sigma_zero_is_the_step_cost():
    assert expected_step_cost(_comp([0.010]), 0.12) == pytest.approx(0.010, rel=0.01)
    c = _comp([0.010, 0.007, 0.004], bwd=[0.02, 0.01, 0.03], a2a=[0.001, 0.003, 0.002])
    assert expected_step_cost(c, 0.0) == pytest.approx(0.010 + 0.03 + 0.003, rel=1e-12)


def test_two_tied_ranks_match_the_lognormal_maximum():
    """E[max(X1, X2)] of two iid log-normals of mean m is 2·m·Φ(σ/√2)."""
    for sigma in (0.05, 0.12, 0.3):
        want = 2 * 0.01 * norm.cdf(sigma / math.sqrt(2))
        assert expected_step_cost(_comp([0.01, 0.01]), sigma) == pytest.approx(want, rel=0.02)


def test_ranks_near_the_top_cost_more_than_ranks_far_below():
    """Same predicted maximum; the plan with more ranks near it expects a slower step, and the
    error is shared by a rank's forward and backward (one rank: no gain from the sum)."""
    tied = expected_step_cost(_comp([0.010, 0.0099, 0.0098, 0.0097]), 0.12)
    spread = expected_step_cost(_comp([0.010, 0.007, 0.006, 0.005]), 0.12)
    assert 0.010 < spread < tied
    shared = expected_step_cost(_comp([0.004, 0.004], bwd=[0.006, 0.006]), 0.12)
    assert shared == pytest.approx(expected_step_cost(_comp([0.010, 0.010]), 0.12), rel=1e-9)


def test_sigma_is_the_scale_whose_mean_absolute_error_is_the_mape():
    for mape in (0.05, 0.10, 0.15):
        f = np.exp(sigma_from_mape(mape) * np.random.default_rng(0).standard_normal(400_000))
        assert float(np.mean(np.abs(f - 1))) == pytest.approx(mape, rel=0.06)
    assert sigma_from_mape(None) == DEFAULT_SIGMA
    f = error_factors(8, 0.12)
    assert f.shape[1] == 8 and float(f.mean()) == pytest.approx(1.0, abs=0.01)
    assert np.array_equal(f, error_factors(8, 0.12))          # the same draws every time


def test_the_error_comes_from_the_fit_in_use(make_task):
    gpu = load_gpu_lookup("h200")
    assert gpu.fit_mape == pytest.approx((0.0986 + 0.117) / 2)       # its file's fit blocks
    task = make_task(12, seed=1, devices=4)
    on_cpu = type(task)(model=task.model, topology=cpu_topology_ref(4),
                        memory_bytes=task.memory_bytes)
    cm = catalog(prepare(on_cpu, 4)).cost
    fit = cm.device_profile.fit_mape
    assert fit is not None and 0 < fit < 0.5
    assert cm.lookup_sigma >= sigma_from_mape(fit) - 1e-12
    h200 = type(task)(model=task.model, topology="dgx-h100:gpu=h200,nodes=1",
                      memory_bytes=task.memory_bytes)
    assert catalog(prepare(h200, 4)).cost.lookup_sigma == pytest.approx(
        sigma_from_mape(gpu.fit_mape))


def test_local_search_on_the_expected_cost_never_raises_it(make_task):
    for seed, devices in ((2, 4), (7, 8)):
        task = make_task(24, seed=seed, devices=devices)
        cat = catalog(prepare(task, devices))
        start = get_planner("greedy").plan(task, devices, seed=0)
        plan = get_planner("local_search", objective="expected").plan(task, devices, seed=0)
        assert plan.valid, plan.problems
        f0 = cat.features(cat.choices_of(start.shardings))
        f1 = cat.features(cat.choices_of(plan.shardings))
        assert cat.cost.expected_step_cost(f1) <= cat.cost.expected_step_cost(f0) * (1 + 1e-12)
        assert any(n.startswith("objective: the expected step cost") for n in plan.stats.notes)
        again = get_planner("local_search", objective="expected").plan(task, devices, seed=0)
        assert [s.key() for s in again.shardings] == [s.key() for s in plan.shardings]


def test_bad_objective_or_sigma_is_a_spec_error_and_the_cli_takes_them(tmp_path, capsys):
    with pytest.raises(SpecError, match="objective") as exc:
        get_planner("local_search", objective="fastest")
    assert exc.value.field == "objective"
    with pytest.raises(SpecError) as exc:
        get_planner("local_search", sigma=-1.0)
    assert exc.value.field == "sigma"
    from planner.cli.main import main
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   + "".join(f"t{i},{3000 * (i + 1)},{[8, 16, 64][i % 3]},{1 + i % 7}\n"
                             for i in range(12)))
    code = main(["plan", str(csv), "--devices", "4", "--planner", "local_search",
                 "--planner-set", "objective=expected", "--planner-set", "sigma=0.2", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["valid"]
    assert any("sigma 0.2" in n for n in doc["planner_stats"]["notes"])
    code = main(["plan", str(csv), "--devices", "4", "--planner", "local_search",
                 "--planner-set", "objective=fastest"])
    err = capsys.readouterr().err
    assert code == 2 and "objective" in err and "expected" in err and "Traceback" not in err
