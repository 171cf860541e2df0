"""The unseen-plan family of ``clusterplan validate unseen``, its summary and the host
calibration cache (no real runs here; the real runs are in test_unseen_runs.py)."""

from __future__ import annotations

import math

import pytest

from simulator.errors import SpecError
from simulator.gloo_profile import _fresh_alloc

from planner.machine import MMAP_THRESHOLD_BYTES
from planner.measure.validate import cache
from planner.measure.validate.calibrate_profile import fresh_section
import planner.measure.validate.unseen as unseen
from planner.measure.validate.unseen import MAX_STEPS, merge_rounds, round_order, steps_for
from planner.measure.validate.unseen_family import (
    DIMS,
    MAX_LOOKUPS,
    MAX_SET_BYTES,
    PLAN_KINDS,
    unseen_cases,
)
from planner.measure.validate.unseen_report import (format_rows, kendall_tau_within,
                                                     measured_apart, summarise)
from planner.model.tables.dense import fresh_alloc_s
from planner.model.tables.shards import ShardingType


@pytest.fixture(scope="module")
def family():
    return unseen_cases(12, seed=0)


def test_family_is_seeded_and_spans_the_issue_ranges(family):
    again = unseen_cases(12, seed=0)
    assert [(c.set_name, c.plan_kind, c.shardings) for c in family] == \
        [(c.set_name, c.plan_kind, c.shardings) for c in again]
    assert len(family) >= 30
    sets = {c.model.name: c for c in family}
    assert len(sets) == 12
    assert {c.ranks for c in family} == {2, 4}
    assert {c.plan_kind for c in family} == set(PLAN_KINDS)
    types = {ts.sharding_type for c in family for ts in c.shardings}
    assert {ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
            ShardingType.DATA_PARALLEL} <= types
    for c in sets.values():
        m = c.model
        assert 4 <= len(m.tables) <= 40
        assert 1024 <= m.batch_size <= 65536 and m.batch_size % (4 * c.ranks) == 0
        assert all(t.embedding_dim in DIMS and 1 <= t.pooling_factor <= 60 for t in m.tables)
        assert all(1000 <= t.num_embeddings <= 10 ** 7 for t in m.tables)
        assert sum(t.weight_bytes for t in m.tables) <= MAX_SET_BYTES + 40 * 1000 * 256 * 4
        assert m.batch_size * sum(t.pooling_factor for t in m.tables) <= MAX_LOOKUPS \
            or m.batch_size <= 1024 * 2
    for c in family:           # FBGEMM's CPU kernel cannot run an empty row shard
        assert all(s.rows > 0 for ts in c.shardings for s in ts.shards)
        assert sorted(ts.table for ts in c.shardings) == list(range(len(c.model.tables)))
    assert unseen_cases(2, seed=1)[0].model != family[0].model


def test_only_sets_keeps_those_sets_as_the_whole_family_draws_them(family):
    """``--only-sets`` measures some sets again: the cases are the whole family's, set by set."""
    picked = unseen_cases(12, seed=0, only={3, 11})
    want = [c for c in family if c.set_name.split()[0] in ("unseen-3", "unseen-11")]
    assert {c.set_name.split()[0] for c in want} == {"unseen-3", "unseen-11"}
    assert picked == want


def test_tau_within_sets_counts_only_pairs_of_one_set():
    rows = [{"set": "a", "predicted_s": 1, "measured_s": 2},
            {"set": "a", "predicted_s": 2, "measured_s": 3},
            {"set": "b", "predicted_s": 5, "measured_s": 1},     # another set: no pair with a
            {"set": "b", "predicted_s": 1, "measured_s": 4}]
    assert kendall_tau_within(rows) == pytest.approx(0.0)      # one concordant, one discordant
    assert kendall_tau_within(rows[:2]) == pytest.approx(1.0)
    assert kendall_tau_within(rows[:1]) is None
    s = summarise(rows[:2])
    assert s["mape"] == pytest.approx((0.5 + 1 / 3) / 2)
    assert s["within_25pct"] == 0 and not s["goals"]["mape_le_15pct"]


