"""The groups each framework forms from the exported settings equal the plan's groups.

Each framework's group construction is re-implemented here from its documentation
(formats.md §3.3, §4.2, §5, §6) and fed only what the exported files say.
"""

from __future__ import annotations

import itertools
import json
import math
import shlex

import pytest
import tomllib
from export_plans import make_plan

from simulator.errors import SpecError

from planner.export import TARGETS, export_plan
from planner.export.megatron import parse_megatron_args

AXES = ("tp", "cp", "dp", "pp")


# ---- the plan's own groups: ranks sharing every coordinate but one axis ---------------------

def plan_groups(plan, axis):
    buckets = {}
    for e in plan["ranks"]:
        key = tuple(e[a] for a in AXES if a != axis)
        buckets.setdefault(key, []).append(e["rank"])
    return {tuple(sorted(v)) for v in buckets.values()}


# ---- reference group constructions -----------------------------------------------------------

def strided_groups(names, sizes, group_axes):
    """Innermost-first axes (first has stride 1): groups of ranks differing only in group_axes."""
    strides = [math.prod(sizes[:i]) for i in range(len(sizes))]
    others = [i for i, n in enumerate(names) if n not in group_axes]
    inner = [i for i, n in enumerate(names) if n in group_axes]
    out = set()
    for oc in itertools.product(*(range(sizes[i]) for i in others)):
        base = sum(c * strides[i] for c, i in zip(oc, others))
        out.add(tuple(sorted(base + sum(c * strides[i] for c, i in zip(ic, inner))
                             for ic in itertools.product(*(range(sizes[i]) for i in inner)))))
    return out


def megatron_groups(args, world):
    """RankGenerator: order tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp), first token stride 1, ep = 1."""
    tp, pp, cp = (int(args[k]) for k in ("tensor-model-parallel-size",
                                         "pipeline-model-parallel-size", "context-parallel-size"))
    dp = world // (tp * pp * cp)
    order = "tp-cp-ep-pp-dp" if args.get("use-tp-pp-dp-mapping") else "tp-cp-ep-dp-pp"
    size = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}
    names = order.split("-")
    return {ax: strided_groups(names, [size[n] for n in names], {ax}) for ax in AXES}


def row_major_groups(names, sizes, group_axes):
    """DeviceMesh / ProcessTopology: last dim varies fastest."""
    return strided_groups(names[::-1], sizes[::-1], group_axes)


def torchtitan_groups(toml_text):
    par = tomllib.loads(toml_text)["parallelism"]
    names = ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    sizes = [par["pipeline_parallel_degree"], par["data_parallel_replicate_degree"],
             par["data_parallel_shard_degree"], par["context_parallel_degree"],
             par["tensor_parallel_degree"]]
    return {"tp": row_major_groups(names, sizes, {"tp"}),
            "cp": row_major_groups(names, sizes, {"cp"}),
            "pp": row_major_groups(names, sizes, {"pp"}),
            "dp": row_major_groups(names, sizes, {"dp_replicate", "dp_shard"}),
            "dp_shard": row_major_groups(names, sizes, {"dp_shard"}),
            "dp_replicate": row_major_groups(names, sizes, {"dp_replicate"})}


def deepspeed_groups(topo_text):
    t = json.loads(topo_text)
    names, sizes = t["axes"], [t["num_pp"], t["num_dp"], t["num_mp"]]
    return {"pp": row_major_groups(names, sizes, {"pipe"}),
            "dp": row_major_groups(names, sizes, {"data"}),
            "tp": row_major_groups(names, sizes, {"model"})}


# ---- layouts ---------------------------------------------------------------------------------

