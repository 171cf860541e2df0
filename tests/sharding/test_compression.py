"""Error-bounded compression of the DLRM all-to-all (issue 26 item 3): the bits-per-value fit
against a quantised Gaussian's entropy and against SZ3 on a tensor it was not fitted to, the
compressed step's bytes and codec ops, Amdahl's law, the per-table bounds under a budget, and
bad settings."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.errors import SpecError

from planner.model.tables.compression import CALIBRATION, A2ACompression
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding import get_planner
from planner.workloads.dlrm.step import simulate_step

REPO = Path(__file__).resolve().parents[2]


def test_fitted_bits_are_a_quantised_gaussians_entropy():
    """Uniform quantisation with step 2·eb of N(0, σ²) leaves log2(σ/eb) + 1.05 bits of entropy
    per value; SZ3's measured cost (committed fit) must be that within half a bit at the ends
    of the fitted range, and grow one bit per halving of the bound."""
    b = yaml.safe_load(CALIBRATION.read_text())["bits_per_value"]
    assert b["c1"] == pytest.approx(1.0, abs=0.05)
    for rel in (1e-4, 0.3):
        fit = b["c0"] + b["c1"] * np.log2(1 / rel)
        assert fit == pytest.approx(np.log2(1 / rel) + 1.05, abs=0.5)


def test_sz3_on_a_tensor_the_fit_never_saw():
    pysz = pytest.importorskip("pysz")
    from planner.measure.tables.compress_ratio import _pooled, _sz3
    x = _pooled(dim=32, pooling=8, batch=2048, rows=50_000, seed=99)
    sigma = float(x.std())
    c = A2ACompression(error_bound=0.01)
    for rel in (0.005, 0.05):
        ratio, err, _, _ = _sz3(x, rel * sigma)
        assert err <= rel * sigma * 1.0001
        assert c.ratio(rel, value_bytes=4) == pytest.approx(ratio, rel=0.10)
    assert pysz is not None


def _case(topo="dgx-h100:nodes=4,node.nic_bandwidth=100Gb/s", n=32):
    m = load_model_spec("mlperf-dcnv2")
    plan = get_planner("greedy").plan(ShardingTask(model=m, topology=topo), n)
    return m, topo, n, plan.shardings


def _sim(m, comp, topo, n, shardings):
    return simulate_step(prepare(ShardingTask(model=replace(m, compression=comp),
                                              topology=topo), n), shardings)


def test_compressed_step_sends_fewer_bytes_and_pays_its_codecs():
    m, topo, n, sh = _case()
    base = _sim(m, None, topo, n, sh)
    comp = A2ACompression(error_bound=0.01, backward=True)
    s = _sim(m, comp, topo, n, sh)
    ratio = comp.effective_ratio([(t.name, t.embedding_dim) for t in m.tables], value_bytes=4)
    size = {}
    for res, key in ((base, "base"), (s, "comp")):
        t = res.result.table
        size[key] = {name: b for name, b in zip(t["name"], t["bytes"])
                     if name.startswith("output_a2a")}
    for name in ("output_a2a_fwd", "output_a2a_bwd"):
        assert size["base"][name] / size["comp"][name] == pytest.approx(ratio, rel=1e-9)
    t = s.result.table
    codec = [(name, r, d) for name, r, d, c in zip(t["name"], t["first_rank"], t["duration_s"],
                                                    t["category"]) if c == "compress"]
    assert len(codec) == 4 * n                    # compress + decompress, two all-to-alls
    c_Bps, _ = comp.throughput_Bps("gpu")
    mat = prepare(ShardingTask(model=m, topology=topo), n).cost.a2a_matrices(
        prepare(ShardingTask(model=m, topology=topo), n).cost.plan_features(sh))["output_fwd"]
    sent0 = mat[0].sum() - mat[0, 0]
    got = next(d for name, r, d in codec if name == "compress output_a2a_fwd" and r == 0)
    assert got == pytest.approx(sent0 / c_Bps, rel=1e-9)
    assert s.step_time_s < base.step_time_s       # over 100 Gb/s NICs it pays


def test_speedup_follows_amdahl_from_the_parts(tmp_path):
    """Speedup 1/(1 − f + f/ρ): f the compressed all-to-alls' share of the step (measured as the
    step they leave when free), ρ = f·T / (f·T/ratio + busiest rank's codec time)."""
    m, topo, n, sh = _case()
    base = _sim(m, None, topo, n, sh).step_time_s
    free = tmp_path / "free.yaml"
    free.write_text(yaml.safe_dump({
        "bits_per_value": {"c0": 1e-9, "c1": 0.0},
        "throughput_Bps": {k: {"compress": 1e30, "decompress": 1e30} for k in ("gpu", "cpu")}}))
    f = (base - _sim(m, A2ACompression(error_bound=0.01, calibration_file=str(free)), topo, n,
                     sh).step_time_s) / base
    comp = A2ACompression(error_bound=0.01)
    s = _sim(m, comp, topo, n, sh)
    ratio = comp.effective_ratio([(t.name, t.embedding_dim) for t in m.tables], value_bytes=4)
    rho = f * base / (f * base / ratio + s.breakdown_s["compress"])
    assert 0.02 < f < 0.9
    assert base / s.step_time_s == pytest.approx(1 / (1 - f + f / rho), rel=0.05)


def test_bounds_by_table_iteration_and_budget(tmp_path):
    c = A2ACompression(error_bound=0.01, tables=(("t1", 0.001),),
                       schedule=((0, 4.0), (1000, 1.0)), iteration=10)
    assert c.bound("t0") == pytest.approx(0.04) and c.bound("t1") == pytest.approx(0.004)
    assert c.bound("t0", iteration=5000) == pytest.approx(0.01)
    assert c.ratio(0.04, value_bytes=4) > c.ratio(0.004, value_bytes=4)
    spec = tmp_path / "m.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "m", "tables": [{"name": "a", "num_embeddings": 1000, "embedding_dim": 8},
                                {"name": "b", "num_embeddings": 1000, "embedding_dim": 8}],
        "a2a_compression": {"budget": 0.02, "sensitivity": {"b": 4}}}))
    comp = load_model_spec(str(spec)).compression
    assert comp.bound("a") == pytest.approx(0.02) and comp.bound("b") == pytest.approx(0.005)


