"""The GPU DLRM step built from its costs: dense ops one by one on the measured curves with the
host's dispatch floor, the dense optimizer, TorchRec's pipelined input dist, the measured
row-gather constants and the flags for inputs outside what they were measured on."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from simulator.compute import op_time
from simulator.errors import SpecError

from planner.measure.tables.fit_gpu import fit_fused_tbe, fit_gpu_embedding
from planner.model.llm.host import host_overhead_for
from planner.model.tables.dense import ACTIVATION_BYTES, dense_op_list, dense_pass_times
from planner.model.tables.gpu_lookup import load_gpu_lookup
from planner.model.tables.shards import table_wise
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import DLRM_PRESETS, DlrmTrainer, dlrm_trainer_from_mapping
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.dense import mlp_flops
from planner.workloads.dlrm.step import simulate_step

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _problem(spec="mlperf-dcnv2", topo="dgx-h100", n=8, **trainer):
    m = load_model_spec(spec)
    if trainer:
        m = replace(m, trainer=DlrmTrainer(**trainer))
    return prepare(ShardingTask(model=m, topology=topo), n)


def test_dense_ops_count_every_gemm_of_the_model():
    """Closed form: the op list's GEMM FLOPs are the forward's (mlp_flops) once forward and twice
    backward, less the bottom MLP's first input gradient (dense features need none)."""
    p = _problem()
    d, dims, b = p.model.dense, [t.embedding_dim for t in p.model.tables], p.cost.local_batch
    ops = dense_op_list(d, dims, b, elem_bytes=2.0)
    fl = mlp_flops(p)
    fwd = sum(op.flops for op in ops if op.phase == "fwd")
    bwd = sum(op.flops for op in ops if op.phase == "bwd")
    first = 2.0 * b * d.num_dense_features * d.bottom_mlp[0]
    assert fwd == pytest.approx(fl["bottom"] + fl["top"], rel=1e-12)
    assert bwd == pytest.approx(2 * (fl["bottom"] + fl["top"]) - first, rel=1e-12)
    ops4 = dense_op_list(d, dims, b, elem_bytes=4.0)
    assert sum(x.bytes for x in ops4) == pytest.approx(2 * sum(x.bytes for x in ops), rel=1e-12)


def test_dcnv2_elementwise_traffic_is_not_free_on_h100():
    """At 8,192 samples per GPU DCNv2's eager elementwise ops (3,456-wide activations) take more
    than half the GEMMs' time: a roofline of the FLOPs alone misses it. Under autocast (the
    default) they move fp32 elements, with ``mixed_precision: pure`` bf16 ones (kernel times
    only: ``dispatch: graphs``, no host floor)."""
    p = _problem()
    d, dims = p.model.dense, [t.embedding_dim for t in p.model.tables]
    prof = p.cost.profile
    for trainer, ew in ((DlrmTrainer(dispatch="graphs"), 4.0),
                        (DlrmTrainer(dispatch="graphs", mixed_precision="pure"), 2.0)):
        ops = dense_op_list(d, dims, p.cost.local_batch, elem_bytes=ACTIVATION_BYTES["bf16"],
                            elementwise_bytes=ew)
        gemm = sum(op_time(prof, flops=o.flops, bytes_moved=o.bytes, dtype="bf16") for o in ops
                   if o.flops)
        elem = sum(op_time(prof, flops=0.0, bytes_moved=o.bytes) for o in ops if not o.flops)
        assert elem > 0.5 * gemm
        dense = _problem(**trainer.to_dict()).cost.dense_costs()
        assert dense["mlp_fwd_s"] + dense["mlp_bwd_s"] == pytest.approx(gemm + elem, rel=0.02)


def test_eager_dispatch_floor_binds_at_small_batches_only():
    p = _problem()
    d, dims = p.model.dense, [t.embedding_dim for t in p.model.tables]
    host = host_overhead_for("h100-sxm")
    kw = dict(optimizer="adagrad", profile=p.cost.profile)
    tiny = dense_pass_times(d, dims, 64, host=host, **kw)
    graphs = dense_pass_times(d, dims, 64, host=None, **kw)
    n_fwd = sum(1 for op in dense_op_list(d, dims, 64) if op[1] == "fwd")
    fwd = sum(v for (_, ph), v in tiny.passes.items() if ph == "fwd")
    assert tiny.host_bound_ops > tiny.ops // 2
    assert fwd >= n_fwd * host.forward_op_s * (1 - 1e-9)
    assert sum(graphs.passes.values()) < 0.6 * sum(tiny.passes.values())
    big = dense_pass_times(d, dims, 8192, host=host, **kw)
    assert big.host_bound_ops < big.ops // 3          # only the tiny ones (biases, loss)


