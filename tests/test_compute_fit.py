"""Efficiency curves fitted to kernel timings reproduce those timings through the roofline."""

import numpy as np
import pandas as pd
import pytest

from simulator.compute import load_compute_profile, op_time
from simulator.errors import SpecError
from simulator.hardware import gpu_spec

from planner.cli.main import main
from planner.measure.compute.fit import profile_from_measurements, read_measurements


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


def test_attention_rows_give_their_own_curves_from_several_files(tmp_path):
    """Flash-attention rows (a second CSV) fit curves of their own; GEMMs keep theirs."""
    g = gpu_spec("h100-sxm")
    base = _measurements(np.random.default_rng(1))
    att = pd.DataFrame(
        [{"kind": k, "dtype": "bf16", "flops": f * m, "seconds": 4e-6 + f * m / (g.peak("bf16") * e)}
         for f, e_f, e_b in [(1e10, 0.2, 0.15), (1e11, 0.3, 0.25)]
         for k, m, e in (("attention", 1.0, e_f), ("attention_backward", 2.5, e_b))])
    a, b = tmp_path / "k.csv", tmp_path / "att.csv"
    base.to_csv(a, index=False)
    att.to_csv(b, index=False)
    out = tmp_path / "h100.yaml"
    assert main(["calibrate", "compute", "--gpu", "h100-sxm", "--measurements", str(a), str(b),
                 "--out", str(out)]) == 0
    prof = load_compute_profile("h100-sxm", out)
    for _, r in att.iterrows():
        assert op_time(prof, flops=r.flops, bytes_moved=0, kind=r.kind) == \
            pytest.approx(r.seconds, rel=0.01)
    # a GEMM of the same size is charged the (faster) matmul curve
    assert op_time(prof, flops=1e11, bytes_moved=0) < 0.5 * att.seconds.iloc[2]


def test_cache_resident_copies_are_dropped_only_when_asked():
    df = _measurements(np.random.default_rng(2))
    fast = pd.DataFrame([{"kind": "memory", "bytes": 1e7,
                          "seconds": 4e-6 + 1e7 / (2.0 * gpu_spec("h100-sxm").hbm_bandwidth_Bps)}])
    df = pd.concat([df, fast], ignore_index=True)
    with pytest.raises(SpecError, match="catalog peak"):
        profile_from_measurements("h100-sxm", df, source="test")
    prof = profile_from_measurements("h100-sxm", df, source="test", drop_cache_resident=True)
    assert "1 memory rows faster than HBM" in prof["source"]
    assert all(size != 1e7 for size, _ in prof["memory"])
