"""costmodel train on a small synthetic data set; weights round trip with weights_only."""

from __future__ import annotations

import csv
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from planner.costmodel.datafile import (
    COLUMNS,
    meta_path,  # noqa: E402
)
from planner.costmodel.model import kendall_tau, mape, train  # noqa: E402
from planner.costmodel.weights import HardwareMismatchWarning, load_predictor, save_weights  # noqa: E402,E501
from planner.measure.tables.collect import CollectConfig, hardware_id, hardware_info  # noqa: E402

BATCH = 4096


def _synthetic(path: Path, n: int = 60, comm: int = 12, *, cpu_model=None) -> None:
    rng = np.random.default_rng(0)
    hw = hardware_info(light=True)
    if cpu_model:
        hw["cpu_model"] = cpu_model
    hid = hardware_id(hw)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for i in range(n):
            k = int(rng.integers(1, 6))
            recs, ms = [], 0.3
            for _ in range(k):
                rows, dim = int(rng.integers(100, 20000)), int(rng.choice([4, 16, 64, 128]))
                pool = float(rng.uniform(1, 20))
                bins = rng.dirichlet(np.ones(17))
                recs.append([0, rows, dim, pool] + [round(float(b), 5) for b in bins])
                ms += 2e-6 * BATCH * pool * dim + 1e-5 * math.sqrt(rows * dim)
            for rnd in (0, 1) if i < 5 else (0,):
                noisy = ms * (1 + 0.02 * rng.standard_normal())
                w.writerow(["compute", i, rnd, hid, k, json.dumps(recs), noisy / 3, 2 * noisy / 3,
                            noisy, noisy, "", "", "", ""])
        for i in range(comm):
            sums = [int(x) for x in rng.integers(50, 500, size=2)]
            w.writerow(["comm", i, 0, hid, "", "", "", "", "", "", json.dumps(sums),
                        json.dumps([0.0, 3.0]), json.dumps([1 + s / 100 for s in sums]),
                        json.dumps([0.5 + s / 200 for s in sums])])
    cfg = CollectConfig()
    meta_path(path).write_text(json.dumps({"format": "clusterplan.costmodel-data",
                                           "config": cfg.key(),
                                           "hardware": [dict(hw, id=hid)], "runs": []}))


def test_metrics():
    assert mape([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)


def test_train_reports_metrics_and_weights_round_trip(tmp_path):
    data = tmp_path / "d.csv"
    _synthetic(data)
    res = train(data, epochs=15)
    m = res["metrics"]
    assert m["test"] == 6 and m["train"] == 48
    for key in ("compute_net", "neuroshard_net", "hist_gradient_boosting"):
        assert math.isfinite(m[key]["test_mape"]) and -1 <= m[key]["test_kendall_tau"] <= 1
    assert m["noise_pairs"]["pairs"] == 5
    assert m["comm"]["devices"] == 2 and math.isfinite(m["comm"]["fwd_net"]["test_mape"])
    out = tmp_path / "w.pt"
    save_weights(out, res, data_path=data, command="test")
    state = torch.load(out, weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    meta = json.loads(out.with_suffix(".json").read_text())
    assert meta["metrics"]["samples"] == 60 and len(meta["data_sha256"]) == 64
    with warnings.catch_warnings():
        warnings.simplefilter("error", HardwareMismatchWarning)
        pred = load_predictor(out)
    ms = pred.compute_ms([[[1000, 16, 3.0] + [1.0] + [0.0] * 16], []])
    assert ms[0] > 0 and ms[1] == 0
    # the shipped compute model is the ensemble of 5 nets, and it survives the round trip
    assert meta["architecture"]["compute"]["members"] == 5
    assert len(m["compute_net"]["member_test_mape"]) == 5
    from planner.costmodel.features import table_matrix
    from planner.costmodel.model import predict_compute
    recs = [[1000, 16, 3.0] + [1.0] + [0.0] * 16, [5000, 64, 8.0] + [0.5] * 2 + [0.0] * 15]
    assert pred.compute_ms([recs])[0] == pytest.approx(
        predict_compute(res["compute_net"], [table_matrix(recs, batch=BATCH)])[0], rel=1e-6)
    f, b = pred.comm_ms([100, 200], [0.0, 1.0])
    assert np.all(f > 0) and np.all(b > 0)


def test_loader_warns_on_other_hardware(tmp_path):
    data = tmp_path / "d.csv"
    _synthetic(data, n=20, comm=0, cpu_model="Another CPU 9000")
    res = train(data, epochs=3)
    assert "comm" not in res["metrics"]
    save_weights(tmp_path / "w.pt", res, data_path=data)
    with pytest.warns(HardwareMismatchWarning, match="Another CPU 9000"):
        load_predictor(tmp_path / "w.pt")


def test_cli_train(tmp_path, capsys):
    from planner.cli.main import main
    data = tmp_path / "d.csv"
    _synthetic(data, n=30, comm=0)
    assert main(["costmodel", "train", str(data), "--epochs", "3", "--out",
                 str(tmp_path / "w.pt")]) == 0
    text = capsys.readouterr().out
    assert "held-out MAPE" in text and "HistGradientBoosting" in text and "noise" in text
    assert (tmp_path / "w.pt").exists() and (tmp_path / "w.json").exists()


def test_target_is_median_over_passes_of_fastest_iteration(tmp_path):
    """Three passes: the target is the median of the passes' fastest iterations (a pass in
    which every iteration was slow does not move it); the noise pairs are passes 0 and 1."""
    from planner.costmodel.dataset import load_dataset
    hw = hardware_info(light=True)
    hid = hardware_id(hw)
    data = tmp_path / "d.csv"
    rec = json.dumps([[0, 1000, 16, 3.0, 1.0] + [0.0] * 16])
    with open(data, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for rnd, (med, fastest) in enumerate([(12.0, 10.0), (12.5, 10.4), (16.0, 13.0)]):
            w.writerow(["compute", 0, rnd, hid, 1, rec, med / 3, 2 * med / 3, med, fastest,
                        "", "", "", ""])
    meta_path(data).write_text(json.dumps({"config": CollectConfig().key(),
                                           "hardware": [dict(hw, id=hid)], "runs": []}))
    ds = load_dataset(data)
    assert ds.target == "total_min_ms" and ds.passes == 3
    assert ds.total_ms.tolist() == [10.4]
    assert ds.noise == [(10.0, 10.4)] and ds.noise_alt == [(12.0, 12.5)]
