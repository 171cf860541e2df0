"""MFU falling with scale: GPU speed variability and host stalls as order statistics, stage
slowdowns, and the ``clusterplan scaling`` command on a small case."""

import itertools
import json

import numpy as np
import pytest
import yaml

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli.main import main
from planner.llm.scaling import stage_slowdown
from planner.model.llm.layout import Layout
from planner.model.variability import GpuVariability, HostStalls


def _sample_max(var: GpuVariability, n: int, seeds: int, per_host: int = 1) -> float:
    lay = Layout(tp=1, cp=1, dp=n, pp=1)
    r = np.arange(n)
    return float(np.mean([GpuVariability(sigma=var.sigma, seed=s,
                                         straggler_fraction=var.straggler_fraction,
                                         straggler_factor=var.straggler_factor)
                          .factors(lay, r, r - r % per_host).max() for s in range(seeds)]))


def test_expected_max_of_gpu_factors_is_the_order_statistic():
    v = GpuVariability(sigma=0.02)
    assert v.expected_max(1) == pytest.approx(np.exp(0.02 ** 2 / 2), rel=1e-6)  # lognormal mean
    prev = 0.0
    for n in (1, 8, 64, 512):
        e = v.expected_max(n)
        assert e > prev
        prev = e
        # seeded draws average to the order statistic (σ of the mean ≈ 0.4σ/√seeds)
        assert _sample_max(v, n, 300) == pytest.approx(e, abs=0.0015)
    # straggler hosts (here 5 % at 1.2×): a host's 8 GPUs share its draw
    mix = GpuVariability(sigma=0.02, straggler_fraction=0.05, straggler_factor=1.2)
    assert _sample_max(mix, 256, 400, per_host=8) == pytest.approx(mix.expected_max(256, 8),
                                                                   abs=0.01)
    assert mix.expected_max(4096, 8) > mix.expected_max(256, 8) > v.expected_max(256)


def test_draws_are_seeded_and_nested_in_the_layout():
    v = GpuVariability(seed=3)
    small, big = Layout(tp=2, cp=1, dp=2, pp=2), Layout(tp=2, cp=1, dp=4, pp=2)
    rs, rb = np.arange(8), np.arange(16)
    fs, fb = v.factors(small, rs, rs), v.factors(big, rb, rb)
    assert np.array_equal(fs, v.factors(small, rs, rs))
    # the GPU at (pp, dp, cp, tp) draws the same factor whatever dp the job has
    for r in rs:
        c = small.coords(int(r))
        assert fb[big.rank(**c)] == fs[r]
    assert not np.array_equal(fs, GpuVariability(seed=4).factors(small, rs, rs))


def test_host_stalls_closed_forms_and_growth():
    lay = Layout(tp=1, cp=1, dp=4096, pp=1)
    gc = HostStalls(duration_s=1.0, period_steps=100, steps=400)
    ex = HostStalls(model="exponential", mean_s=0.01, steps=400)
    prev = -1.0
    for p in (1, 16, 256, 4096):
        ranks = np.arange(p)
        assert gc.sampled_stall_s(lay, ranks) == pytest.approx(gc.expected_stall_s(p), abs=0.06)
        assert ex.sampled_stall_s(lay, ranks) == pytest.approx(ex.expected_stall_s(p), rel=0.1)
        assert gc.expected_stall_s(p) > prev
        prev = gc.expected_stall_s(p)
    with pytest.raises(SpecError):
        HostStalls(model="weekly")


def test_stage_slowdown_names_each_stages_slowest_gpu():
    topo = load_topology("dgx-h100:nodes=2")
    lay = Layout(tp=2, cp=1, dp=4, pp=2)
    v = GpuVariability(sigma=0.05, seed=1)
    out = stage_slowdown(v, lay, topo)
    r = np.arange(16)
    f = v.factors(lay, r, r - r % 8)
    assert sorted(lay.coords(k)["pp"] for k in out) == [0, 1]
    for k, x in out.items():
        stage = [i for i in range(16) if lay.coords(i)["pp"] == lay.coords(k)["pp"]]
        assert x == pytest.approx(f[stage].max())


@pytest.fixture
def tiny_spec(tmp_path):
    doc = {"model": {"kind": "transformer", "name": "tiny", "layers": 4, "hidden_size": 1024,
                     "ffn_hidden_size": 4096, "num_heads": 8, "num_kv_heads": 8,
                     "vocab_size": 32000, "seq_len": 1024, "ffn": "gelu"},
           "training": {"global_batch_size": 16, "micro_batch_size": 1, "precision": "bf16",
                        "activation_recompute": "none"},
           "parallel": {"tp": 4, "cp": 1, "pp": 2}}
    p = tmp_path / "tiny.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


def _scaling(capsys, *argv) -> dict:
    assert main(["scaling", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_scaling_mfu_never_rises_under_the_variability_mechanisms(tiny_spec, capsys):
    d = _scaling(capsys, tiny_spec, "--topology", "h100-ib", "--gpus", "8,32,128,512",
                 "--mechanisms", "variability,stalls", "--stall-duration", "20ms",
                 "--stall-period", "50", "--samples", "2", "--stall-steps", "64")
    mfu = [r["mfu"] for r in d["rows"]]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(mfu)), mfu
    assert mfu[-1] < mfu[0]
    rows = d["rows"]
    assert [r["global_batch_size"] for r in rows] == [16, 64, 256, 1024]   # per replica fixed
    for r in rows:
        assert set(r["mechanisms"]) == {"variability", "stalls"}
        assert r["mechanisms"]["stalls"]["loss_s"] == pytest.approx(r["host_stall_s"])
        assert r["mfu"] <= r["baseline"]["mfu"]
    assert rows[-1]["host_stall_s"] > rows[0]["host_stall_s"]


def test_scaling_all_mechanisms_on_a_two_tier_fabric(tiny_spec, capsys):
    d = _scaling(capsys, tiny_spec, "--topology", "llama3-h100-24k", "--gpus", "16,64",
                 "--trainer", "megatron-lm-2021", "--batch", "fixed", "--samples", "1")
    assert d["mechanisms"] == ["ecmp", "variability", "stalls", "exposed"]
    assert [r["global_batch_size"] for r in d["rows"]] == [16, 16]
    for r in d["rows"]:
        assert r["simulation_mode"] == "explicit"
        total = r["baseline"]["step_time_s"] - r["step_time_s"]
        parts = sum(v["loss_s"] for v in r["mechanisms"].values()) + r["interaction_s"]
        assert parts == pytest.approx(-total)
        assert r["mechanisms"]["exposed"]["loss_s"] >= 0
    text_rc = main(["scaling", tiny_spec, "--topology", "h100-ib", "--gpus", "8,16",
                    "--samples", "1", "--mechanisms", "stalls"])
    assert text_rc == 0
    assert "MFU" in capsys.readouterr().out
