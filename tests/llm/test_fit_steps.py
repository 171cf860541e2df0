"""The A100 profile fitted to vTrain's single-node steps: split, fit machinery, shipped file."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.compute import load_compute_profile, op_time

from planner.cli.main import main
from planner.llm.fidelity import load_set
from planner.measure.compute import fit_steps as fs
from planner.model.llm.host import host_file_for, load_host_overhead

VTRAIN = Path(__file__).resolve().parents[3] / "shared" / "data" / "vtrain"


@pytest.fixture(scope="module")
def rows():
    if not (VTRAIN / "ground_truth_single.csv").exists():
        pytest.skip(f"vTrain data not found in {VTRAIN}")
    return load_set("vtrain-single", vtrain_dir=VTRAIN)


def test_split_is_fixed_by_the_rows_and_holds_out_a_fifth(rows):
    train, test = fs.split(rows)
    assert len(train) + len(test) == len(rows) == 1440
    assert 0.15 < len(test) / len(rows) < 0.25
    keys = lambda rs: {(r["group"], r["row"]) for r in rs}          # noqa: E731
    assert not keys(train) & keys(test)
    # the same rows in another order split the same way: nothing is drawn
    train2, test2 = fs.split(list(reversed(rows)))
    assert keys(test2) == keys(test)


def test_written_profile_is_the_scored_candidate(tmp_path):
    p = fs.StepFitParams(gemm_top=0.75, gemm_latency_s=8e-6, mem_top=0.85, launch_s=7e-6,
                         host_op_s=1.2e-5)
    prof, host = fs.candidate("a100-80gb", p)
    path = tmp_path / "a100.yaml"
    path.write_text(yaml.safe_dump(fs.profile_document("a100-80gb", p, source="test")))
    loaded = load_compute_profile("a100-80gb", path)
    for flops, nbytes in [(1e7, 1e5), (3e9, 2e7), (5e11, 1e9), (0.0, 4e8)]:
        assert op_time(loaded, flops=flops, bytes_moved=nbytes, dtype="fp16") == \
            op_time(prof, flops=flops, bytes_moved=nbytes, dtype="fp16")
    # large GEMMs reach the top; a GEMM's time grows with its latency at small sizes
    assert loaded.matmul["bf16"](1e13) == pytest.approx(0.75, rel=2e-3)
    small = 2e8
    assert op_time(loaded, flops=small, bytes_moved=0, dtype="bf16") > \
        7e-6 + small / (312e12 * 0.75)
    assert host.forward_s > 0 and host.recompute_s > host.forward_s


def test_fit_recovers_known_parameters_from_synthetic_steps(rows):
    """Steps simulated with known parameters are fitted back from another start."""
    sample = fs.split(rows)[0][::60]
    truth = fs.StepFitParams(gemm_top=0.8, gemm_latency_s=1e-5, mem_top=0.7, launch_s=2e-5,
                             host_op_s=1.4e-5)
    measured = fs.predict(sample, *fs.candidate("a100-80gb", truth))
    synthetic = [dict(r, measured_s=float(m)) for r, m in zip(sample, measured)]
    start = fs.StepFitParams(gemm_top=0.8, gemm_latency_s=3e-6, mem_top=0.9, launch_s=5e-6,
                             host_op_s=8e-6)
    before = fs.errors_summary(measured, fs.predict(sample, *fs.candidate("a100-80gb", start)))
    got, summary = fs.fit_steps("a100-80gb", synthetic, start=start, fixed={"gemm_top": 0.8},
                                max_evals=60)
    assert before["mape"] > 0.15
    assert summary["train"]["mape"] < 0.01
    assert got.host_op_s == pytest.approx(truth.host_op_s, rel=0.1)


def test_shipped_a100_profile_holds_on_the_held_out_rows(rows):
    """The shipped files were fitted by `clusterplan calibrate steps`; the held-out rows (never
    fitted) come within 10%, as the file records."""
    host_doc = yaml.safe_load((Path(fs.__file__).resolve().parents[3] / "traces" /
                               "calibration" / "host-overhead-a100-80gb.yaml").read_text())
    assert host_file_for("a100-80gb") == "host-overhead-a100-80gb.yaml"
    assert host_file_for("h100-sxm") != host_file_for("a100-80gb")
    assert "held out" in load_compute_profile("a100-80gb").source
    test = fs.split(rows)[1][::3]
    meas = np.array([r["measured_s"] for r in test])
    err = fs.errors_summary(meas, fs.predict(test))
    print(f"\nA100 held-out rows (every 3rd of {len(fs.split(rows)[1])}): {err}")
    assert err["mape"] <= 0.10
    assert err["mape"] == pytest.approx(host_doc["held_out"]["mape"], abs=0.02)
    assert load_host_overhead("host-overhead-a100-80gb.yaml").forward_s > 0


def test_calibrate_steps_cli_writes_loadable_files(tmp_path, capsys, rows):
    out, host = tmp_path / "a100.yaml", tmp_path / "host.yaml"
    assert main(["calibrate", "steps", "--vtrain-dir", str(VTRAIN), "--every", "200",
                 "--max-evals", "2", "--out", str(out), "--host-out", str(host), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["held_out"]["rows"] + report["train"]["rows"] == 1440
    assert "held out" in load_compute_profile("a100-80gb", out).source
    assert load_host_overhead(str(host)).backward_s > 0


@pytest.mark.parametrize("flag", ["bogus=1", "gemm_top=abc", "gemm_top=-1", "gemm_top"])
def test_calibrate_steps_bad_fix_exits_2_before_work(tmp_path, capsys, flag):
    out = tmp_path / "a100.yaml"
    assert main(["calibrate", "steps", "--fix", flag, "--out", str(out)]) == 2
    assert "--fix" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("flag,path", [("--out", "missing-folder/a.yaml"), ("--host-out", ".")])
def test_calibrate_steps_bad_output_exits_2_before_the_fit(tmp_path, capsys, flag, path):
    assert main(["calibrate", "steps", flag, str(tmp_path / path)]) == 2
    assert flag in capsys.readouterr().err