def test_tau_over_pairs_measured_apart_leaves_out_overlapping_measurements():
    """Plans whose rounds (or, with one round, steps' quartiles) overlap are measured as ties
    by the host's noise; the second tau keeps the pairs whose measurements do not overlap,
    beside the plain one, which the goal reads."""
    def row(plan, pred, rounds):
        return {"set": "a", "plan": plan, "ranks": 2, "tables": 4, "batch": 1024,
                "predicted_s": pred, "measured_s": min(rounds), "rounds_s": rounds,
                "steps_s": rounds, "structure_match": True}
    fast, near, slow = (row("g", 1.0, [1.00, 1.10]), row("r", 0.9, [1.05, 1.20]),
                        row("c", 2.0, [1.50, 1.60]))
    rows = [fast, near, slow]
    assert not measured_apart(fast, near) and measured_apart(fast, slow)
    assert measured_apart(near, slow)
    assert kendall_tau_within(rows) == pytest.approx(1 / 3)    # g-r discordant, two concordant
    assert kendall_tau_within(rows, apart_only=True) == pytest.approx(1.0)
    s = summarise(rows)
    assert (s["pairs"], s["pairs_apart"], s["kendall_tau_apart"]) == (3, 2, 1.0)
    assert s["kendall_tau_within_sets"] == pytest.approx(1 / 3) and not s["goals"]["tau_ge_0.8"]
    assert "(1.00 over the 2 of 3 pairs measured apart)" in format_rows(rows, s)
    # one round: the steps' quartiles
    one = [{**r, "rounds_s": [r["measured_s"]], "steps_s": [r["measured_s"] * f for f in
                                                              (0.9, 1.0, 1.1, 1.2)]}
           for r in (fast, slow)]
    assert measured_apart(*one)
    assert not measured_apart(one[0], {**one[0], "plan": "x"})


