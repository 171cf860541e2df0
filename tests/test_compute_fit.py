"""Efficiency curves fitted to kernel timings reproduce those timings through the roofline."""

import numpy as np
import pandas as pd
import pytest

from planner.cli import main
from simulator.compute import load_compute_profile, op_time
from simulator.compute_fit import profile_from_measurements, read_measurements
from simulator.errors import SpecError
from simulator.hardware import gpu_spec


def _measurements(rng):
    """Timings of an imagined H100: GEMMs at 30-78% of peak, copies at 40-90% of HBM."""
    g = gpu_spec("h100-sxm")
    rows = [{"kind": "launch", "seconds": 4e-6}]
    for flops, eff in [(1e9, 0.30), (1e10, 0.62), (1e11, 0.74), (1e12, 0.78)]:
        for _ in range(5):
            t = 4e-6 + flops / (g.peak("bf16") * eff) * rng.uniform(0.99, 1.01)
            rows.append({"kind": "matmul", "dtype": "bf16", "flops": flops, "seconds": t})
    for nbytes, eff in [(1e6, 0.4), (1e8, 0.85), (1e9, 0.9)]:
        for _ in range(5):
            t = 4e-6 + nbytes / (g.hbm_bandwidth_Bps * eff) * rng.uniform(0.99, 1.01)
            rows.append({"kind": "memory", "bytes": nbytes, "seconds": t})
    return pd.DataFrame(rows)


def test_fitted_profile_reproduces_measured_medians(tmp_path):
    df = _measurements(np.random.default_rng(0))
    csv = tmp_path / "m.csv"
    df.to_csv(csv, index=False)
    out = tmp_path / "h100.yaml"
    assert main(["calibrate", "compute", "--gpu", "h100-sxm", "--measurements", str(csv),
                 "--out", str(out)]) == 0
    prof = load_compute_profile("h100-sxm", out)
    assert prof.launch_overhead_s == pytest.approx(4e-6)
    for (kind, size), g in df[df.kind != "launch"].groupby(["kind", df.flops.fillna(df.bytes)]):
        meas = g.seconds.median()
        pred = op_time(prof, flops=size if kind == "matmul" else 0,
                       bytes_moved=size if kind == "memory" else 0)
        assert pred == pytest.approx(meas, rel=0.01)


def test_faster_than_peak_is_refused():
    df = pd.DataFrame([{"kind": "matmul", "dtype": "bf16", "flops": 1e12, "seconds": 1e-4},
                       {"kind": "memory", "bytes": 1e9, "seconds": 1e-3}])
    with pytest.raises(SpecError, match="catalog peak"):
        profile_from_measurements("h100-sxm", df, source="test")


def test_bad_csv(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("kind,seconds\nwarp,1\n")
    with pytest.raises(SpecError, match="bad.csv"):
        read_measurements(p)
