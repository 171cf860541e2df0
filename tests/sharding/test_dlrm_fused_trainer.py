"""The fused dense part (``fusion: fused``), half-precision dense gradients under
``mixed_precision: pure``, and the named DLRM trainers (``--trainer`` on table specs)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from simulator.compute import op_time
from simulator.errors import SpecError

from planner.model.tables.dense import dense_op_list
from planner.model.tables.features import F_RW
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import (DLRM_PRESETS, DlrmTrainer, dlrm_trainer_from_args,
                                          dlrm_trainer_from_mapping)
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import build_step_workload, simulate_plan

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _ops(spec: str, batch: float, fused: bool, ew: float = 2.0):
    m = load_model_spec(spec)
    return dense_op_list(m.dense, [t.embedding_dim for t in m.tables], batch, elem_bytes=2.0,
                         elementwise_bytes=ew, fused=fused)


def _problem(trainer: DlrmTrainer, spec="mlperf-dcnv2", topo="dgx-h100", n=8):
    m = replace(load_model_spec(spec), trainer=trainer)
    return prepare(ShardingTask(model=m, topology=topo), n)


@pytest.mark.parametrize("spec", ["mlperf-dcnv2", "criteo-dlrm"])
def test_fusion_keeps_every_gemm(spec):
    """Fusing moves bytes, never FLOPs: forward and backward FLOPs are the eager list's."""
    for phase in ("fwd", "bwd"):
        eager = sum(o.flops for o in _ops(spec, 8192, False) if o.phase == phase)
        fused = sum(o.flops for o in _ops(spec, 8192, True) if o.phase == phase)
        assert fused == pytest.approx(eager, rel=1e-12)


def test_fused_dcnv2_elementwise_bytes_closed_form():
    """Closed form, bf16 activations: with bias, ReLU and their gradients in the GEMMs'
    epilogues, what moves outside GEMMs is the concatenation (2x each way), per cross layer
    ``x0 ⊙ v + x`` (4x) and its gradients (6x and the bias gradient), and the loss (3B each
    way), x = B × 3,456; under autocast (fp32 elementwise) twice that, and no cast ops."""
    B, w = 8192.0, 27 * 128
    x = B * w
    expect = 2.0 * (2 * x + 2 * x + 3 * (4 * x + 6 * x + w) + 6 * B)
    pure = [o for o in _ops("mlperf-dcnv2", B, True) if not o.flops]
    assert sum(o.bytes for o in pure) == pytest.approx(expect, rel=1e-12)
    auto = [o for o in _ops("mlperf-dcnv2", B, True, ew=4.0) if not o.flops]
    assert len(auto) == len(pure)
    assert sum(o.bytes for o in auto) == pytest.approx(2 * expect, rel=1e-12)
    eager = [o for o in _ops("mlperf-dcnv2", B, False) if not o.flops]
    assert sum(o.bytes for o in eager) > 2 * expect


def test_fused_dot_interaction_is_one_kernel_each_way():
    """criteo-dlrm fused: the ops are the MLP GEMMs (forward, dW, dX), the interaction (one
    forward, one backward) and the loss (one each way)."""
    m = load_model_spec("criteo-dlrm")
    ls = m.dense.layers([t.embedding_dim for t in m.tables])
    gemms = 3 * (len(ls["bottom"]) + len(ls["top"])) - 1        # no dX of the dense features
    ops = _ops("criteo-dlrm", 8192, True)
    assert len(ops) == gemms + 2 + 2
    assert sum(1 for o in ops if not o.flops) == 2


def test_fused_dense_part_on_h100_sits_between_gemms_alone_and_eager():
    """On the measured H100 curves: the fused dense part costs more than its GEMMs alone and
    less than the eager ops of the same precision, and the step model charges exactly its ops."""
    fused = _problem(DLRM_PRESETS["hugectr"])
    eager = _problem(replace(DLRM_PRESETS["hugectr"], fusion="none"))
    prof = fused.cost.profile

    def total(p):
        d = p.cost.dense_costs()
        return d["mlp_fwd_s"] + d["mlp_bwd_s"]

    ops = _ops("mlperf-dcnv2", fused.cost.local_batch, True)
    gemm = sum(op_time(prof, flops=o.flops, bytes_moved=o.bytes, dtype="bf16",
                       aligned=o.aligned) for o in ops if o.flops)
    every = sum(op_time(prof, flops=o.flops, bytes_moved=o.bytes, dtype="bf16",
                        aligned=o.aligned) for o in ops)
    assert [o for o in ops if not o.aligned] == [o for o in ops if o.gemm and 13 in o.gemm]
    assert total(fused) == pytest.approx(every, rel=1e-9)
    assert gemm < total(fused) < 0.8 * total(eager)


