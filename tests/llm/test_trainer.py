"""The ``trainer:`` section: presets, overrides from the spec and the command line, and the
mechanism each setting switches in the simulated step."""

import json
from dataclasses import replace

import pytest

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli.main import main
from planner.llm.metrics import simulate_llm
from planner.model.llm.spec import ParallelSpec, load_llm_spec, parse_llm_spec
from planner.model.llm.stages import chunk_layer_counts, stage_layers
from planner.model.llm.trainer import PRESETS, TrainerSpec, override, preset
from planner.sweep import parse_sweep, run_sweep

SMALL = {"model": {"name": "small", "layers": 8, "hidden_size": 2048, "ffn_hidden_size": 8192,
                   "num_heads": 16, "vocab_size": 32000, "seq_len": 2048, "ffn": "gelu"},
         "training": {"global_batch_size": 64, "micro_batch_size": 1}}


def _spec(**trainer):
    return parse_llm_spec({**SMALL, "trainer": trainer}, source="test.yaml")


def test_every_preset_says_what_it_describes_and_why():
    for name, p in PRESETS.items():
        assert len(p["describes"]) > 20 and len(p["source"]) > 40, name
        assert preset(name).preset == name
    assert TrainerSpec() == preset("megatron-core")        # the default is today's behaviour
    assert _spec().trainer == TrainerSpec()


def test_spec_keys_override_the_preset():
    t = _spec(preset="megatron-deepspeed", attention="flash").trainer
    assert t.attention == "flash" and t.grad_reduce == "after_backward" and t.grad_bytes == 2
    assert override(t, ["preset=torchtitan"]) == preset("torchtitan")
    assert override(t, ["grad_reduce_dtype=fp32", "pp_comm_overlap=true"]).grad_bytes == 4


@pytest.mark.parametrize("trainer, field", [({"attention": "sparse"}, "trainer.attention"),
                                            ({"grad_reduce": 1}, "trainer.grad_reduce"),
                                            ({"pipeline": True}, "trainer.pipeline"),
                                            ({"preset": "nemo"}, "trainer.preset"),
                                            ({"sequence_parallel": False,
                                              "tp_comm_overlap": True},
                                             "trainer.tp_comm_overlap")])
def test_bad_trainer_settings_name_the_field(trainer, field):
    with pytest.raises(SpecError) as e:
        _spec(**trainer)
    assert e.value.field == field and e.value.source == "test.yaml" and e.value.fix


