"""``best``: the lowest predicted of our plans, or the incumbent's within the model's error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simulator.errors import SpecError

from planner.measure.tables.plans import cpu_topology_ref
from planner.model.tables.cpu_profile import CPU_PROFILE_PATH, load_cpu_profile
from planner.model.tables.gpu_lookup import load_gpu_lookup
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.best import (CONFIDENCE, BestPlanner, choose, model_resolution,
                                   win_probability)
from planner.sharding.planners import BEST_CANDIDATES, get_planner

REPO = Path(__file__).resolve().parents[2]


def test_choose_keeps_the_incumbent_unless_ours_is_sure_enough():
    costs = {"greedy": 0.93, "local_search": 0.91, "mip": 0.91}
    asked = []

    def p_win(name):
        asked.append(name)
        return 0.8
    assert choose(costs, "torchrec", p_win, 0.9)[0] == "torchrec"
    assert asked == ["local_search"]                     # ties: by name
    assert choose(costs, "torchrec", p_win, 0.8)[0] == "local_search"
    assert choose(costs, None, p_win, 0.99)[0] == "local_search"
    assert choose({}, "torchrec", p_win, 0.9)[0] == "torchrec"
    name, why = choose(costs, "torchrec", p_win, 0.9)
    assert "probability only 0.80" in why and "0.90 asked" in why
    with pytest.raises(ValueError):
        choose({}, None, p_win, 0.9)


def test_win_probability_follows_the_ranks_that_differ(make_task):
    """Two plans that differ on no rank tie (never a win); a plan predicted far faster wins
    at any error; with no error the prediction alone decides; a larger error makes a small
    predicted gain less sure."""
    task = make_task(16, seed=4, devices=4)
    cost = prepare(task, 4).cost
    greedy = get_planner("greedy").plan(task, 4, seed=0)
    rand = get_planner("random").plan(task, 4, seed=0)
    ls = get_planner("local_search").plan(task, 4, seed=0)
    assert win_probability(cost, greedy.shardings, greedy.shardings, 0.1) == 0.0
    assert rand.step_cost_s > 1.3 * greedy.step_cost_s
    assert win_probability(cost, greedy.shardings, rand.shardings, 0.1) > 0.99
    assert win_probability(cost, rand.shardings, greedy.shardings, 0.0) == 0.0
    assert ls.step_cost_s < greedy.step_cost_s
    assert win_probability(cost, ls.shardings, greedy.shardings, 0.0) == 1.0
    small, large = (win_probability(cost, ls.shardings, greedy.shardings, e) for e in (0.02, 0.3))
    assert 0.5 < large < small <= 1.0
    again = win_probability(cost, ls.shardings, greedy.shardings, 0.3)
    assert again == large                                 # seeded: same inputs, same answer


def test_resolution_is_the_lookup_fits_own_error():
    cpu = ShardingTask(model=load_model("criteo-dlrm"), topology=cpu_topology_ref(2))
    err, src = model_resolution(prepare(cpu, 2).cost)
    prof = load_cpu_profile()
    assert prof is not None and err == pytest.approx(prof.fit_error) and 0 < err < 0.5
    assert "lookup fit" in src
    doc = yaml.safe_load((REPO / "traces/calibration/embedding-h200.yaml").read_text())
    want = (doc["fit"]["mape"] + doc["fit_backward"]["mape"]) / 2
    assert load_gpu_lookup("h200").fit_error == pytest.approx(want)
    gpu = ShardingTask(model=load_model("criteo-dlrm"), topology="dgx-h100")
    err, src = model_resolution(prepare(gpu, 8).cost)
    h100 = load_gpu_lookup("h100-sxm")
    assert err == pytest.approx(h100.fit_error) and "h100-sxm" in src


def test_a_bad_fit_error_in_a_profile_names_the_field(tmp_path):
    doc = yaml.safe_load(CPU_PROFILE_PATH.read_text())
    doc["lookup_fit"]["total_mape"] = "ten percent"
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(SpecError) as exc:
        load_cpu_profile(str(bad))
    assert exc.value.field == "lookup_fit.total_mape"


def test_best_keeps_or_leaves_the_incumbent_by_the_confidence(make_task):
    task = make_task(16, seed=4, devices=4)
    greedy = get_planner("greedy").plan(task, 4, seed=0)
    ours = {n: get_planner(n).plan(task, 4, seed=0, time_limit_s=2) for n in BEST_CANDIDATES}
    low = min(ours, key=lambda k: (ours[k].step_cost_s, k))
    assert ours[low].step_cost_s < greedy.step_cost_s   # the task leaves the search room
    cost = prepare(task, 4).cost
    p = win_probability(cost, ours[low].shardings, greedy.shardings,
                        model_resolution(cost)[0], seed=0)
    assert 0.0 < p < 1.0
    kept = get_planner("best", incumbent="greedy", confidence=min(1.0, p + 0.01)).plan(
        task, 4, seed=0, time_limit_s=2)
    assert kept.planner == "best" and kept.shardings == greedy.shardings
    assert any("kept greedy's plan" in n for n in kept.stats.notes)
    left = get_planner("best", incumbent="greedy", confidence=p).plan(
        task, 4, seed=0, time_limit_s=2)
    assert left.shardings == ours[low].shardings and left.valid
    assert any(f"probability {p:.2f}" in n for n in left.stats.notes)


class _Failing:
    name = "failing"

    def plan(self, task, devices, *, seed=0, time_limit_s=None):
        raise SpecError("cannot plan this", source="test", fix="none")


def test_a_planner_that_fails_is_left_out_with_a_note(make_task):
    task = make_task(8, seed=1, devices=2)
    plan = BestPlanner({"greedy": get_planner("greedy")}, ("failing", _Failing())).plan(task, 2)
    assert plan.valid and any(n.startswith("failing: no plan") for n in plan.stats.notes)
    with pytest.raises(SpecError, match="cannot plan this"):
        BestPlanner({"failing": _Failing()}).plan(task, 2)


def test_bad_settings_are_spec_errors():
    with pytest.raises(SpecError) as exc:
        get_planner("best", confidence=1.5)
    assert exc.value.field == "confidence"
    with pytest.raises(SpecError) as exc:
        get_planner("best", incumbent="best")
    assert exc.value.field == "incumbent"


def test_cli_plan_best(tmp_path, capsys, tables_csv):
    from planner.cli.main import main
    csv = tables_csv()
    code = main(["plan", str(csv), "--devices", "4", "--planner", "best",
                 "--planner-set", "incumbent=greedy", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["planner"] == "best" and doc["valid"]
    assert any(n.startswith("best: ") for n in doc["planner_stats"]["notes"])
    for bad, field in (("confidence=2", "confidence"), ("incumbent=nope", "incumbent"),
                       ("confidence=lots", "confidence"), ("margin=0.1", "margin")):
        code = main(["plan", str(csv), "--devices", "4", "--planner", "best",
                     "--planner-set", bad, "--out", str(tmp_path / "p.json")])
        err = capsys.readouterr().err
        assert code == 2 and field in err and "Traceback" not in err
        assert not (tmp_path / "p.json").exists()


def load_model(name):
    from planner.model.tables.spec_file import load_model_spec
    return load_model_spec(name)


def test_best_against_torchrecs_plan(make_task):
    """By default ``best`` keeps TorchRec's own plan unless ours beats it with probability
    :data:`CONFIDENCE` under the lookup fit's error."""
    pytest.importorskip("torchrec")
    task = make_task(20, seed=3, devices=4)
    task = ShardingTask(model=task.model, topology=cpu_topology_ref(4),
                        memory_bytes=task.memory_bytes)
    theirs = get_planner("torchrec").plan(task, 4, seed=0)
    plan = get_planner("best").plan(task, 4, seed=0, time_limit_s=2)
    cost = prepare(task, 4).cost
    error = model_resolution(cost)[0]
    assert plan.valid and error > 0
    if plan.shardings == theirs.shardings:
        assert any("kept torchrec's plan" in n for n in plan.stats.notes)
    else:
        assert plan.step_cost_s < theirs.step_cost_s
        assert win_probability(cost, plan.shardings, theirs.shardings, error) >= CONFIDENCE
