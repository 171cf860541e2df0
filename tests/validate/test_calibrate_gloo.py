"""``clusterplan calibrate gloo`` (issue 10): a real 2-process measurement writes a profile the
simulator loads, with separate reduce-scatter and all-gather tables and the noise beside the
numbers; bad arguments exit 2 before any process starts."""

from __future__ import annotations

import doctest
import statistics
import subprocess
import sys

import pytest

from simulator.gloo_profile import gloo_profile_from_dict

from planner.measure.validate import lookup_probe
from planner.measure.validate.calibrate import GlooCalibration, measure_gloo, measure_gloo_raw
from planner.measure.validate.calibrate_dlrm import lookup_sections, merge_torchrec
from planner.measure.validate.calibrate_profile import profile_from_raw
from planner.measure.validate.calibrate_summary import summary_lines
from planner.measure.validate.dlrm_linear import linear_shapes
from planner.measure.validate.runner import Pool


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli.main", "calibrate", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,field", [(("gloo", "--nproc", "1"), "--nproc"),
                                        (("gloo", "--rounds", "0"), "--rounds"),
                                        ((), "WHAT"),
                                        (("--backend", "nccl"), "--backend")])
def test_bad_arguments_exit_2(args, field):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr


def test_quick_real_calibration_loads_and_is_plausible():
    cfg = GlooCalibration(rounds=1, repeats=3, quick=True, sizes=(4, 4096, 262144, 1048576))
    doc = measure_gloo(cfg)
    prof = gloo_profile_from_dict(doc, source="quick")
    for kind in ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv",
                 "broadcast", "sendrecv"):
        table = prof.comm[(kind, 2)]
        assert len(table.sizes) == 4
        # loopback gloo: tens of µs to tens of ms per call, never faster for more bytes
        assert all(1e-6 < t < 1.0 for t in table.seconds)
        assert list(table.seconds) == sorted(table.seconds)
    assert prof.comm[("reducescatter", 2)] != prof.comm[("allgather", 2)]
    # alltoallv is keyed by the bytes sent to the other rank (its buffer holds twice that)
    assert prof.comm[("alltoallv", 2)].sizes == tuple(float(s) for s in cfg.sizes)
    gf = prof.compute.gpu.peak_flops["fp32"]
    assert 1e9 < gf < 1e12                                     # one core's fp32 matmul
    assert 0 < prof.host_block_s["forward"] < 0.1
    assert doc["noise"]["comm"]["allreduce"]["median"] >= 0
    assert doc["measured"]["processes"] == 2 and "other_cores" in doc["measured"]
    assert [g for g, _ in prof.wake_penalty_s] == sorted(g for g, _ in prof.wake_penalty_s)
    # the uneven all-to-all probe: one size when quick, three exchanges timed, a weight read
    (size, equal, skewed, at_max), = doc["alltoall_uneven"]["points"]
    assert size == 1 << 20 and all(1e-6 < t < 1.0 for t in (equal, skewed, at_max))
    assert prof.alltoall_uneven_weight == doc["alltoall_uneven"]["weight"]
    assert 0.0 <= prof.alltoall_uneven_weight <= 1.0
    # the linear-layer probe: every quick shape's three GEMMs, a table the predictions read
    pts = doc["linear_layers"]["points"]
    assert len(pts) == 3 * len(linear_shapes(quick=True))
    assert all(1e-7 < s < 1.0 for *_, s in pts)
    for p, b, i, o, s in pts[-3:]:
        assert prof.linear.seconds(p, b, i, o) == pytest.approx(s, rel=1e-6)


def test_calibration_runs_spread_over_time_merge_as_rounds():
    """Two one-round runs (as the timing benchmark spreads them between its configurations)
    make one two-round profile: every measured entry between the two runs' own values, the spread
    between them recorded as the noise."""
    cfg = GlooCalibration(rounds=1, repeats=3, quick=True, torchrec=False,
                          sizes=(4, 4096, 262144, 1048576))
    with Pool(2) as pool:
        raws = [measure_gloo_raw(cfg, pool=pool) for _ in range(2)]
    one = [profile_from_raw([r]) for r in raws]
    both = profile_from_raw(raws)
    assert both["measured"]["rounds"] == 2 and both["measured"]["runs"] == 2
    for kind in ("allreduce", "reducescatter"):
        big = [d["comm"][f"{kind}@2"][-1][1] for d in one]
        got = both["comm"][f"{kind}@2"][-1][1]
        assert min(big) * 0.999 <= got <= max(big) * 1.001
    # the peak is the best matmul size's rate: per size the merged rate lies between the runs'
    # rates, but the runs may peak at different sizes, so the merged peak is bounded below by
    # the best size's slower run, not by the slower run's peak
    peaks = [d["compute"]["peak_fp32_flops"] for d in one]
    rates = [{f: r * d["compute"]["peak_fp32_flops"] for f, r in d["compute"]["matmul_fp32"]}
             for d in one]
    floor = max(min(rt[f] for rt in rates) for f in rates[0])
    assert floor * 0.99 <= both["compute"]["peak_fp32_flops"] <= max(peaks) * 1.001
    assert both["noise"]["matmul"]["max"] > 0           # two rounds: a spread exists
    hr = both["noise"]["host_rounds_s"]["swiglu"]["forward"]
    assert len(hr) == 2 and min(hr) <= both["host_block_s"]["forward"] <= max(hr)
    assert both["noise"]["host"]["swiglu"]["forward"] >= 0
    assert all(d["noise"]["matmul"]["max"] == 0 for d in one)
    gloo_profile_from_dict(both, source="merged")


