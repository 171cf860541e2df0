"""DeepLearningExamples' PyTorch DLRM: its placement (``--planner dle_pytorch``), the bottom MLP
on rank 0 alone (trainer ``bottom_mlp: rank0``), the ``dle-pytorch`` preset and
``--dense-dtype``."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from simulator.errors import SpecError

from planner.model.tables.dense import dense_pass_times
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import DLRM_PRESETS, DlrmTrainer, dlrm_trainer_from_mapping
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import build_step_workload, simulate_step

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _task(trainer: DlrmTrainer, dtype="fp16", topo="dgx-a100"):
    m = load_model_spec("criteo-dlrm")
    m = replace(m, trainer=trainer, dense=replace(m.dense, dtype=dtype))
    return ShardingTask(model=m, topology=topo)


def _ranks(plan) -> list[int]:
    return [ts.shards[0].rank for ts in plan.shardings]


def test_placement_leaves_rank0_to_the_bottom_mlp_above_four_ranks():
    """criteo-dlrm on 8 ranks: rank 0 holds no table, the other 7 at most ⌈26/7⌉ = 4 each,
    every table whole; the 40M-row tables (the five largest) land on five different ranks."""
    task = _task(DLRM_PRESETS["dle-pytorch"])
    plan = get_planner("dle_pytorch").plan(task, 8)
    ranks = _ranks(plan)
    assert all(len(ts.shards) == 1 and ts.sharding_type.value == "table_wise"
               for ts in plan.shardings)
    assert 0 not in ranks
    counts = np.bincount(ranks, minlength=8)
    assert counts[1:].max() <= math.ceil(26 / 7) and counts.sum() == 26
    rows = [t.num_embeddings for t in task.model.tables]
    largest = sorted(range(26), key=lambda i: -rows[i])[:5]
    assert len({ranks[i] for i in largest}) == 5
    assert any("rank 0 holds no table" in n for n in plan.stats.notes)


def test_placement_uses_every_rank_up_to_four():
    """On 4 ranks or fewer rank 0 holds tables too (and still runs the bottom MLP): 26 tables
    in buckets of at most 7 on 4 ranks, 13 on 2."""
    for n, cap in ((2, 13), (4, 7)):
        counts = np.bincount(_ranks(get_planner("dle_pytorch").plan(
            _task(DLRM_PRESETS["dle-pytorch"]), n)), minlength=n)
        assert counts.min() > 0 and counts.max() <= cap and counts.sum() == 26


def test_bottom_output_joins_rank0s_pooled_all_to_all():
    """Closed form, fp16 dense part (pooled embeddings cast to half): rank 0 holds no table,
    so all it sends each peer is its samples' bottom output, ``b × 128 × 2`` bytes, and it gets
    the same back as gradients; every other rank sends ``b × 128 × 2`` per table it holds."""
    task = _task(DLRM_PRESETS["dle-pytorch"])
    p = prepare(task, 8)
    plan = get_planner("dle_pytorch").plan(task, 8)
    _, mats = build_step_workload(p, plan.shardings)
    b = 65536 / 8
    counts = np.bincount(_ranks(plan), minlength=8)
    fwd = mats["output_fwd"]
    for i in range(8):
        for j in range(8):
            want = 0.0 if i == j else b * 128 * 2 * (1 if i == 0 else counts[i])
            assert fwd[i, j] == pytest.approx(want, rel=1e-12)
    assert np.allclose(mats["output_bwd"], fwd.T)
    assert not mats["input"].any()                  # input_dist: loader


def test_rank0_runs_the_bottom_mlp_on_the_global_batch():
    """The bottom MLP is one op each way on rank 0 only, with the global batch's FLOPs and the
    dense model's time for 65,536 samples; it starts rank 0's step, and its backward waits for
    the gradients' all-to-all. The dense all-reduce moves the top part's fp32 gradients only."""
    task = _task(DLRM_PRESETS["dle-pytorch"])
    p = prepare(task, 8)
    plan = get_planner("dle_pytorch").plan(task, 8)
    w, _ = build_step_workload(p, plan.shardings)
    d = task.model.dense
    dims = [t.embedding_dim for t in task.model.tables]
    ls = d.layers(dims)
    fwd_flops = sum(2.0 * 65536 * i * o for i, o in ls["bottom"])
    bottoms = [o for o in w.ops if o.name.startswith("bottom_mlp")]
    assert sorted((o.name, o.ranks) for o in bottoms) == [("bottom_mlp_bwd", (0,)),
                                                         ("bottom_mlp_fwd", (0,))]
    full = dense_pass_times(d, dims, 65536, optimizer=task.model.optimizer,
                            profile=p.cost.profile, host=None, elementwise_bytes=4.0,
                            fused=True, sorted_index_put=True)
    (f,) = [o for o in bottoms if o.name == "bottom_mlp_fwd"]
    (g,) = [o for o in bottoms if o.name == "bottom_mlp_bwd"]
    assert f.flops == pytest.approx(fwd_flops) and g.flops == pytest.approx(2 * fwd_flops)
    assert f.duration_s >= full.passes["bottom", "fwd"] * (1 - 1e-9)   # eager: host floors too
    bottom_params = sum(i * o + o for i, o in ls["bottom"])
    (ar,) = [o for o in w.ops if o.name == "dense_allreduce"]
    assert ar.bytes_moved == pytest.approx(4.0 * (d.param_count(dims) - bottom_params))
    ops = simulate_step(p, plan.shardings).result.ops
    row = {n: ops[(ops.name == n) & (ops.first_rank == 0)].iloc[0]
           for n in ("bottom_mlp_fwd", "output_a2a_fwd", "output_a2a_bwd", "bottom_mlp_bwd")}
    assert row["bottom_mlp_fwd"].start_s == 0.0
    assert row["output_a2a_fwd"].start_s >= row["bottom_mlp_fwd"].end_s - 1e-12
    assert row["bottom_mlp_bwd"].start_s >= row["output_a2a_bwd"].end_s - 1e-12


def test_the_cost_model_loads_rank0_with_the_bottom_mlp():
    """The planners' cost sees rank 0's bottom MLP: its lookup phases carry the global batch's
    bottom passes, the other ranks' carry none, and the per-rank dense part leaves it out."""
    lone = prepare(_task(DLRM_PRESETS["dle-pytorch"]), 8).cost
    shared = prepare(_task(replace(DLRM_PRESETS["dle-pytorch"], bottom_mlp="data_parallel")),
                     8).cost
    F = np.zeros((8, lone.width))
    comp = lone.components(F)
    fwd, bwd, sent = lone.bottom_rank0_terms()
    assert fwd[0] > 0 and bwd[0] > 0 and not fwd[1:].any() and not bwd[1:].any()
    assert comp["lookup_fwd_s"][0] == pytest.approx(fwd[0] + lone.decompress_fwd_s)
    assert sent[0] == 128 * 2 and comp["output_a2a_fwd_s"].max() > 0
    assert not shared.bottom_rank0_terms()[0].any()
    assert lone.dense_costs()["mlp_fwd_s"] < shared.dense_costs()["mlp_fwd_s"]
    assert lone.allreduced_dense_params() < shared.allreduced_dense_params()