def test_dense_optimizer_streams_its_state_once():
    p = _problem()
    d, dims = p.model.dense, [t.embedding_dim for t in p.model.tables]
    params = d.param_count(dims)
    opt = p.cost.dense_times().optimizer_s
    hbm = p.topology.gpu.hbm_bandwidth_Bps
    # rowwise_adagrad dense: weights, gradient, accumulator read, weights, accumulator written
    assert 20 * params / hbm < opt < 20 * params / (0.5 * hbm)


def _plan_and_sim(problem, **kw):
    task = ShardingTask(model=problem.model, topology=problem.topology_ref)
    plan = get_planner("greedy").plan(task, problem.devices, seed=0)
    return simulate_step(problem, plan.shardings, **kw)


def _all_on_rank0(problem):
    """Every table table-wise on rank 0 (memory aside): every rank sends rank 0 all its ids, an
    ids all-to-all longer than the bottom MLP, so waiting for it would show."""
    return [table_wise(i, t.name, t.num_embeddings, t.embedding_dim, 0)
            for i, t in enumerate(problem.model.tables)]


def test_pipelined_input_dist_overlaps_the_lookups():
    p, q = _problem(), _problem(pipeline="none")
    piped, plain = simulate_step(p, _all_on_rank0(p)), simulate_step(q, _all_on_rank0(q))
    per = piped.result.per_device()
    look = per[per.name == "lookups_fwd"].start_s.max()
    bottom = per[per.name == "bottom_mlp_fwd"].end_s.max()
    assert look <= bottom + 1e-12                         # right after the bottom MLP: no wait
    assert look < per[per.name == "input_a2a"].end_s.max()    # for this batch's ids
    per2 = plain.result.per_device()
    ids_end = per2[per2.name == "input_a2a"].end_s.max()
    assert per2[per2.name == "lookups_fwd"].start_s.min() >= ids_end - 1e-12
    assert piped.step_time_s < plain.step_time_s


@pytest.mark.parametrize("gpu, folder", [("h100-sxm", "dlrm-triton"), ("h200", "dlrm-nosync")])
def test_gpu_lookup_constants_are_the_measured_fit(gpu, folder):
    """Each shipped file is the fit of the fused lookups measured on that GPU; the H100's
    backward terms are the H200's host-free kernel's (its own kernel waited for the host)."""
    shipped = load_gpu_lookup(gpu)
    refit = fit_fused_tbe(REPO / "traces" / "measured" / gpu / folder, gpu)
    assert shipped.hbm_efficiency == pytest.approx(refit["hbm_efficiency"], abs=2e-3)
    assert shipped.repeat_hit_ratio == pytest.approx(refit["repeat_hit_ratio"], abs=2e-3)
    assert refit["fit"]["mape"] < 0.15 and refit["fit_backward"]["mape"] < 0.2
    assert not shipped.transferred
    host_free = fit_fused_tbe(REPO / "traces" / "measured" / "h200" / "dlrm-nosync", "h200")
    assert shipped.backward["id_bytes"] == pytest.approx(host_free["backward"]["id_bytes"],
                                                         rel=0.01)
    assert shipped.backward["call_s"] == pytest.approx(host_free["backward"]["call_s"], rel=0.01)
    assert shipped.backward_from == ("h200" if gpu == "h100-sxm" else "")
    assert "GPU's time alone" in host_free["method"]        # fitted to the CUDA-graph replays