def test_torchrec_probe_sections_merge_as_more_runs():
    sec = lambda t, spread: {"what": "x", "world": 2, "steps": 15, "warmup": 3, "rounds": 1,
                             "probes": [{"sharding_type": "table_wise", "size": "small",
                                         "step_s": t, "runs_s": [t], "spread": spread}]}
    assert merge_torchrec([]) is None
    m = merge_torchrec([sec(0.010, 0.1), sec(0.014, 0.3)])
    assert m["rounds"] == 2
    (p,) = m["probes"]
    assert p["runs_s"] == [0.010, 0.014] and p["step_s"] == pytest.approx(0.012)
    assert p["spread"] == 0.3


def test_lookup_probe_is_recorded_and_scales_the_plans_lookups():
    """The co-running lookup probe lands in the profile per round, and its ratio to the CPU
    embedding profile's prediction multiplies every lookup term of the cost model."""
    from dataclasses import replace as dc_replace

    from planner.measure.tables.plans import cpu_topology_ref
    from planner.measure.validate.dlrm_probes import lookup_scale, predicted_lookup_s
    from planner.measure.validate.lookup_probe import lookup_probe_model, probe_shardings
    from planner.model.tables.cost_config import CostConfig
    from planner.model.tables.plan import evaluate_shardings
    from planner.model.tables.task import ShardingTask, prepare
    cfg = GlooCalibration(rounds=2, repeats=3, quick=True, torchrec=False,
                          sizes=(4, 4096))
    with Pool(2) as pool:
        doc = profile_from_raw([measure_gloo_raw(cfg, pool=pool)])
    lk = doc["lookup"]
    # each round's probe, then two readings per round between stages (quick), averaged
    assert len(lk["rounds_s"]) == 2 and lk["readings_s"][:2] == lk["rounds_s"]
    assert len(lk["readings_s"]) == 6 and lk["statistic"] == "trimmed mean of 6 readings"
    assert lk["measured_s"] == pytest.approx(statistics.fmean(lk["readings_s"]), rel=1e-3)
    assert 1e-4 < lk["measured_s"] < 1.0
    assert "(mean of 6 readings, " in "\n".join(summary_lines(doc))
    # the same probe on each rank alone: how much faster a core runs with the other idle
    ct = doc["contention"]
    assert ct["together_s"] == pytest.approx(statistics.median(lk["rounds_s"]), rel=1e-3)
    assert ct["share_of_core"] == 1.0
    assert 1e-4 < ct["alone_s"] < 1.0
    # all three are rounded to 4 significant figures, each off by up to 5e-4 relative
    assert ct["alone_speedup"] == pytest.approx(max(1.0, ct["together_s"] / ct["alone_s"]),
                                                rel=1.6e-3)
    prof = gloo_profile_from_dict(doc, source="probe")
    assert prof.alone_speedup == ct["alone_speedup"]
    scale = lookup_scale(prof)
    assert scale == pytest.approx(lk["measured_s"] / predicted_lookup_s())
    assert 0.2 < scale < 5                      # the same kernels; only the conditions differ
    assert lookup_scale(dc_replace(prof, lookup=None)) == 1.0
    model = lookup_probe_model()

    def lookups(task_scale):
        problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(2),
                                       cost=CostConfig(lookup_time_scale=task_scale)), 2)
        ev = evaluate_shardings(problem, probe_shardings(model))
        return ev.breakdown_s["lookup_fwd_s"][0], ev.breakdown_s["lookup_bwd_s"][0]
    base, scaled = lookups(1.0), lookups(1.7)
    assert scaled[0] == pytest.approx(1.7 * base[0]) and scaled[1] == pytest.approx(1.7 * base[1])


def test_lookup_sections_average_a_host_that_switches_speed():
    """A host whose cores run the probe at 7 or 11 ms, switching within seconds: the rounds'
    two probes caught the slow state, the readings between stages both; the calibration keeps
    the mean over every reading (slowest rank each), not the rounds' snapshot, and the
    contention ratio from the rounds' alternated pairs alone."""
    fast, slow = 0.007, 0.011
    pairs = [{0: (slow, 0.010), 1: (slow, 0.010)}, {0: (slow - 1e-4, 0.010), 1: (slow, 0.010)}]
    states = [fast, slow, fast, fast, slow, fast, slow, fast, slow]
    series = [{0: states[:5], 1: states[5:]},
              {0: [x - 1e-4 for x in states[:5]], 1: [x - 1e-4 for x in states[5:]]}]
    sec = lookup_sections(pairs, world=2, cores=2, series=series)
    lk = sec["lookup"]
    assert lk["rounds_s"] == [slow, slow]
    assert lk["readings_s"] == [slow, slow] + states
    # 11 readings: the lowest and the highest dropped, the mean of the other nine
    kept = sorted([slow, slow] + states)[1:-1]
    assert lk["measured_s"] == pytest.approx(statistics.fmean(kept), rel=1e-3)
    assert fast < lk["measured_s"] < slow
    assert sec["contention"]["together_s"] == slow
    assert sec["contention"]["alone_speedup"] == pytest.approx(1.1)
    # a calibration made without the series reads as before: the rounds' probes
    assert lookup_sections(pairs, 2, 2)["lookup"]["measured_s"] == slow
    assert doctest.testmod(lookup_probe).failed == 0