def test_dle_pytorch_preset_and_its_placement_beat_greedy_under_that_trainer():
    """The preset is read from DLE's code: eager, autocast, fused (apex MLP, CUDA dot), half
    embeddings after the cast, loader ids, the bottom MLP on rank 0. Under it, a plan that
    keeps rank 0 free of tables simulates faster than greedy's, which loads rank 0."""
    t = DLRM_PRESETS["dle-pytorch"]
    assert (t.dispatch, t.mixed_precision, t.fusion, t.embedding_output, t.input_dist,
            t.bottom_mlp) == ("eager", "autocast", "fused", "dense", "loader", "rank0")
    task = _task(t)
    p = prepare(task, 8)
    step = {name: simulate_step(p, get_planner(name).plan(task, 8).shardings).step_time_s
            for name in ("dle_pytorch", "greedy")}
    assert step["dle_pytorch"] < step["greedy"]
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"bottom_mlp": "rank1"}, source="s.yaml")
    assert e.value.field == "trainer.bottom_mlp" and "data_parallel" in str(e.value)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_cli_dle_pytorch_with_dense_dtype():
    r = _cli("simulate", "criteo-dlrm", "--topology", "dgx-a100", "--gpus", "8", "--trainer",
             "dle-pytorch", "--planner", "dle_pytorch", "--dense-dtype", "fp16", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["trainer"]["bottom_mlp"] == "rank0" and d["planner"] == "dle_pytorch"
    r32 = _cli("simulate", "criteo-dlrm", "--topology", "dgx-a100", "--gpus", "8", "--trainer",
               "dle-pytorch", "--planner", "dle_pytorch", "--dense-dtype", "tf32", "--json")
    assert json.loads(r32.stdout)["step_time_s"] > d["step_time_s"]
    for args, word in ((("--dense-dtype", "fp8"), "--dense-dtype"),
                       (("--trainer-set", "bottom_mlp=gpu0"), "bottom_mlp")):
        bad = _cli("simulate", "criteo-dlrm", "--topology", "dgx-a100", "--gpus", "8", *args)
        assert bad.returncode == 2 and word in bad.stderr and "Traceback" not in bad.stderr
    llm = _cli("simulate", "llama3-8b", "--topology", "dgx-h100", "--dense-dtype", "fp16")
    assert llm.returncode == 2 and "table specs" in llm.stderr and "Traceback" not in llm.stderr