def test_unmeasured_gpus_take_the_nearest_bandwidth_measured_constants():
    """A100s (2.0 TB/s) take the H100's (3.35) fractions, a B200 (8 TB/s) the H200's (4.8)."""
    for gpu, ref in (("a100-80gb", "h100-sxm"), ("a100-40gb", "h100-sxm"), ("b200", "h200")):
        gl = load_gpu_lookup(gpu)
        assert gl.transferred and gl.measured_on == ref and gl.gpu == gpu
        assert gl.hbm_efficiency == load_gpu_lookup(ref).hbm_efficiency
    torch_fit = fit_gpu_embedding(REPO / "traces" / "measured" / "h100-sxm", "h100-sxm")
    assert torch_fit["fit"]["mape"] < 0.15          # nn.EmbeddingBag's own sweep still fits
    cm = _problem().cost
    shipped = load_gpu_lookup("h100-sxm")
    assert cm.hbm_Bps == pytest.approx(cm.topo.gpu.hbm_bandwidth_Bps * shipped.hbm_efficiency)
    assert cm.config.backward is not None and cm.bwd_call_s == shipped.backward["call_s"]
    assert load_gpu_lookup("cpu") is None


def test_extrapolation_is_flagged():
    within = ModelSpec(name="w", batch_size=16384, tables=(
        TableSpec(name="a", num_embeddings=10_000_000, embedding_dim=64, pooling_factor=20),))
    p = prepare(ShardingTask(model=within, topology="dgx-h100:gpu=h200"), 8)
    assert p.cost.extrapolated() == []
    wide = replace(within, tables=(replace(within.tables[0], embedding_dim=512,
                                           pooling_factor=200),), batch_size=131072)
    lines = prepare(ShardingTask(model=wide, topology="dgx-h100:gpu=h200"), 8).cost.extrapolated()
    text = " ".join(lines)
    assert "embedding_dim of a (512)" in text and "pooling_factor of a (200)" in text
    assert "batch 131,072" in text and "embedding-h200.yaml" in text
    h100 = prepare(ShardingTask(model=within, topology="dgx-h100"), 8).cost.extrapolated()
    assert len(h100) == 1 and "backward constants measured on h200" in h100[0]
    other = prepare(ShardingTask(model=within, topology="dgx-a100"), 8).cost.extrapolated()
    assert len(other) == 1 and "measured on h100-sxm" in other[0] and "a100-80gb" in other[0]


def test_cpu_profile_range_comes_from_its_points():
    p = prepare(ShardingTask(model=load_model_spec("criteo-dlrm").with_overrides(
        batch_size=2048), topology="localhost-gloo:node.gpus=8"), 8)
    rng = p.cost.fit_range
    assert rng is not None and rng.source == "cpu-embedding.yaml"
    assert rng.embedding_dim[0] >= 1 and rng.batch[1] >= rng.batch[0] > 0
    assert any("embedding_dim" in x for x in p.cost.extrapolated()) == (
        not rng.embedding_dim[0] <= 128 <= rng.embedding_dim[1])


def test_trainer_section_parses_and_rejects():
    assert dlrm_trainer_from_mapping(None, source="s") == DlrmTrainer()
    compiled = dlrm_trainer_from_mapping({"preset": "torchrec-compiled"}, source="s")
    assert compiled.fused and compiled.gemm_interaction and compiled.dispatch == "graphs"
    assert not DLRM_PRESETS["hugectr"].gemm_interaction and DLRM_PRESETS["hugectr"].fused
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"pipeline": "sometimes"}, source="s.yaml")
    assert e.value.field == "trainer.pipeline"
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"cuda_graph": True}, source="s.yaml")
    assert e.value.field == "trainer.cuda_graph"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_cli_trainer_set_and_throughput(tmp_path):
    r = _cli("plan", "mlperf-dcnv2", "--devices", "8", "--topology", "dgx-h100", "--simulate",
             "--json", "--trainer-set", "dispatch=graphs")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    sim = doc["simulation"]
    assert sim["trainer"] == {"pipeline": "sparse_dist", "dispatch": "graphs",
                              "mixed_precision": "autocast", "fusion": "none",
                              "embedding_output": "fp32", "dense_gradients": "auto",
                              "input_dist": "alltoall", "bottom_mlp": "data_parallel",
                              "embedding_update": "fused", "output_dist": "flat"}
    assert sim["samples_per_s"] == pytest.approx(65536 / sim["step_time_s"])
    assert any("pooling_factor" in x for x in doc["extrapolated"])
    bad = _cli("plan", "mlperf-dcnv2", "--devices", "8", "--topology", "dgx-h100",
               "--trainer-set", "dispatch=sometimes")
    assert bad.returncode == 2 and "dispatch" in bad.stderr and "Traceback" not in bad.stderr
    spec = tmp_path / "t.yaml"
    spec.write_text("tables: [{name: a, num_embeddings: 1000, embedding_dim: 16}]\n"
                    "trainer: {pipeline: maybe}\n")
    bad = _cli("plan", str(spec), "--devices", "2", "--topology", "dgx-h100")
    assert bad.returncode == 2 and "trainer.pipeline" in bad.stderr


