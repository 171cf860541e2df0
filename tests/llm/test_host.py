"""The host (CPU) floor of eager-PyTorch block passes: measured file, and where it binds."""

import pytest

from simulator.compute import load_compute_profile
from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.model.llm.host import HostOverhead, load_host_overhead
from planner.model.llm.layout import Layout
from planner.model.llm.spec import LLMSpec, ModelSpec, ParallelSpec, TrainingSpec, load_llm_spec
from planner.workloads.llm.passes import pass_times


def _times(spec, topo, host, p=ParallelSpec(tp=1, pp=1, dp=8)):
    lay = Layout(p.tp, p.cp, p.dp, p.pp)
    return pass_times(spec, p, topo, lay, load_compute_profile(topo.gpu), host=host)


def test_shipped_measurement_loads_and_is_plausible():
    h = load_host_overhead()
    # eager dispatch of ~50 forward ops: tens of µs to a few ms per block
    assert 2e-5 < h.forward_s < 5e-3 and 2e-5 < h.backward_s < 1e-2
    assert h.backward_pass_s("full") > h.backward_pass_s("none")
    assert "calibrate host" in h.source or "Megatron-style" in h.source


def test_floor_binds_for_tiny_blocks_and_not_for_large_ones():
    topo = load_topology("dgx-a100")
    host = HostOverhead(forward_s=4e-4, backward_s=5e-4, recompute_s=1e-3)
    tiny = LLMSpec(model=ModelSpec(name="tiny", layers=4, hidden_size=256, ffn_hidden_size=1024,
                                   num_heads=4, num_kv_heads=4, vocab_size=1000, seq_len=128,
                                   ffn="gelu"),
                   training=TrainingSpec(global_batch_size=8, micro_batch_size=1,
                                         activation_recompute="full"), parallel=None, source="t")
    f_floor, b_floor, *_ = _times(tiny, topo, host)
    f_none, b_none, *_ = _times(tiny, topo, None)
    assert f_none[0][0] < 4 * 4e-4                      # the GPU alone would be faster
    # the first block also holds the embedding and the last the logits, which stay GPU work
    assert f_floor[0][0] >= 4 * 4e-4
    assert b_floor[0][0] >= 4 * (5e-4 + 1e-3)
    big = load_llm_spec("llama3-70b")
    fb, bb, *_ = _times(big, topo, host, ParallelSpec(tp=8, pp=1, dp=1))
    fn, bn, *_ = _times(big, topo, None, ParallelSpec(tp=8, pp=1, dp=1))
    assert fb == fn and bb == bn                        # GPU-bound: no change


def test_cpu_devices_get_no_floor():
    topo = load_topology("localhost-gloo")
    spec = LLMSpec(model=ModelSpec(name="t", layers=2, hidden_size=64, ffn_hidden_size=128,
                                   num_heads=4, num_kv_heads=4, vocab_size=100, seq_len=16),
                   training=TrainingSpec(global_batch_size=8, precision="fp32"),
                   parallel=None, source="t")
    p = ParallelSpec(tp=1, pp=1, dp=topo.num_gpus)
    assert _times(spec, topo, "measured", p)[0] == _times(spec, topo, None, p)[0]


def test_negative_overhead_is_refused():
    with pytest.raises(SpecError, match="non-negative"):
        HostOverhead(forward_s=-1.0, backward_s=0.0, recompute_s=0.0)


def test_calibrate_host_writes_a_file_that_loads(tmp_path, capsys):
    pytest.importorskip("torch")
    from planner.cli.main import main
    out = tmp_path / "host.yaml"
    assert main(["calibrate", "host", "--repeats", "5", "--out", str(out)]) == 0
    h = load_host_overhead(str(out))
    assert h.forward_s > 0 and h.backward_s > 0
    assert "host time per block" in capsys.readouterr().out
    assert main(["calibrate", "host", "--repeats", "2"]) == 2


def test_host_floor_improves_vtrain_single_node_predictions(monkeypatch):
    """vTrain's one-node runs (small blocks) are predicted far too fast without the floor."""
    from pathlib import Path

    import planner.workloads.llm.step as step
    from planner.llm.fidelity import run_set, vtrain_single_rows
    path = Path(__file__).resolve().parents[3] / "shared" / "data" / "vtrain" / \
        "ground_truth_single.csv"
    if not path.exists():
        pytest.skip(f"vTrain data not found at {path}")
    rows = vtrain_single_rows(path, every=6)
    with_floor = run_set(rows).error
    orig = step.pass_times
    monkeypatch.setattr(step, "pass_times", lambda *a, **k: orig(*a, **{**k, "host": None}))
    without = run_set(rows).error
    assert with_floor.abs().mean() < without.abs().mean() - 0.05
    # the floor only lifts predictions: never faster than without it
    assert (with_floor >= without - 1e-12).all()
