"""Roofline op times, efficiency curves and the efficiency files."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from simulator.compute import ComputeProfile, achieved_flops, load_compute_profile, op_time, \
    op_times
from simulator.efficiency import EfficiencyCurve, monotone_time_points
from simulator.errors import SpecError
from simulator.hardware import gpu_names, gpu_spec


@pytest.fixture(scope="module")
def h100():
    return load_compute_profile("h100-sxm")


def flat_profile(eff: float = 0.5, launch: float = 1e-6) -> ComputeProfile:
    return ComputeProfile(gpu=gpu_spec("h100-sxm"), matmul={"bf16": EfficiencyCurve.constant(eff)},
                          memory=EfficiencyCurve.constant(eff), launch_overhead_s=launch,
                          source="test")


# --- curves -------------------------------------------------------------------------------

def test_curve_at_between_and_beyond_points():
    c = EfficiencyCurve(points=[[1e3, 0.2], [1e5, 0.6], [1e6, 0.9]])
    assert c(1e3) == pytest.approx(0.2) and c(1e5) == pytest.approx(0.6)
    assert c(1e6) == pytest.approx(0.9)
    assert c(1e4) == pytest.approx(0.4)            # halfway in log10 between 1e3 and 1e5
    assert c(10**5.5) == pytest.approx(0.75)
    assert c(1.0) == c(0.0) == pytest.approx(0.2)  # clamped below
    assert c(1e12) == pytest.approx(0.9)           # clamped above
    sizes = np.array([0.0, 1e3, 1e4, 10**5.5, 1e12])
    np.testing.assert_allclose(c.many(sizes), [c(s) for s in sizes])


@pytest.mark.parametrize("points", [
    [[1e3, 0.0]], [[1e3, 1.2]], [[1e3, -0.1]], [[-5, 0.5]], [[0, 0.5]],
    [[1e5, 0.5], [1e3, 0.6]], [[1e3, 0.5], [1e3, 0.6]], [], [[1e3]], [["big", 0.5]],
    [[math.nan, 0.5]], "fast",
])
def test_bad_curves_raise(points):
    with pytest.raises(SpecError):
        EfficiencyCurve(points=points)


def test_curve_may_not_rise_faster_than_size():
    steep = [[1e8, 0.1], [1e9, 0.6], [1e11, 0.9]]   # a step: a 1 GFLOP op beats a 0.5 GFLOP one
    with pytest.raises(SpecError, match="faster than the size grows"):
        EfficiencyCurve(points=steep)
    fixed = monotone_time_points(steep)
    assert fixed[1:] == [[1e9, 0.6], [1e11, 0.9]] and fixed[0][1] > 0.1
    c = EfficiencyCurve(points=fixed)
    sizes = np.logspace(7, 12, 500)
    times = sizes / c.many(sizes)
    assert np.all(np.diff(times) >= -1e-9 * times[1:])


def test_curve_error_is_located():
    with pytest.raises(SpecError) as info:
        EfficiencyCurve.from_points([[1e3, 0.5], [1e4, 1.5]], source="f.yaml", field="memory")
    assert info.value.source == "f.yaml" and info.value.field == "memory[1][1]"


# --- op_time --------------------------------------------------------------------------------

def test_big_gemm_is_compute_bound(h100):
    n = 8192
    flops, nbytes = 2.0 * n**3, 3 * 2.0 * n * n
    t = op_time(h100, flops=flops, bytes_moved=nbytes)
    ideal = flops / (h100.gpu.peak("bf16") * h100.matmul["bf16"](flops))
    assert t == pytest.approx(ideal, rel=0.01)
    # the shipped H100 file is measured: the model reproduces the timed 8192³ bf16 GEMM
    import pandas as pd
    rows = pd.read_csv(Path(__file__).parents[1] / "traces/measured/h100-sxm/kernels_graph.csv")
    row = rows[(rows["shape"] == "8192x8192x8192") & (rows["dtype"] == "bf16")].iloc[0]
    assert t == pytest.approx(row.seconds, rel=0.10)
    assert 0.6 <= h100.matmul["bf16"](flops) <= 0.8        # cuBLAS on H100: ~70% of dense peak
    assert achieved_flops(h100, flops, nbytes) == pytest.approx(flops / t)


def test_elementwise_op_is_memory_bound(h100):
    n = 64 * 2**20                                  # 64 Mi elements of bf16, read 2, write 1
    flops, nbytes = float(n), 3 * 2.0 * n
    t = op_time(h100, flops=flops, bytes_moved=nbytes)
    memory = nbytes / (h100.gpu.hbm_bandwidth_Bps * h100.memory(nbytes))
    assert t == pytest.approx(h100.launch_overhead_s + memory)
    assert 0.8 <= h100.memory(nbytes) <= 0.95


def test_empty_op_costs_nothing_and_tiny_op_costs_a_launch(h100):
    assert op_time(h100, flops=0, bytes_moved=0) == 0.0
    assert op_time(h100, flops=1, bytes_moved=0) >= h100.launch_overhead_s > 0


def test_op_time_is_monotone_in_flops(h100):
    flops = np.logspace(3, 14, 200)
    times = [op_time(h100, flops=f, bytes_moved=1e6) for f in flops]
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_vectorised_matches_scalar(h100):
    rng = np.random.default_rng(1)
    flops = np.concatenate([[0, 0, 1e9], 10 ** rng.uniform(3, 13, 50)])
    nbytes = np.concatenate([[0, 1e6, 0], 10 ** rng.uniform(3, 10, 50)])
    vec = op_times(h100, flops, nbytes, "bf16")
    ref = [op_time(h100, flops=f, bytes_moved=b) for f, b in zip(flops, nbytes)]
    np.testing.assert_allclose(vec, ref, rtol=1e-12)
    assert vec[0] == 0.0


def test_flat_profile_arithmetic():
    p = flat_profile(eff=0.5, launch=1e-6)
    t = op_time(p, flops=989.4e12, bytes_moved=0)
    assert t == pytest.approx(1e-6 + 2.0)


def test_op_time_rejects_negative_and_unknown_dtype(h100):
    with pytest.raises(SpecError):
        op_time(h100, flops=-1, bytes_moved=0)
    with pytest.raises(SpecError):
        op_times(h100, np.array([1.0]), np.array([-1.0]))
    with pytest.raises(SpecError, match="int4"):
        op_time(h100, flops=1e9, bytes_moved=0, dtype="int4")
    cpu = load_compute_profile("cpu")
    with pytest.raises(SpecError, match="'bf16'"):
        op_time(cpu, flops=1e9, bytes_moved=0, dtype="bf16")
    assert op_time(cpu, flops=0, bytes_moved=1e6, dtype="bf16") > 0  # dtype unused


# --- files ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", gpu_names())
def test_every_catalog_gpu_has_a_profile(name):
    p = load_compute_profile(name)
    assert p.gpu.name == name and p.source and 0 <= p.launch_overhead_s < 1e-3
    assert set(p.matmul) <= set(p.gpu.peak_flops)
    if name != "cpu":
        assert set(p.matmul) == set(p.gpu.peak_flops)
        assert 5e-7 <= p.launch_overhead_s <= 1e-5   # GPU-side per-kernel cost (measured ~1 µs)


def test_cpu_profile_is_measured():
    p = load_compute_profile("cpu")
    assert "fp32" in p.matmul and "Measured" in p.source
    assert max(e for _, e in p.matmul["fp32"].points) == 1.0
    assert max(e for _, e in p.memory.points) == 1.0


def test_profile_for_a_spec_with_an_explicit_path(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text("gpu: h100-sxm\nsource: test\nlaunch_overhead: 3 us\n"
                 "matmul: {bf16: [[1e9, 0.5], [1e11, 0.8]]}\nmemory: [[1e6, 0.5]]\n")
    p = load_compute_profile(gpu_spec("h100-sxm"), f)
    assert p.launch_overhead_s == pytest.approx(3e-6) and p.matmul["bf16"](1e10) == 0.65


def test_custom_gpu_gets_a_labelled_generic_prior():
    from simulator.hardware import gpu_spec_from_dict
    spec = gpu_spec_from_dict("half-h100", {"peak_flops": {"bf16": 494.7e12},
                                            "hbm_bytes": "40 GB", "hbm_bandwidth": "1.675 TB/s"},
                              source="topo.yaml")
    p = load_compute_profile(spec)
    h = load_compute_profile("h100-sxm")
    assert "generic prior" in p.source and p.launch_overhead_s == h.launch_overhead_s
    # the same efficiency at half the FLOPs, hence the same duration at half the peak
    assert p.matmul["bf16"](0.5e10) == pytest.approx(h.matmul["bf16"](1e10))
    for f in (1e8, 1e10, 1e12):
        assert op_time(p, flops=f / 2, bytes_moved=0) == pytest.approx(
            op_time(h, flops=f, bytes_moved=0))
    assert load_compute_profile(gpu_spec("h100-sxm")) is h   # catalog specs use the cache


@pytest.mark.parametrize("text, field", [
    ("gpu: h100-sxm\nsource: s\nlaunch_overhead: 5 us\nmatmul: {bf16: [[1e9, 1.5]]}\n"
     "memory: [[1e6, 0.5]]\n", "matmul.bf16[0][1]"),
    ("gpu: h100-sxm\nsource: s\nlaunch_overhead: 5 parsecs\nmatmul: {bf16: [[1e9, 0.5]]}\n"
     "memory: [[1e6, 0.5]]\n", "launch_overhead"),
    ("gpu: h100-sxm\nsource: s\nlaunch_overhead: 5 us\nmatmul: {bf16: [[1e9, 0.5]]}\n",
     "memory"),
    ("gpu: a100-80gb\nsource: s\nlaunch_overhead: 5 us\nmatmul: {bf16: [[1e9, 0.5]]}\n"
     "memory: [[1e6, 0.5]]\n", "gpu"),
    ("gpu: h100-sxm\nsource: s\nlaunch_overhead: 5 us\nmatmul: {fp4: [[1e9, 0.5]]}\n"
     "memory: [[1e6, 0.5]]\n", "matmul.fp4"),
    ("gpu: h100-sxm\nsource: s\nlaunch_overhed: 5 us\nmatmul: {bf16: [[1e9, 0.5]]}\n"
     "memory: [[1e6, 0.5]]\n", "launch_overhed"),
    ("gpu: h100-sxm\nsource: s\nlaunch_overhead: 5 us\nmatmul: {bf16: [[1e9, 0.5]]}\n"
     "memory: [[1e6, 0.5], [1e5, 0.6]]\n", "memory[1][0]"),
])
def test_malformed_profile_names_file_and_field(tmp_path, text, field):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        load_compute_profile("h100-sxm", f)
    assert info.value.source == str(f) and info.value.field == field
    assert str(f) in str(info.value)


def test_unparseable_and_missing_files(tmp_path):
    f = tmp_path / "broken.yaml"
    f.write_text("gpu: [unclosed\n")
    with pytest.raises(SpecError) as info:
        load_compute_profile("h100-sxm", f)
    assert info.value.source == str(f)
    with pytest.raises(SpecError, match="no compute-efficiency file"):
        load_compute_profile("h100-sxm", tmp_path / "absent.yaml")


def test_cpu_calibration_writes_a_loadable_profile(tmp_path):
    from planner.measure.compute.cpu import measure_cpu_profile
    from planner.measure.compute.cpu_profile_file import write_profile
    prof = measure_cpu_profile(sizes=(16, 32), array_bytes=(4096, 65536), repeats=2,
                               single_thread=False, min_sample_s=1e-4, warm_up_s=0.0,
                               date="2026-11-22")
    assert prof["measured"]["date"] == "2026-11-22" and prof["measured"]["machine"]["cpu_count"]
    path = write_profile(prof, tmp_path / "cpu.yaml")
    p = load_compute_profile("cpu", path)
    assert max(e for _, e in p.matmul["fp32"].points) == 1.0
    assert max(e for _, e in p.memory.points) == 1.0


def test_op_time_reads_the_memory_curve_at_the_working_set(h100):
    """An op on a slice of a larger pass streams at the pass's rate, not the slice's."""
    small, walked = 2.0 ** 20, 2.0 ** 30
    hot = op_time(h100, flops=0.0, bytes_moved=small)
    cold = op_time(h100, flops=0.0, bytes_moved=small, working_set=walked)
    bw = h100.gpu.hbm_bandwidth_Bps
    assert hot == pytest.approx(h100.launch_overhead_s + small / (bw * h100.memory(small)))
    assert cold == pytest.approx(h100.launch_overhead_s + small / (bw * h100.memory(walked)))
    assert op_time(h100, flops=0.0, bytes_moved=small, working_set=1.0) == hot   # never below