def _dense_allreduce_bytes(trainer: DlrmTrainer) -> float:
    p = _problem(trainer)
    task = ShardingTask(model=p.model, topology=p.topology_ref)
    plan = get_planner("greedy").plan(task, p.devices, seed=0)
    w, _ = build_step_workload(p, plan.shardings)
    (op,) = [o for o in w.ops if o.name == "dense_allreduce"]
    return op.bytes_moved


def test_pure_precision_all_reduces_half_precision_gradients():
    """A model whose parameters are bf16 (``pure``) has bf16 gradients: the data-parallel
    all-reduce moves 2 bytes per parameter, autocast's fp32 parameters 4, in the simulated step
    and in the cost model."""
    m = load_model_spec("mlperf-dcnv2")
    params = m.dense.param_count([t.embedding_dim for t in m.tables])
    assert _dense_allreduce_bytes(DlrmTrainer()) == pytest.approx(4.0 * params)
    assert _dense_allreduce_bytes(DlrmTrainer(mixed_precision="pure")) == pytest.approx(
        2.0 * params)
    p = _problem(DlrmTrainer(mixed_precision="pure"))
    assert p.cost.dense_costs()["dense_allreduce_s"] == pytest.approx(
        float(p.cost.comm.time("allreduce", 2.0 * params)), rel=1e-12)
    assert DlrmTrainer(mixed_precision="pure").gradient_bytes("fp32") == 4.0


def test_dense_gradients_set_what_the_dense_all_reduce_moves():
    """``dense_gradients: fp32`` (Keras ``mixed_float16``: fp32 variables, fp32 gradients)
    all-reduces 4 bytes per parameter under ``pure`` half-precision activations, which
    ``auto`` (HugeCTR's half-precision weight gradients) makes 2; ``dense`` makes autocast's
    gradients the dense dtype's. ``dle-tf2`` is ``pure`` activations with fp32 gradients."""
    m = load_model_spec("mlperf-dcnv2")
    params = m.dense.param_count([t.embedding_dim for t in m.tables])
    dle = DLRM_PRESETS["dle-tf2"]
    assert (dle.mixed_precision, dle.dense_gradients, dle.embedding_output) == \
        ("pure", "fp32", "fp32")
    assert _dense_allreduce_bytes(dle) == pytest.approx(4.0 * params)
    assert _dense_allreduce_bytes(DLRM_PRESETS["hugectr"]) == pytest.approx(2.0 * params)
    assert _dense_allreduce_bytes(DlrmTrainer(dense_gradients="dense")) == pytest.approx(
        2.0 * params)
    assert DlrmTrainer(dense_gradients="dense").gradient_bytes("fp32") == 4.0
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"dense_gradients": "fp16"}, source="s.yaml")
    assert e.value.field == "trainer.dense_gradients" and "fp32" in str(e.value)


def test_dle_tf2_differs_from_hugectr_only_in_the_embedding_and_gradient_bytes():
    """Same dense kernels (graphs, pure, fused): on ``mlperf-dcnv2``'s bf16 dense part the
    DLE preset differs from HugeCTR's by its fp32 all-to-alls and gradients, its loader's
    ids, which no all-to-all carries, and TensorFlow's scatter of the tables' gradients, so
    its step is slower."""
    def step(trainer):
        p = _problem(trainer)
        task = ShardingTask(model=p.model, topology=p.topology_ref)
        plan = get_planner("greedy").plan(task, p.devices, seed=0)
        return simulate_plan(plan, task).step_time_s
    hug, dle = DLRM_PRESETS["hugectr"], DLRM_PRESETS["dle-tf2"]
    assert replace(hug, embedding_output="fp32", dense_gradients="fp32",
                   input_dist="loader", embedding_update="scatter_add") == dle
    assert step(dle) > step(hug)


def test_presets_and_their_errors():
    assert dlrm_trainer_from_mapping({"preset": "torchrec"}, source="s") == DlrmTrainer()
    hug = dlrm_trainer_from_mapping({"preset": "hugectr"}, source="s")
    assert (hug.dispatch, hug.mixed_precision, hug.fusion) == ("graphs", "pure", "fused")
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"preset": "tensorflow"}, source="s.yaml")
    assert e.value.field == "trainer.preset" and "hugectr" in e.value.fix
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"fusion": "some"}, source="s.yaml")
    assert e.value.field == "trainer.fusion"
    got = dlrm_trainer_from_args(DlrmTrainer(pipeline="none"), "hugectr", ["fusion=none"])
    assert got == replace(DLRM_PRESETS["hugectr"], fusion="none")
    assert dlrm_trainer_from_args(hug, None, None) == hug