@pytest.mark.parametrize("section,field", [
    ({"error_bound": 0}, "a2a_compression.error_bound"),
    ({"error_bound": float("nan")}, "a2a_compression.error_bound"),
    ({"error_bound": 2}, "a2a_compression.error_bound"),
    ({"error_bound": 0.01, "tables": {"zz": 0.1}}, "a2a_compression.tables.zz"),
    ({"error_bound": 0.01, "schedule": [[5, 1.0], [1, 2.0]]}, "a2a_compression.schedule"),
    ({"error_bound": 0.01, "schedule": [[0, -1]]}, "a2a_compression.schedule[0]"),
    ({"budget": 0.01, "error_bound": 0.01}, "a2a_compression.budget"),
    ({"budget": 0.01, "sensitivity": {"a": 0}}, "a2a_compression.sensitivity.a"),
    ({"error_bound": 0.01, "speed": 1}, "a2a_compression.speed")])
def test_bad_settings_name_the_field(tmp_path, section, field):
    spec = tmp_path / "m.yaml"
    table = {"name": "a", "num_embeddings": 10, "embedding_dim": 4}
    spec.write_text(yaml.safe_dump({"name": "m", "tables": [table],
                                    "a2a_compression": section}))
    with pytest.raises(SpecError) as e:
        load_model_spec(str(spec))
    assert e.value.field == field
    r = subprocess.run([sys.executable, "-m", "planner.cli", "plan", str(spec), "--gpus", "2",
                        "--topology", "dgx-h100"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 2 and field in r.stderr


def test_the_planners_cost_carries_compression():
    """The analytic cost the planners minimise: the forward all-to-all shrinks by the ratio,
    the gradients' all-to-all stays as it was without ``backward`` (one bound for all tables:
    exact), and each rank's lookups pay its shards' compression and its decompression; a MIP
    plan made under compression is valid."""
    m, topo, n, sh = _case()
    plain = prepare(ShardingTask(model=m, topology=topo), n).cost
    comp = A2ACompression(error_bound=0.01)
    cm = prepare(ShardingTask(model=replace(m, compression=comp), topology=topo), n).cost
    a, b = plain.components(plain.plan_features(sh)), cm.components(cm.plan_features(sh))
    assert np.all(b["output_a2a_fwd_s"] < a["output_a2a_fwd_s"])
    np.testing.assert_allclose(b["output_a2a_bwd_s"], a["output_a2a_bwd_s"], rtol=1e-9)
    codec_f, _ = cm.plan_codec_s(sh)
    np.testing.assert_allclose(b["lookup_fwd_s"] - a["lookup_fwd_s"],
                               codec_f + cm.decompress_fwd_s, rtol=1e-9)
    task = ShardingTask(model=replace(m, compression=comp), topology=topo)
    plan = get_planner("mip").plan(task, n, time_limit_s=5)
    assert plan.valid