LAYOUTS = {
    "tp2-pp4-dp2": dict(tp=2, pp=4, dp=2),
    "tp8-pp1-dp8": dict(tp=8, dp=8),
    "tp4-cp2-pp2-dp2-vpp2": dict(tp=4, cp=2, pp=2, dp=2, vpp=2, num_layers=80),
    "tp2-dp8-zero3": dict(tp=2, dp=8, fsdp="zero3"),
    "tp2-dp8-hsdp": dict(tp=2, dp=8, fsdp="hsdp"),
    "tp1-pp2-dp4-zero1": dict(pp=2, dp=4, fsdp="zero1"),
    "tp2-dp4-zero2": dict(tp=2, dp=4, fsdp="zero2"),
    "tp2-pp2-dp2-ppdp-order": dict(tp=2, pp=2, dp=2, order="tp-cp-pp-dp"),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_megatron_groups_equal_plan(name):
    plan = make_plan(**LAYOUTS[name])
    args = parse_megatron_args(export_plan(plan, "megatron")["megatron.args"])
    got = megatron_groups(args, len(plan["ranks"]))
    for ax in AXES:
        assert got[ax] == plan_groups(plan, ax), ax


@pytest.mark.parametrize("name", [n for n in LAYOUTS if "order" not in n])
def test_torchtitan_groups_equal_plan(name):
    plan = make_plan(**LAYOUTS[name])
    files = export_plan(plan, "torchtitan")
    got = torchtitan_groups(files["torchtitan.toml"])
    for ax in AXES:
        assert got[ax] == plan_groups(plan, ax), ax
    par = tomllib.loads(files["torchtitan.toml"])["parallelism"]
    fsdp = plan["parallel"]["fsdp"]
    dp = plan["parallel"]["dp"]
    if fsdp == "zero3":
        assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (1, dp)
    elif fsdp == "hsdp":
        # shard inside a host, replicate across hosts
        shard = par["data_parallel_shard_degree"]
        assert 1 < shard < dp and par["data_parallel_replicate_degree"] * shard == dp
        host = {e["rank"]: e["host"] for e in plan["ranks"]}
        for g in got["dp_shard"]:
            assert len({host[r] for r in g}) == 1
        for g in got["dp_replicate"]:
            assert len({host[r] for r in g}) == len(g)
    else:
        assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (dp, 1)


@pytest.mark.parametrize("name", ["tp2-pp4-dp2", "tp8-pp1-dp8", "tp2-dp8-zero3",
                                  "tp1-pp2-dp4-zero1", "tp2-dp4-zero2"])
def test_deepspeed_groups_equal_plan(name):
    plan = make_plan(**LAYOUTS[name])
    files = export_plan(plan, "deepspeed")
    got = deepspeed_groups(files["deepspeed_topology.json"])
    for ax in ("tp", "dp", "pp"):
        assert got[ax] == plan_groups(plan, ax), ax
    stage = json.loads(files["ds_config.json"])["zero_optimization"]["stage"]
    assert stage == {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}[plan["parallel"]["fsdp"]]


@pytest.mark.parametrize("kw,field", [
    (dict(tp=4, cp=2, pp=2, dp=2, vpp=2, num_layers=80), "parallel.cp"),
    (dict(tp=2, pp=2, dp=2, vpp=2, num_layers=80), "parallel.vpp"),
    (dict(tp=2, pp=2, dp=2, fsdp="zero3"), "parallel.fsdp"),
])
def test_deepspeed_refuses_what_it_cannot_express(kw, field):
    with pytest.raises(SpecError) as ei:
        export_plan(make_plan(**kw), "deepspeed")
    assert ei.value.field == field and ei.value.fix


@pytest.mark.parametrize("target", ["torchtitan", "deepspeed"])
def test_fixed_mesh_targets_refuse_other_orders(target):
    with pytest.raises(SpecError) as ei:
        export_plan(make_plan(tp=2, pp=2, dp=2, order="tp-cp-pp-dp"), target)
    assert ei.value.field == "order"


# ---- golden cases: formats.md §4.2 / §4.3 ------------------------------------------------------

def test_golden_world16_tp2_dp2_pp4():
    plan = make_plan(tp=2, dp=2, pp=4)
    args = parse_megatron_args(export_plan(plan, "megatron")["megatron.args"])
    g = megatron_groups(args, 16)
    assert {(0, 1), (2, 3)} <= g["tp"]
    assert {(0, 2), (1, 3), (4, 6)} <= g["dp"]
    assert {(0, 4, 8, 12), (1, 5, 9, 13)} <= g["pp"]
    for ax in ("tp", "dp", "pp"):
        assert g[ax] == plan_groups(plan, ax)


def test_golden_two_nodes_tp4_cp2_dp2():
    plan = make_plan(tp=4, cp=2, dp=2)
    args = parse_megatron_args(export_plan(plan, "megatron")["megatron.args"])
    g = megatron_groups(args, 16)
    assert (0, 1, 2, 3) in g["tp"] and (0, 4) in g["cp"] and (0, 8) in g["dp"]
    host = {e["rank"]: e["host"] for e in plan["ranks"]}
    assert all(len({host[r] for r in grp}) == 1 for ax in ("tp", "cp") for grp in g[ax])
    assert all(len({host[r] for r in grp}) == 2 for grp in g["dp"])
    assert g == {ax: plan_groups(plan, ax) for ax in AXES}


def test_golden_megatron_example_vpp():
    # §4.3: 64 GPUs, 48 layers, tp 8, pp 4, 3 layers per virtual stage → vpp 4, 256 micro-batches
    plan = make_plan(tp=8, pp=4, dp=2, vpp=4, mbs=1, gbs=512, fsdp="zero1", num_layers=48)
    args = parse_megatron_args(export_plan(plan, "megatron")["megatron.args"])
    assert args["num-layers-per-virtual-pipeline-stage"] == "3"
    assert args["num-layers"] == "48" and args["sequence-parallel"] is True
    assert args["use-distributed-optimizer"] is True and args["overlap-grad-reduce"] is True
    dp = 64 // (8 * 4 * 1)
    assert int(args["global-batch-size"]) // (int(args["micro-batch-size"]) * dp) == 256


def test_golden_loop_vpp_placement():
    # §4.2: tp 1, pp 4, vpp 2, 16 layers → GPU 0 holds layers 1-2 and 9-10, GPU 1 3-4 and 11-12
    plan = make_plan(pp=4, vpp=2, num_layers=16)
    args = parse_megatron_args(export_plan(plan, "megatron")["megatron.args"])
    per, pp = int(args["num-layers-per-virtual-pipeline-stage"]), 4
    stages = 16 // per
    held = {r: [l + 1 for s in range(stages) if s % pp == r for l in range(s * per, (s + 1) * per)]
            for r in range(pp)}
    assert held[0] == [1, 2, 9, 10] and held[1] == [3, 4, 11, 12]
    toml = tomllib.loads(export_plan(plan, "torchtitan")["torchtitan.toml"])
    assert toml["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert toml["parallelism"]["pipeline_parallel_layers_per_stage"] == per


def test_vpp_without_layers_needs_num_layers():
    plan = make_plan(tp=2, pp=2, dp=2, vpp=2)
    for target in ("megatron", "torchtitan"):
        with pytest.raises(SpecError) as ei:
            export_plan(plan, target)
        assert ei.value.field == "num_layers" and "--num-layers" in ei.value.fix
        files = export_plan(plan, target, num_layers=32)
        assert files


# ---- every output re-parses ------------------------------------------------------------------

@pytest.mark.parametrize("name", LAYOUTS)
@pytest.mark.parametrize("target", list(TARGETS))
def test_outputs_reparse(name, target):
    plan = make_plan(**LAYOUTS[name])
    try:
        files = export_plan(plan, target)
    except SpecError:
        assert target in ("deepspeed", "torchtitan")  # refused layouts are tested above
        return
    for fname, text in files.items():
        assert text.endswith("\n")
        if fname.endswith(".toml"):
            tomllib.loads(text)
        elif fname.endswith(".json"):
            json.loads(text)
        else:
            shlex.split(text, comments=True)


def test_torchtitan_batch_and_overrides():
    plan = make_plan(tp=2, pp=4, dp=2, mbs=2, gbs=64, seq_len=4096)
    files = export_plan(plan, "torchtitan")
    doc = tomllib.loads(files["torchtitan.toml"])
    assert doc["training"] == {"local_batch_size": 32, "global_batch_size": 64, "seq_len": 4096}
    assert doc["parallelism"]["pipeline_parallel_microbatch_size"] == 2
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
    assert doc["model"] == {"name": "llama3", "flavor": "70B"}
    toks = shlex.split(files["torchtitan.args"])
    assert toks[:4] == ["--module", "llama3", "--config", "llama3_70b"]
    over, rest = {}, toks[4:]
    while rest:
        flag, rest = rest[0], rest[1:]
        if rest and not rest[0].startswith("--"):
            over[flag], rest = rest[0], rest[1:]
        else:
            over[flag] = True
    assert over["--parallelism.tensor_parallel_degree"] == "2"
    assert over["--parallelism.pipeline_parallel_degree"] == "4"
    # torchtitan 0.3.0 reads only these overrides: the batch, the micro-batch and the sequence
    # length must be in them, and CUDA graphs off under pipeline parallelism
    assert (over["--training.local_batch_size"], over["--training.global_batch_size"],
            over["--training.seq_len"]) == ("32", "64", "4096")
    assert over["--parallelism.pipeline_parallel_microbatch_size"] == "2"
    assert over["--training.disable_cuda_graphs"] is True
    # no PP: gradient accumulation = global / (local * dp)
    doc = tomllib.loads(export_plan(make_plan(tp=2, dp=4, mbs=2, gbs=64),
                                    "torchtitan")["torchtitan.toml"])
    assert doc["training"]["local_batch_size"] == 2
    assert "pipeline_parallel_schedule" not in doc["parallelism"]


def test_zero1_noted_in_torchtitan():
    text = export_plan(make_plan(tp=2, dp=4, fsdp="zero1"), "torchtitan")["torchtitan.toml"]
    assert "zero1" in text and "DDP" in text


def test_megatron_fsdp_flags():
    args = parse_megatron_args(export_plan(make_plan(dp=8, fsdp="zero3"),
                                           "megatron")["megatron.args"])
    assert args["use-megatron-fsdp"] is True
    assert args["data-parallel-sharding-strategy"] == "optim_grads_params"
    # what Megatron-FSDP requires alongside (Megatron-LM's user guide; core 0.18+ refuses
    # to save or load FSDP checkpoints in another format)
    assert args["ckpt-format"] == "fsdp_dtensor" and args["use-distributed-optimizer"] is True
    assert args["no-gradient-accumulation-fusion"] is True
    assert "sequence-parallel" not in args