def test_half_embedding_output_halves_what_the_pooled_collectives_move():
    """``embedding_output: dense`` (HugeCTR under mixed precision): the pooled embeddings and
    their gradients move in the bf16 dense part's 2 bytes, not the spec's fp32, in the
    all-to-alls and the row-wise reductions, for the same plan; an fp32 dense part, or none,
    keeps fp32."""
    fp32, half = _problem(DlrmTrainer()), _problem(DlrmTrainer(embedding_output="dense"))
    assert (fp32.cost.out_bytes, half.cost.out_bytes) == (4.0, 2.0)
    task = ShardingTask(model=fp32.model, topology=fp32.topology_ref)
    plan = get_planner("greedy").plan(task, fp32.devices, seed=0)
    F32, F16 = fp32.cost.plan_features(plan.shardings), half.cost.plan_features(plan.shardings)
    for k, m in fp32.cost.a2a_matrices(F32).items():
        want = m if k == "input" else m / 2
        assert half.cost.a2a_matrices(F16)[k] == pytest.approx(want, rel=1e-12)
    assert F16[:, F_RW] == pytest.approx(F32[:, F_RW] / 2, rel=1e-12)
    assert F32[:, F_RW].max() > 0                            # the plan has row-wise tables
    dense = DlrmTrainer(embedding_output="dense")
    assert dense.pooled_bytes(2.0, "bf16") == 2.0 and dense.pooled_bytes(4.0, "fp32") == 4.0
    assert dense.pooled_bytes(4.0, None) == 4.0
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"embedding_output": "bf16"}, source="s.yaml")
    assert e.value.field == "trainer.embedding_output" and "dense" in str(e.value)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_cli_trainer_preset_on_a_table_spec(tmp_path):
    base = ("plan", "mlperf-dcnv2", "--devices", "8", "--topology", "dgx-h100", "--simulate",
            "--json")
    r = _cli(*base, "--trainer", "hugectr")
    assert r.returncode == 0, r.stderr
    sim = json.loads(r.stdout)["simulation"]
    assert sim["trainer"] == DLRM_PRESETS["hugectr"].to_dict()
    r0 = _cli(*base)
    assert r0.returncode == 0, r0.stderr
    assert sim["step_time_s"] < json.loads(r0.stdout)["simulation"]["step_time_s"]
    text = _cli(*base[:-1], "--trainer", "torchrec-compiled")
    assert text.returncode == 0, text.stderr
    assert "trainer: pipeline sparse_dist, dispatch graphs, mixed_precision autocast, " \
        "fusion compiled" in text.stdout
    bad = _cli(*base, "--trainer", "megatron-core")
    assert bad.returncode == 2 and "--trainer" in bad.stderr and "hugectr" in bad.stderr
    assert "Traceback" not in bad.stderr
    spec = tmp_path / "t.yaml"
    spec.write_text("tables: [{name: a, num_embeddings: 1000, embedding_dim: 16}]\n"
                    "trainer: {preset: hugectr, dispatch: eager}\n")
    out = tmp_path / "plan.json"
    r = _cli("plan", str(spec), "--devices", "2", "--topology", "dgx-h100", "--simulate",
             "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    trainer = json.loads(r.stdout)["simulation"]["trainer"]
    assert trainer == replace(DLRM_PRESETS["hugectr"], dispatch="eager").to_dict()


def test_a_loader_that_reads_its_tables_ids_sends_no_ids():
    """``input_dist: loader`` (DLE's model-parallel input): no ids all-to-all in the step, none
    in the cost model, the pooled all-to-alls unchanged; the same plan is never slower."""
    base = DLRM_PRESETS["dle-tf2"]
    steps = {}
    for how in ("alltoall", "loader"):
        p = _problem(replace(base, input_dist=how))
        task = ShardingTask(model=p.model, topology=p.topology_ref)
        plan = get_planner("greedy").plan(task, p.devices, seed=0)
        w, mats = build_step_workload(p, plan.shardings)
        names = {op.name for op in w.ops}
        comp = p.cost.components(p.cost.plan_features(plan.shardings))
        steps[how] = (plan, simulate_plan(plan, task), "input_a2a" in names,
                      float(comp["input_a2a_s"].max()), float(mats["output_fwd"].sum()))
    a, loader = steps["alltoall"], steps["loader"]
    assert a[2] and a[3] > 0 and a[1].a2a_bytes["input"] > 0
    assert not loader[2] and loader[3] == 0.0 and loader[1].a2a_bytes["input"] == 0.0
    if a[0].shardings == loader[0].shardings:
        assert loader[4] == a[4]
        assert loader[1].step_time_s <= a[1].step_time_s * (1 + 1e-9)
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"input_dist": "files"}, source="s.yaml")
    assert e.value.field == "trainer.input_dist" and "alltoall" in e.value.fix