def test_calibration_is_cached_per_host_and_world(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERPLAN_CACHE", str(tmp_path))
    assert cache.host_fingerprint(2) == cache.host_fingerprint(2) != cache.host_fingerprint(4)
    calls = []

    def measure(world):
        calls.append(world)
        return {"format": "clusterplan.gloo-profile", "world": world}
    path, fresh = cache.cached_calibration(2, measure=measure)
    assert fresh and path.parent == tmp_path and path.is_file()
    again, fresh2 = cache.cached_calibration(2, measure=measure)
    assert again == path and not fresh2 and calls == [2]
    with pytest.raises(FileNotFoundError):
        cache.cached_calibration(4)
    with pytest.raises(FileNotFoundError):          # one per heap policy too
        cache.cached_calibration(2, heap="system")


def test_fresh_allocation_section_and_cost():
    def rank(extra):
        rows = [(16.0 * 2 ** 20, 1e-3, 1e-3), (64.0 * 2 ** 20, 1e-3 + extra, 1e-3)]
        return {"compute": {0: {"fresh": rows}, 1: {"fresh": rows}}}
    sec = fresh_section([rank(0.02), rank(0.025)], rounds=2)
    assert sec["threshold_bytes"] == MMAP_THRESHOLD_BYTES
    assert sec["points"][0][1] == 0.0
    assert sec["Bps"] == pytest.approx(64 * 2 ** 20 / 0.025, rel=1e-3)
    fresh = _fresh_alloc(sec, "p.yaml")
    assert fresh_alloc_s(16 * 2 ** 20, fresh) == 0.0
    assert fresh_alloc_s(64 * 2 ** 20, fresh) == pytest.approx(0.025, rel=1e-3)
    assert _fresh_alloc({"Bps": None}, "p.yaml") is None
    with pytest.raises(SpecError) as e:
        _fresh_alloc({"threshold_bytes": 1, "Bps": -3}, "p.yaml")
    assert e.value.field == "fresh_alloc"


def test_cli_refuses_bad_family_arguments(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    for args, field in ((["--sets", "0"], "--sets"), (["--steps", "0"], "--steps"),
                        (["--rounds", "0"], "--rounds"),
                        (["--min-seconds", "-1"], "--min-seconds"),
                        (["--sets", "3", "--only-sets", "3"], "--only-sets"),
                        (["--only-sets", "1,x"], "--only-sets"),
                        (["--out", str(tmp_path / "missing" / "x.json")], "--out")):
        r = subprocess.run([sys.executable, "-m", "planner.cli", "validate", "unseen", *args],
                           capture_output=True, text=True, cwd=repo, timeout=120)
        assert r.returncode == 2, r.stderr
        assert field in r.stderr and "Traceback" not in r.stderr


def test_unwritable_cache_folder_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """The host calibrations go to the cache folder; one that cannot be made exits 2 naming
    it, before anything is measured."""
    from planner.cli.main import main
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLUSTERPLAN_CACHE", str(blocker / "cache"))
    assert main(["calibrate", "embedding", "--kernel-points", "9", "--worlds", "2"]) == 2
    err = capsys.readouterr().err
    assert "CLUSTERPLAN_CACHE" in err and "Traceback" not in err
    with pytest.raises(SpecError, match="calibration cache folder"):
        cache.store_calibration({"format": "clusterplan.gloo-profile"}, 2)


def test_repredict_refuses_a_missing_file_or_another_kind_of_host(tmp_path):
    """``--repredict`` names the file and field, exit 2, before any calibration is measured."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"seed": 0, "sets": 1, "steps": 10, "warmup": 3, "rows": [],
                                 "machine": {"cpu_model": "a CPU this host is not"}}))
    bad = tmp_path / "bad.json"
    bad.write_text('{"seed": 0}')
    for path, field in ((tmp_path / "missing.json", "--repredict"), (bad, "--repredict"),
                        (other, "machine.cpu_model")):
        r = subprocess.run([sys.executable, "-m", "planner.cli", "validate", "unseen",
                            "--repredict", str(path)], capture_output=True, text=True,
                           cwd=repo, timeout=120)
        assert r.returncode == 2, r.stderr
        assert field in r.stderr and str(path) in r.stderr and "Traceback" not in r.stderr


def test_extrapolated_plans_are_marked_and_their_calls_listed_once():
    note = "allgather of up to 80.0 MB on 4 processes: above ..."
    rows = [{"set": "s", "plan": p, "ranks": 4, "tables": 3, "batch": 64, "predicted_s": 1.0,
             "measured_s": 1.1, "structure_match": True, "extrapolated": ex}
            for p, ex in (("a", [note]), ("b", [note]), ("c", []))]
    s = summarise(rows)
    assert s["extrapolated"] == 2
    text = format_rows(rows, s)
    lines = text.splitlines()
    assert [ln.endswith("extrapolated (*)") for ln in lines[1:4]] == [True, True, False]
    assert lines.count(f"(*) extrapolated: {note}") == 1
    assert "2 plan(s) extrapolated (*)" in text


def test_rounds_pool_every_step_or_keep_the_median_round():
    """Several rounds: a plan is measured by the median of all its rounds' steps (the default),
    or by its median round (the lower middle of an even count); a plan failed once is failed."""
    def row(plan, measured, steps, **kw):
        return {"set": "s", "plan": plan, "predicted_s": 1.0, "measured_s": measured,
                "steps_s": steps, **kw}
    rounds = [[row("a", 3.0, [3.0, 3.2, 2.9]), row("b", 1.0, [1.0])],
              [row("a", 1.0, [1.0, 1.1, 0.9]), row("b", 2.0, [2.0]), ],
              [row("a", 2.0, [2.0, 2.1, 1.9]), {"set": "s", "plan": "b", "error": "boom"}]]
    a, b = merge_rounds(rounds, "round")
    assert a["measured_s"] == 2.0 and a["rounds_s"] == [3.0, 1.0, 2.0]
    assert a["steps_s"] == [3.0, 3.2, 2.9, 1.0, 1.1, 0.9, 2.0, 2.1, 1.9]
    assert b == {"set": "s", "plan": "b", "error": "boom"}       # failed once: failed
    two = merge_rounds(rounds[:2], "round")                       # even: the lower middle
    assert [r["measured_s"] for r in two] == [1.0, 1.0]
    assert merge_rounds(rounds[:1]) == rounds[0]
    pooled = merge_rounds(rounds[:2])                            # the default: every step
    assert [r["measured_s"] for r in pooled] == [pytest.approx(2.0), pytest.approx(1.5)]
    assert pooled[0]["measured"] == "steps" and pooled[0]["rounds_s"] == [3.0, 1.0]
    with pytest.raises(ValueError, match="measured"):
        merge_rounds(rounds, "mean")


def test_alternate_rounds_run_each_set_reversed_and_merge_each_plan_with_itself(
        family, monkeypatch):
    """``order="alternate"``: every odd round runs each set's plans in reverse, sets in the
    family's order; each round's rows still merge with the same plan's rows of the other
    rounds, and come back in the family's order. ``"fixed"`` runs every round alike;
    ``"interleaved"`` (the default) orders them as ``"alternate"`` and runs each set's plans
    side by side, each in turns of about a second of its predicted steps."""
    ran, paired = [], []

    def fake_round(cases, folder, **kw):
        ran.append([(c.set_name, c.plan_kind) for c in cases])
        paired.append(kw["blocks"])
        return [{"set": c.set_name, "plan": c.plan_kind, "predicted_s": 1.0,
                 "measured_s": 1.0 + len(ran) + i / 100, "steps_s": [1.0 + len(ran) + i / 100]}
                for i, c in enumerate(cases)]
    monkeypatch.setattr(unseen, "_run_round", fake_round)
    keys = [(c.set_name, c.plan_kind) for c in family]
    cals = {2: None, 4: None}
    rows = unseen.run_cases(family, None, steps=1, warmup=0, calibrations=cals, rounds=3,
                            order="alternate")
    assert ran[0] == ran[2] == keys and ran[1] != keys and paired == [None] * 3
    assert sorted(ran[1]) == sorted(keys)
    for name in dict.fromkeys(s for s, _ in keys):
        first = [k for k in keys if k[0] == name]
        assert [k for k in ran[1] if k[0] == name] == first[::-1]
    assert [(r["set"], r["plan"]) for r in rows] == keys
    for r, key in zip(rows, keys):                  # each round's time is this plan's own
        assert r["rounds_s"] == [1.0 + k + ran[k - 1].index(key) / 100 for k in (1, 2, 3)]
    ran.clear()
    unseen.run_cases(family, None, steps=1, warmup=0, calibrations=cals, rounds=2,
                     order="fixed")
    assert ran == [keys, keys]
    assert round_order(family, 1, "fixed") == list(family)
    ran.clear()
    paired.clear()
    step_s = {k: 0.05 * (1 + i) for i, k in enumerate(keys)}     # predicted, seconds
    monkeypatch.setattr(unseen, "_predicted_step_s",
                        lambda c, *a: step_s[(c.set_name, c.plan_kind)])
    unseen.run_cases(family, None, steps=1, warmup=0, calibrations=cals, rounds=2,
                     min_seconds=3.0)
    # a turn of about 1 s of steps, at most the plan's measured steps (3 s of them)
    expect = {k: min(math.ceil(1.0 / t), math.ceil(3.0 / t)) for k, t in step_s.items()}
    assert paired == [expect, expect] and ran[0] == keys
    assert expect[keys[0]] == 20 and expect[keys[-1]] < 20
    assert ran[1] == [(c.set_name, c.plan_kind) for c in round_order(family, 1)]
    with pytest.raises(ValueError, match="order"):
        round_order(family, 0, "shuffled")


def test_round_order_doctest():
    import doctest
    assert doctest.testmod(unseen).failed == 0


def test_host_speed_rescales_the_predictions_beside_the_plain_ones():
    """A run that timed the host probe is also scored at the host's speed then: each
    prediction times the probe's time over the calibration's, in its own columns and summary,
    and the plain prediction's errors stay as they were."""
    from types import SimpleNamespace

    from planner.measure.validate.dlrm_probes import at_host as _at_host
    from planner.measure.validate.dlrm_probes import host_speed

    cal = SimpleNamespace(lookup={"measured_s": 0.010})
    assert host_speed(cal, 0.012) == pytest.approx(1.2)
    assert host_speed(SimpleNamespace(lookup=None), 0.012) is None
    assert host_speed(cal, None) is None and _at_host(1.0, [], cal) == {}
    at = _at_host(2.0, [0.011, 0.013, 0.012, 0.02, 0.01], cal)      # the probes' mean
    assert at["host_speed"] == pytest.approx(1.32)
    assert at["predicted_at_host_s"] == pytest.approx(2.64)

    def row(plan, predicted, measured, probe):
        return {"set": "s", "plan": plan, "ranks": 2, "tables": 3, "batch": 64,
                "predicted_s": predicted, "measured_s": measured, "structure_match": True,
                "extrapolated": [], **_at_host(predicted, [probe, probe], cal)}
    # the host ran 1.3x and 1.1x slower than calibrated; the plain model was right up to that
    rows = [row("a", 1.0, 1.3, 0.013), row("b", 2.0, 2.2, 0.011)]
    s = summarise(rows)
    assert s["mape"] == pytest.approx(((1 - 1 / 1.3) + (1 - 2 / 2.2)) / 2)
    assert s["at_host_speed"]["mape"] == pytest.approx(0.0, abs=1e-12)
    assert all(s["at_host_speed"]["goals"].values())
    assert s["host_speed"] == pytest.approx([1.1, 1.2, 1.3])
    text = format_rows(rows, s)
    assert text.splitlines()[1].split()[-2:] in (["1.30", "+0.0%"], ["1.30", "-0.0%"])
    assert "predicted at the host's speed during each run" in text
    assert "1.20x its calibrated time (slower" in text and "calibrate gloo" in text
    # a row without a probe (an older run) leaves the host-speed summary out
    plain = summarise([rows[0], {k: v for k, v in rows[1].items() if "host" not in k}])
    assert "at_host_speed" not in plain and "'at host'" not in format_rows(rows, plain)
    slower = {**rows[0], "measured_s": 1.5, "steps_s": [1.5],
              **_at_host(1.0, [0.015, 0.015], cal)}
    merged = merge_rounds([[{**rows[0], "steps_s": [1.3]}], [slower]])
    assert merged[0]["rounds_host_speed"] == pytest.approx([1.3, 1.5])
    assert merged[0]["host_speed"] == pytest.approx(1.4)              # over every step: mean
    assert merged[0]["predicted_at_host_s"] == pytest.approx(1.4)
    assert merged[0]["host_probe_s"] == [0.013, 0.013, 0.015, 0.015]
    kept = merge_rounds([[{**rows[0], "steps_s": [1.3]}], [slower]], "round")
    assert kept[0]["host_speed"] == pytest.approx(1.3)                # the kept round's


def test_a_plan_predicted_short_gets_enough_steps_to_fill_the_minimum(family, tmp_path):
    """``--min-seconds``: ``ceil(S / predicted step)`` steps when that is above ``--steps``,
    never above :data:`MAX_STEPS`; 0 keeps ``--steps``. Timed by the uncalibrated model."""
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import predicted
    from planner.measure.validate.unseen_family import write_case
    case = min((c for c in family if c.ranks == 2), key=lambda c: c.model.batch_size)
    cfg = load_dlrm_config(str(write_case(case, tmp_path)), nproc=2, steps=10, warmup=3)
    step_s = predicted(cfg, 3, None)["step_time_s"]
    assert steps_for(case, tmp_path, 10, 3, None, 0.0) == 10
    assert steps_for(case, tmp_path, 10, 3, None, 1e-9) == 10
    assert steps_for(case, tmp_path, 10, 3, None, 40 * step_s * (1 - 1e-9)) == 40
    assert steps_for(case, tmp_path, 10, 3, None, 1e6) == MAX_STEPS
    assert steps_for(case, tmp_path, 150, 3, None, 1e6) == 150


def test_repredict_takes_the_plan_a_row_recorded(family, tmp_path):
    """A run records each plan's layout, and a re-prediction predicts that plan: a greedy plan
    made with another CPU profile than the run's is still the plan measured. Rows of older
    runs (no layout) take the seed's plan and say so; a layout that is not a plan of the set's
    tables is a clear error naming the field."""
    from dataclasses import replace

    from planner.measure.validate.unseen import repredict_rows
    from planner.measure.validate.unseen_family import layout_record, with_layout
    case = next(c for c in family if c.ranks == 2 and c.plan_kind == "greedy"
                and all(ts.sharding_type == ShardingType.TABLE_WISE for ts in c.shardings))
    assert with_layout(case, layout_record(case.shardings), source="f",
                       field="x").shardings == case.shardings
    first = case.shardings[0]
    moved = replace(first, shards=(replace(first.shards[0], rank=1 - first.shards[0].rank),))
    other = replace(case, shardings=(moved,) + case.shardings[1:])
    row = {"set": case.set_name, "plan": case.plan_kind, "predicted_s": 1.0, "measured_s": 1.0,
           "per_kind": {}}

    def again(rows):
        return repredict_rows([case], rows, tmp_path, steps=10, warmup=3,
                              calibrations={2: None}, source="run.json")
    rec, seed = again([{**row, "layout": layout_record(other.shardings)}, row])
    direct_other = repredict_rows([other], [row], tmp_path, steps=10, warmup=3,
                                  calibrations={2: None})[0]
    assert (rec["plan_layout"], seed["plan_layout"]) == ("recorded", "rebuilt")
    assert rec["predicted_s"] == pytest.approx(direct_other["predicted_s"], rel=1e-12)
    assert rec["predicted_s"] != pytest.approx(seed["predicted_s"], rel=1e-3)
    with pytest.raises(SpecError, match="each of the") as e:
        again([{**row, "layout": layout_record(case.shardings[1:])}])
    assert (e.value.source, e.value.field) == ("run.json", "rows[0].layout")
