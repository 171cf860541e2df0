"""LLM slice: specs, layout, schedules, FLOP conventions, memory, the step workload, the CLI."""

import json
from dataclasses import replace

import pytest

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli.main import main
from planner.llm.fidelity import korthikanti_rows, narayanan_flops
from planner.llm.metrics import model_flops, simulate_llm
from planner.model.llm.layout import Layout
from planner.model.llm.schedule import interleaved, one_f_one_b
from planner.model.llm.spec import (
    LLMSpec,
    ModelSpec,
    ParallelSpec,
    TrainingSpec,
    builtin_model_names,
    load_llm_spec,
    parse_parallel,
)
from planner.model.llm.trainer import preset


def test_builtins_load():
    for name in ("llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b"):
        assert name in builtin_model_names()
        load_llm_spec(name)
    m = load_llm_spec("llama3-405b").model
    assert 400e9 < m.total_params < 410e9


def test_megatron_rank_order_matches_formats_md():
    lay = Layout(tp=2, cp=1, dp=2, pp=4)
    assert lay.group("tp", 2) == [2, 3]
    assert lay.group("dp", 1) == [1, 3]
    assert lay.group("pp", 0) == [0, 4, 8, 12]
    lay = Layout(tp=4, cp=2, dp=2, pp=1)
    assert lay.group("tp", 0) == [0, 1, 2, 3]
    assert lay.group("cp", 0) == [0, 4]
    assert lay.group("dp", 0) == [0, 8]