def test_cli_calibrate_gpu_embedding_writes_a_loadable_file(tmp_path):
    out = tmp_path / "e.yaml"
    r = _cli("calibrate", "gpu-embedding", "traces/measured/h200", "--gpu", "h200",
             "--out", str(out))
    assert r.returncode == 0, r.stderr
    import yaml
    doc = yaml.safe_load(out.read_text())
    assert doc["range"]["embedding_dim"] == [16, 256] and "EmbeddingBag" in doc["kernel"]
    r = _cli("calibrate", "gpu-embedding", "traces/measured/h200/dlrm-nosync", "--gpu", "h200",
             "--out", str(out))
    assert r.returncode == 0 and "backward MAPE" in r.stdout, r.stderr
    doc = yaml.safe_load(out.read_text())
    assert doc["hbm_efficiency"] == pytest.approx(load_gpu_lookup("h200").hbm_efficiency,
                                                  abs=2e-3)
    assert "fused" in doc["kernel"] and doc["range"]["embedding_dim"] == [32, 256]
    r = _cli("calibrate", "gpu-embedding", str(tmp_path), "--gpu", "h200")
    assert r.returncode == 2 and "embedding.csv" in r.stderr
    r = _cli("calibrate", "gpu-embedding", "traces/measured/h100-sxm/dlrm-triton", "--gpu",
             "h100-sxm", "--backward-from", "h200", "--out", str(out))
    doc = yaml.safe_load(out.read_text())
    assert r.returncode == 0 and doc["backward_from"] == "h200" and "backward" not in doc
    assert doc["own_backward"]["call_s"] > 4 * load_gpu_lookup("h200").backward["call_s"]
    for kind in ("a100-80gb", "h100-sxm", "nope"):      # no own backward, itself, unknown
        r = _cli("calibrate", "gpu-embedding", "traces/measured/h100-sxm/dlrm-triton", "--gpu",
                 "h100-sxm", "--backward-from", kind, "--out", str(tmp_path / "x.yaml"))
        assert r.returncode == 2 and "--backward-from" in r.stderr, (kind, r.stderr)
        assert "Traceback" not in r.stderr and not (tmp_path / "x.yaml").exists()


def test_step_time_rises_with_dense_work_not_by_a_factor():
    """The step's dense categories are the op-by-op passes, not a multiple of the roofline."""
    p = _problem()
    sim = _plan_and_sim(p)
    d = p.cost.dense_costs()
    assert sim.breakdown_s["mlp_fwd"] == pytest.approx(d["mlp_fwd_s"], rel=1e-9)
    assert sim.breakdown_s["mlp_bwd"] == pytest.approx(d["mlp_bwd_s"], rel=1e-9)
    assert sim.breakdown_s["optimizer"] == pytest.approx(d["optimizer_s"], rel=1e-9)
    assert np.isfinite(sim.step_time_s) and sim.step_time_s > d["mlp_fwd_s"] + d["mlp_bwd_s"]


