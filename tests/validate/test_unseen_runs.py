"""A reduced set of the unseen-plan family (issue 22): the plans of one seeded 2-rank table set,
capped small enough for the test run, run for real under TorchRec on gloo and predicted with a
calibration measured here (microbenchmarks only).

The issue's goal for these plans is every one within 25%. The 12-set families of seeds 1 and 2
met it with each plan's median of three rounds (2026-11-27: MAPE 9.3% and 7.7%, 48 of 48,
traces/validate/unseen-seed*.json), seed 1 not in a run of one round (43 of 48), and a run of a
few plans on a shared host moves by up to 30% from one hour to the next, so the tolerance here
(one round) stays an expected failure that reports when it holds. What must hold: every plan's communication equals the
simulator's call for call, and the prediction is timed from the calibration alone."""

from __future__ import annotations

import shutil

import pytest

pytest.importorskip("torchrec")

from simulator.gloo_profile import gloo_profile_from_dict  # noqa: E402

from planner.measure.validate.calibrate import SIZES, GlooCalibration, measure_gloo  # noqa: E402
from planner.measure.validate.lookup_probe import host_mean  # noqa: E402
from planner.measure.validate.unseen import repredict_rows, run_cases  # noqa: E402
from planner.measure.validate.unseen_family import unseen_cases  # noqa: E402
from planner.measure.validate.unseen_report import summarise  # noqa: E402

SEED = 7                      # a seed no model was developed on
TOLERANCE = 0.25


def _reduced_set():
    cases = unseen_cases(6, seed=SEED, max_lookups=600_000, max_bytes=256 * 2 ** 20)
    first = next(c.model.name for c in cases if c.ranks == 2)
    return [c for c in cases if c.model.name == first]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    cases = _reduced_set()
    assert len(cases) >= 4
    # up to 16 MiB, not 256: this set's calls are smaller, and the big sizes take a minute
    small = tuple(s for s in SIZES if s <= 16 * 2 ** 20)
    cal = gloo_profile_from_dict(measure_gloo(GlooCalibration(world=2, rounds=2, sizes=small)),
                                 source="calibrate gloo in this test")
    folder = tmp_path_factory.mktemp("unseen")
    out = run_cases(cases, folder, steps=10, warmup=3, calibrations={2: cal})
    shutil.rmtree(folder, ignore_errors=True)
    return cases, cal, out


@pytest.fixture(scope="module")
def rows(run):
    return run[2]


def test_repredict_reproduces_the_run_predictions(run, tmp_path):
    """``validate unseen --repredict`` predicts recorded plans again through the same path as
    the run: with the same calibration and model, the same seconds, measured times kept."""
    cases, cal, rows = run
    again = repredict_rows(cases, rows, tmp_path, steps=10, warmup=3, calibrations={2: cal})
    assert [(r["set"], r["plan"]) for r in again] == [(r["set"], r["plan"]) for r in rows]
    for old, new in zip(rows, again):
        assert new["predicted_s"] == pytest.approx(old["predicted_s"], rel=1e-9)
        assert new["measured_s"] == old["measured_s"]
        assert new["per_kind"]["compute"]["predicted_s"] == pytest.approx(
            old["per_kind"]["compute"]["predicted_s"], rel=1e-9)
        assert set(new["predicted_parts"]) >= {"emb_fwd", "emb_bwd", "mlp_fwd", "mlp_bwd"}


def test_reduced_unseen_set_runs_and_matches_structure(rows):
    assert len(rows) >= 4 and all("error" not in r for r in rows)
    assert all(r["structure_match"] for r in rows)
    assert all(r["predicted_s"] > 0 and len(r["steps_s"]) == 10 for r in rows)
    assert all(isinstance(r["extrapolated"], list) for r in rows)


def test_each_run_times_the_host_against_the_calibration(run):
    """Every run timed the calibration's lookup probe before its warm-up and after its steps
    (the slowest rank's seconds), and scores its prediction at the host's speed then too."""
    _cases, cal, rows = run
    for r in rows:
        probes = r["host_probe_s"]
        assert len(probes) == 6 and all(1e-4 < x < 1.0 for x in probes)
        assert r["host_speed"] == pytest.approx(host_mean(probes) / cal.lookup["measured_s"])
        assert 0.3 < r["host_speed"] < 3.0          # the same probe on the same host
        assert r["predicted_at_host_s"] == pytest.approx(r["predicted_s"] * r["host_speed"])
    assert "at_host_speed" in summarise(rows)


@pytest.mark.xfail(strict=False, reason="issue 22's 25% per plan: not yet on every family or "
                                        "every hour of a shared host; see the module docstring")
def test_reduced_unseen_set_within_tolerance(rows):
    errs = {f"{r['set']} {r['plan']}": r["predicted_s"] / r["measured_s"] - 1.0 for r in rows}
    assert all(abs(e) <= TOLERANCE for e in errs.values()), (errs, summarise(rows))