def test_cli_flags_set_the_trainer_and_the_result_prints_it(capsys):
    args = ["simulate", "llama3-8b", "--topology", "h100-ib:nodes=2", "--parallel",
            "tp=4,pp=2,dp=2", "--global-batch", "16"]
    assert main(args + ["--trainer", "megatron-deepspeed", "--trainer-set",
                        "attention=flash", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["trainer"]["preset"] == "megatron-deepspeed" and d["trainer"]["attention"] == "flash"
    assert d["trainer"]["grad_reduce"] == "after_backward"
    assert main(args) == 0
    assert "trainer megatron-core: flash attention" in capsys.readouterr().out
    assert main(args + ["--trainer-set", "grad_reduce=never"]) == 2
    err = capsys.readouterr().err
    assert "grad_reduce" in err and "overlapped" in err and "Traceback" not in err
    assert main(args + ["--trainer", "deepspeed"]) == 2
    assert "megatron-deepspeed" in capsys.readouterr().err


def test_trimmed_stages_follow_llama3():
    assert stage_layers(126, 16, trim=1) == [7] + [8] * 14 + [7]
    chunks = chunk_layer_counts(126, 16, 2, trim=1)
    assert sum(map(sum, chunks)) == 126 and chunks[0] == [3, 4] and chunks[-1] == [4, 3]
    with pytest.raises(SpecError):
        stage_layers(8, 4, trim=5)
    topo = load_topology("h100-ib:nodes=2")
    base = simulate_llm(_spec(), ParallelSpec(tp=4, pp=4, dp=1), topo)
    trim = simulate_llm(_spec(trim_first_last_stage=1), ParallelSpec(tp=4, pp=4, dp=1), topo)
    assert trim.plan.info["chunk_layers"] == [[1], [3], [3], [1]]
    assert stage_layers(12, 4, trim=1) == [2, 4, 4, 2]
    assert sum(trim.plan.fwd_s[0]) < sum(base.plan.fwd_s[0])
    assert sum(trim.plan.fwd_s[1]) > sum(base.plan.fwd_s[1])


def test_blocking_pipeline_sends_hold_the_sender():
    topo = load_topology("h100-ib:nodes=2")
    p = ParallelSpec(tp=1, pp=4, dp=4)
    fast = simulate_llm(_spec(), p, topo)
    slow = simulate_llm(_spec(pp_comm_overlap=False), p, topo)
    assert slow.step_time_s > fast.step_time_s
    ops = slow.sim.ops
    rank0 = ops[(ops.first_rank == 0) & (ops.kind == "compute")].sort_values("start_s")
    first_send = ops[(ops.category == "pp") & (ops.first_rank == 0)].end_s.min()
    assert rank0.start_s.iloc[1] >= first_send - 1e-12        # F mb1 waits for mb0's send
    frank0 = fast.sim.ops[(fast.sim.ops.first_rank == 0) & (fast.sim.ops.kind == "compute")]
    assert frank0.sort_values("start_s").start_s.iloc[1] < first_send


def test_tp_comm_overlap_hides_part_of_the_tp_collectives():
    topo = load_topology("h100-ib:nodes=1")
    p = ParallelSpec(tp=8, pp=1, dp=1)
    plain = simulate_llm(_spec(), p, topo).breakdown()["tp_cp_comm_s"]
    hidden = simulate_llm(_spec(tp_comm_overlap=True), p, topo).breakdown()["tp_cp_comm_s"]
    assert 0 < hidden < plain
    assert hidden >= plain / 8 * 0.999       # the first of tp chunks never overlaps


def test_standard_attention_is_slower_than_flash():
    topo = load_topology("h100-ib:nodes=1")
    p = ParallelSpec(tp=1, pp=1, dp=8)
    flash = simulate_llm(_spec(), p, topo).step_time_s
    std = simulate_llm(_spec(attention="standard"), p, topo).step_time_s
    assert std > flash


def test_fp32_gradients_double_the_dp_bytes():
    topo = load_topology("h100-ib:nodes=2")
    p = ParallelSpec(tp=1, pp=1, dp=16)
    b32 = simulate_llm(_spec(), p, topo).sim.ops
    b16 = simulate_llm(_spec(grad_reduce_dtype="bf16"), p, topo).sim.ops
    assert b32[b32.category == "dp"]["bytes"].sum() == \
        pytest.approx(2 * b16[b16.category == "dp"]["bytes"].sum())


def test_builtin_specs_keep_the_default_trainer():
    spec = load_llm_spec("llama3-70b")
    assert spec.trainer == TrainerSpec()
    assert replace(spec, trainer=preset("torchtitan")).trainer.grad_reduce == "overlapped"


def test_a_sweep_varies_the_trainer():
    spec = parse_sweep({"command": ["simulate", "llama3-8b"],
                        "args": {"--topology": "h100-ib:nodes=2", "--parallel": "tp=2,pp=2,dp=4",
                                 "--global-batch": 32},
                        "grid": {"--trainer": ["megatron-core", "megatron-deepspeed"],
                                 "--trainer-set": ["attention=flash", "attention=standard"]},
                        "keep": ["step_time_s", "trainer.preset", "trainer.attention",
                                 "trainer.grad_reduce"]}, source="t")
    table, stats = run_sweep(spec, command=main, workers=1)
    assert table.ok.all() and len(table) == 4
    assert set(table["trainer.preset"]) == {"megatron-core", "megatron-deepspeed"}
    ds = table[table["trainer.preset"] == "megatron-deepspeed"]
    assert set(ds["trainer.grad_reduce"]) == {"after_backward"}
    std = table.set_index(["trainer", "trainer.attention"]).step_time_s
    assert std[("megatron-core", "standard")] > std[("megatron-core", "flash")]


def test_megatron_export_carries_the_trainer_settings():
    from planner.cli.llm import plan_document
    from planner.export.megatron import export_megatron, parse_megatron_args
    topo = load_topology("h100-ib:nodes=4")
    spec = _spec(trim_first_last_stage=1, tp_comm_overlap=True, grad_reduce_dtype="bf16")
    spec = replace(spec, model=replace(spec.model, layers=14))
    doc = plan_document(simulate_llm(spec, ParallelSpec(tp=2, pp=4, dp=4, vpp=2), topo,
                                     schedule_name="interleaved"), topo)
    args = parse_megatron_args(export_megatron(doc)["megatron.args"])
    assert args["decoder-first-pipeline-num-layers"] == args["decoder-last-pipeline-num-layers"] \
        == "3" and args["num-virtual-stages-per-pipeline-rank"] == "2"
    assert args["tp-comm-overlap"] and args["sequence-parallel"] and args["grad-reduce-in-bf16"]
    assert args["attention-backend"] == "flash" and args["overlap-grad-reduce"]
    ds = replace(spec, trainer=preset("megatron-deepspeed"))
    doc = plan_document(simulate_llm(ds, ParallelSpec(tp=2, pp=2, dp=8), topo), topo)
    args = parse_megatron_args(export_megatron(doc)["megatron.args"])
    assert "overlap-grad-reduce" not in args and "sequence-parallel" not in args
    assert args["attention-backend"] == "unfused"