def test_cli_simulate_resimulates_a_sharding_plan(tmp_path):
    plan = tmp_path / "plan.json"
    # the random plan's ids all-to-all outlasts the bottom MLP, so waiting for it shows
    r = _cli("plan", "mlperf-dcnv2", "--devices", "8", "--topology", "dgx-h100", "--simulate",
             "--planner", "random", "--json", "--out", str(plan))
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)["simulation"]["step_time_s"]
    r = _cli("simulate", str(plan), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["step_time_s"] == pytest.approx(planned, rel=1e-12)
    assert doc["topology"] == "dgx-h100" and doc["devices"] == 8
    r = _cli("simulate", str(plan), "--json", "--trainer-set", "pipeline=none")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["step_time_s"] > planned       # lookups wait for the ids
    r = _cli("simulate", str(plan), "--topology", "dgx-h100:nodes=2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["topology"] == "dgx-h100:nodes=2"
    bad = _cli("simulate", str(plan), "--trainer", "megatron-core")
    assert bad.returncode == 2 and "--trainer" in bad.stderr
    bad = _cli("simulate", "dp-step")
    assert bad.returncode == 2 and "--topology" in bad.stderr


def test_cli_simulate_a_table_spec_plans_it_with_greedy_first(tmp_path):
    """``simulate TABLES`` is ``plan TABLES --simulate`` with greedy: the same step, the
    trainer and batch flags applied, the topology grown to --gpus, bad flags refused."""
    r = _cli("plan", "mlperf-dcnv2", "--devices", "16", "--topology", "dgx-h100", "--simulate",
             "--json", "--trainer", "hugectr", "--batch-size", "32768")
    assert r.returncode == 0, r.stderr
    planned = json.loads(r.stdout)
    r = _cli("simulate", "mlperf-dcnv2", "--topology", "dgx-h100", "--gpus", "16", "--json",
             "--trainer", "hugectr", "--global-batch", "32768")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["step_time_s"] == pytest.approx(planned["simulation"]["step_time_s"], rel=1e-12)
    assert doc["topology"] == planned["topology"] == "dgx-h100:nodes=2"
    assert doc["planner"] == "greedy" and doc["devices"] == 16 and doc["batch_size"] == 32768
    assert doc["trainer"]["mixed_precision"] == "pure"
    r = _cli("simulate", "criteo-dlrm", "--topology", "dgx-a100")     # every GPU of it
    assert r.returncode == 0 and "on 8 × a100-80gb" in r.stdout and "plan: greedy" in r.stdout
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\na,1000,16,2\nb,50,8,1\n")
    r = _cli("simulate", str(csv), "--topology", "dgx-h100", "--gpus", "2", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["devices"] == 2, r.stderr
    for flags, field in ((["--parallel", "tp=2"], "--parallel"),
                         (["--global-batch", "0"], "--global-batch"),
                         (["--trainer", "megatron-core"], "--trainer")):
        bad = _cli("simulate", "mlperf-dcnv2", "--topology", "dgx-h100", *flags)
        assert bad.returncode == 2 and field in bad.stderr and "Traceback" not in bad.stderr


def test_autocast_casts_are_ops():
    """Closed form: under autocast every weight and bias is copied to bf16 forward and its
    gradient back to fp32 (8 MLP layers + 3 DCNv2 layers of two weights and a bias), and so
    is each fp32 GEMM input: the dense features (no gradient), the top MLP's and every DCNv2
    layer's 3,456-wide input."""
    m = load_model_spec("mlperf-dcnv2")
    d, dims, b = m.dense, [t.embedding_dim for t in m.tables], 8192
    auto = dense_op_list(d, dims, b, elem_bytes=2.0, elementwise_bytes=4.0)
    pure = dense_op_list(d, dims, b, elem_bytes=2.0, elementwise_bytes=2.0)
    extra = len(auto) - len(pure)
    fwd = 2 * 8 + 3 * 3 + 1 + 1 + 3           # params, then inputs: bottom, top, DCNv2
    bwd = 2 * 8 + 3 * 3 + 1 + 3
    assert extra == fwd + bwd
    x = b * 27 * 128
    big = [o for o in auto if o.bytes == pytest.approx(6.0 * x) and not o.flops]
    assert len(big) == 2 * 4                  # x copied 4 times forward, 4 gradients back


def test_cli_calibrate_gpu_embedding_rejects_bad_measurements(tmp_path):
    head = "tables,rows,dim,pooling,batch,dtype,lookups,distinct,forward_s,backward_s\n"
    out = tmp_path / "o.yaml"
    for row, field in (("x,1,2,3,4,fp32,5,6,7,8", "tables"), ("1,1,2,3,4,fp8,5,6,7,8", "dtype"),
                       ("1,1,2,3,4,fp32,5,6,nan,8", "forward_s")):
        (tmp_path / "tbe.csv").write_text(head + row + "\n")
        r = _cli("calibrate", "gpu-embedding", str(tmp_path), "--gpu", "h200", "--out", str(out))
        assert r.returncode == 2 and field in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not out.exists()