@pytest.mark.parametrize("pp,m", [(4, 8), (2, 6), (8, 8)])
def test_1f1b_runs_every_pass_once_in_dependency_order(pp, m):
    for rank in range(pp):
        items = one_f_one_b(pp, m, rank)
        assert sorted(items) == sorted([("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)])
        seen = set()
        for kind, mb, _ in items:
            if kind == "B":
                assert ("F", mb) in seen
            seen.add((kind, mb))
        # in flight never exceeds pp − rank
        live = peak = 0
        for kind, _, _ in items:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == min(pp - rank, m)


def test_interleaved_covers_all_chunks():
    items = interleaved(4, 8, 1, 2)
    assert len(items) == 2 * 8 * 2
    assert {(k, mb, c) for k, mb, c in items} == {(k, mb, c) for k in "FB" for mb in range(8)
                                                  for c in range(2)}


def test_flop_convention_reproduces_korthikanti_and_narayanan():
    for row in korthikanti_rows():
        m, B = row["spec"].model, row["spec"].training.global_batch_size
        h, l = m.hidden_size, m.layers
        if not row["row"].endswith("full"):
            continue
        f = model_flops(row["spec"])
        s, V = 2048, 51200
        assert f["megatron"] == pytest.approx(72 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)),
                                              rel=1e-9)
        spec_full = row["spec"]
        # full recompute: hardware FLOPs = Narayanan's 96Bslh²(1 + s/6h + V/16lh)
        assert model_flops(spec_full)["hardware"] == pytest.approx(
            narayanan_flops(B, s, l, h, V), rel=1e-9)


def _small():
    return LLMSpec(model=ModelSpec(name="tiny", layers=8, hidden_size=2048, ffn_hidden_size=8192,
                                   num_heads=16, num_kv_heads=16, vocab_size=32000, seq_len=2048,
                                   ffn="gelu"),
                   training=TrainingSpec(global_batch_size=64, micro_batch_size=1),
                   parallel=None, source="test")


def test_pipeline_bubble_shrinks_with_more_microbatches():
    topo = load_topology("dgx-a100:nodes=2")
    spec = _small()
    p = ParallelSpec(tp=2, pp=4, dp=2)
    few = simulate_llm(spec, p, topo)
    more = simulate_llm(replace(spec, training=replace(spec.training, global_batch_size=256)), p, topo)
    # ideal 1F1B: (m + pp − 1) × (f + b); per-micro-batch time must fall toward f + b
    assert more.step_time_s / 128 < few.step_time_s / 32
    f, b = few.plan.fwd_s[1][0], few.plan.bwd_s[1][0]
    assert few.step_time_s >= (32 + 3) * (f + b) * 0.98


def test_dp_traffic_overlaps_backward_and_shares_the_fabric():
    topo = load_topology("h100-ib:nodes=4")
    spec = _small()
    r = simulate_llm(spec, ParallelSpec(tp=1, pp=1, dp=32), topo)
    df = r.sim.ops
    dp = df[df.category == "dp"]
    assert len(dp) == 4 and (dp.ranks == 32).all()     # 4 buckets, each over all 32 ranks
    bwd_end = df[df.category == "bwd"].end_s.max()
    assert dp.start_s.min() < bwd_end                   # first bucket starts inside backward


def test_deepspeed_gradient_reduction_after_backward_in_fp16():
    topo = load_topology("h100-ib:nodes=4")
    spec = _small()
    base = simulate_llm(spec, ParallelSpec(tp=1, pp=1, dp=32), topo)
    ds_spec = replace(spec, trainer=preset("megatron-deepspeed"))
    ds = simulate_llm(ds_spec, ParallelSpec(tp=1, pp=1, dp=32), topo)
    df = ds.sim.ops
    dp = df[df.category == "dp"]
    assert len(dp) == 1 and dp.start_s.min() >= df[df.category == "bwd"].end_s.max()
    full = base.sim.ops[base.sim.ops.category == "dp"]["bytes"].sum()
    assert dp["bytes"].sum() == pytest.approx(full / 2)


def test_parallel_errors_exit_2(capsys):
    assert main(["simulate", "llama3-8b", "--topology", "h100-ib:nodes=8", "--parallel",
                 "tp=3"]) == 2
    assert "num_heads 32 is not divisible by tp 3" in capsys.readouterr().err
    assert main(["simulate", "llama3-8b", "--topology", "h100-ib:nodes=8", "--parallel",
                 "tp=8,pp=2,dp=2"]) == 2
    assert "does not match the 64 GPUs" in capsys.readouterr().err
    with pytest.raises(SpecError):
        parse_parallel("tp=x")


def test_out_of_memory_still_reports_the_time(capsys):
    code = main(["simulate", "llama3-70b", "--topology", "h100-ib:nodes=1", "--parallel",
                 "tp=1,pp=1,dp=8", "--json"])
    out, err = capsys.readouterr()
    d = json.loads(out)
    assert code == 0 and "does not fit in memory" in err and "GiB" in err and "stage 0" in err
    assert d["memory"]["fits"] is False and d["step_time_s"] > 0
    assert d["memory"]["total_bytes"] > d["memory"]["capacity_bytes"]


def test_simulate_json_keys(capsys):
    assert main(["simulate", "llama3-8b", "--topology", "h100-ib:nodes=4", "--parallel",
                 "tp=4,pp=2,dp=4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for key in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "memory_per_gpu_bytes",
                "breakdown"):
        assert key in d
    assert 0 < d["mfu"] < 1 and d["memory_per_gpu_bytes"] > 0


def test_plan_model_writes_a_versioned_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "llama3-8b", "--topology", "h100-ib", "--gpus", "32", "--top", "3",
                 "--out", str(out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    doc = json.loads(out.read_text())
    assert doc["format_version"] == 1 and doc["kind"] == "llm-plan"
    assert d["search"]["enumerated"] >= d["search"]["estimated"] >= d["search"]["simulated"] >= 3
    p = doc["parallel"]
    assert p["tp"] * p["cp"] * p["pp"] * p["dp"] == 32 == len(doc["ranks"])
    assert doc["ranks"][9]["host"] == 1 and doc["ranks"][9]["gpu"] == 1
    times = [doc["step_time_s"]] + [a["step_time_s"] for a in doc["alternatives"]]
    assert times == sorted(times)
    assert doc["memory"]["fits"]


def test_plan_without_a_fitting_layout_exits_2(capsys):
    assert main(["plan", "llama3-405b", "--topology", "h100-ib", "--gpus", "8"]) == 2
    assert "no layout" in capsys.readouterr().err


def test_scale_across_chooses_the_axis_that_crosses_buildings(capsys):
    thin = ("two-buildings-h100:nodes=8,buildings.links=4,buildings.link_bandwidth=100Gb/s,"
            "buildings.latency=2ms")
    assert main(["plan", "llama3-8b", "--topology", thin, "--top", "3", "--json"]) == 0
    sa = json.loads(capsys.readouterr().out)["search"]["scale_across"]
    # a thin inter-building link: gradients must not cross it, pipeline stages may
    assert sa["crossing_axis"] == "pp"
    assert sa["gain"] > 0.05
    assert sa["baseline_step_time_s"] > sa["step_time_s"]
