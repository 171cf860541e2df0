"""The GPU DLRM step model against one-GPU MLPerf DLRM-DCNv2 steps measured on an H200 and an
H100 (the 26 tables, at full size on the H200 and with the five 40 M-row tables cut to fit on
the H100; method in ``traces/measured/README.md``):

- ``h200/dlrm-nosync/step.csv``: fused lookups whose backward never waits for the host (as
  FBGEMM's), eager dense part under bf16 autocast — the kernel the H200's lookup constants were
  fitted to;
- ``h200/dlrm-nosync/step_graphs.csv``: the same step as a compiled trainer runs it (dense part
  through ``torch.compile``, whole step replayed from one CUDA graph), autocast and pure bf16;
- ``h200/dlrm-nosync/dense.csv``: the dense part alone per trainer mode; ``dense-dot.csv`` the
  same with the original DLRM's dot interaction, ``interaction.csv`` its kernels, and
  ``step_graphs_dot.csv`` its whole compiled step on Criteo's 26 tables;
- ``h100-sxm/dlrm-triton/step.csv``: the H100's step with the earlier kernel, whose backward
  waits for the host twice a call; the H100 takes the H200's host-free backward terms, so only its
  forward and dense part are compared.

Nothing here was fitted: the lookup constants come from the separate lookup sweeps
(``tbe.csv`` → ``traces/calibration/embedding-<gpu>.yaml``), the dense part from the GEMM
and copy curves of ``traces/efficiency/<gpu>.yaml``. The eager lookup phases also hold the
copies that turn the table-major pooled output into a batch-major one and back (~0.2 ms each
at 32,768 samples), which a TBE does not make: the comparison adds that copy, timed on the
same curves, to each predicted eager lookup phase.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from simulator.compute import load_compute_profile, op_time

from planner.model.tables.dense import INDEX_PUT_BYTES
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import DlrmTrainer
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import simulate_step

MEASURED = Path(__file__).parents[2] / "traces" / "measured"
#: each GPU's folder of eager one-GPU steps
FOLDER = {"h200": "dlrm-nosync", "h100-sxm": "dlrm-triton"}
GPUS = list(FOLDER)
#: the trainer a compiled PyTorch step runs as (``torchrec-compiled``)
COMPILED = {"dispatch": "graphs", "fusion": "compiled"}


def _steps(gpu: str, name: str = "step.csv") -> pd.DataFrame:
    return pd.read_csv(MEASURED / gpu / FOLDER[gpu] / name)


def _cap(rows: list[int], total: int) -> int:
    """The per-table row cap under which ``rows`` add up to ``total`` (what the run used)."""
    for c in sorted(set(rows), reverse=True):
        small = [r for r in rows if r < c]
        cap = (total - sum(small)) / (len(rows) - len(small))
        if cap >= max(small, default=0):
            return int(round(cap))
    return total


def _predict(batch: int, ids: str, precision: str = "autocast", gpu: str = "h200",
             table_rows: int | None = None, trainer: dict | None = None) -> dict:
    m0 = load_model_spec("mlperf-dcnv2")
    a = 0.0 if ids == "uniform" else float(ids.removeprefix("zipf"))
    cap = _cap([t.num_embeddings for t in m0.tables], table_rows) if table_rows else None
    m = replace(m0, batch_size=batch, tables=tuple(
        replace(t, zipf_exponent=a, reuse_bins=None,
                num_embeddings=min(t.num_embeddings, cap or t.num_embeddings))
        for t in m0.tables), trainer=DlrmTrainer(pipeline="none", mixed_precision=precision,
                                                 **(trainer or {})))
    topo = f"dgx-h100:gpu={gpu},nodes=1,node.gpus=1,node.nics=1"
    p = prepare(ShardingTask(model=m, topology=topo), 1)
    plan = get_planner("greedy").plan(ShardingTask(model=m, topology=p.topology_ref), 1, seed=0)
    per = simulate_step(p, plan.shardings).result.per_device()

    def dur(*names):
        return float(per[per.name.isin(names)].duration_s.sum())
    pooled = 2.0 * batch * sum(t.embedding_dim for t in m.tables) * 4      # read + write, fp32
    copy = op_time(load_compute_profile(gpu), flops=0.0, bytes_moved=pooled)
    return {"lookup_fwd_s": dur("lookups_fwd") + copy, "lookup_bwd_s": dur("lookups_bwd") + copy,
            "dense_fwd_bwd_s": dur("bottom_mlp_fwd", "interaction_top_mlp_fwd",
                                   "top_mlp_interaction_bwd", "bottom_mlp_bwd"),
            "step_s": float(per.end_s.max() - per.start_s.min())}


@pytest.fixture(scope="module", params=GPUS)
def rows(request) -> pd.DataFrame:
    gpu = request.param
    out = []
    for r in _steps(gpu).itertuples():
        pred = _predict(int(r.batch), str(r.ids), gpu=gpu, table_rows=int(r.table_rows))
        out.append({"gpu": gpu, "batch": r.batch, "ids": r.ids} | {
            f"{k}_err": pred[k] / getattr(r, k) - 1 for k in pred})
    return pd.DataFrame(out)


def test_lookups_match_the_measured_step(rows):
    big = rows[rows.batch >= 8192]
    assert len(big) == 6
    assert big.lookup_fwd_s_err.abs().max() < 0.3, big.to_string()
    if (rows.gpu == "h200").all():                  # the H100's backward kernel waited
        assert big.lookup_bwd_s_err.abs().max() < 0.3, big.to_string()
        assert big.lookup_bwd_s_err.abs().mean() < 0.15, big.to_string()


def test_dense_part_and_step_match_where_the_gpu_bounds_them(rows):
    """From 16,384 samples the eager dense part is GPU-bound (below, eager dispatch on the
    measuring host, which the shipped host floor underrates, binds: not asserted)."""
    big = rows[rows.batch >= 16384]
    assert len(big) == 4
    assert big.dense_fwd_bwd_s_err.abs().max() < 0.12, big.to_string()
    if (rows.gpu == "h200").all():
        assert big.step_s_err.abs().max() < 0.1, big.to_string()


def test_a_backward_that_waits_for_the_host_is_what_made_the_h100_step_slow():
    """Measured on the same H200: the host-free backward runs the step's lookups backward
    25–40% faster than the kernel that reads run counts back to the host; the H100's step
    measured with the latter is 30–50% above the host-free prediction, the same excess."""
    fast = _steps("h200").set_index(["batch", "ids"]).lookup_bwd_s
    slow = pd.read_csv(MEASURED / "h200" / "dlrm-triton" / "step.csv").set_index(
        ["batch", "ids"]).lookup_bwd_s
    big = [k for k in fast.index if k[0] >= 8192]
    gain = [1 - fast[k] / slow[k] for k in big]
    assert 0.25 < min(gain) and max(gain) < 0.45, gain
    for r in _steps("h100-sxm").query("batch >= 8192").itertuples():
        pred = _predict(int(r.batch), str(r.ids), gpu="h100-sxm", table_rows=int(r.table_rows))
        assert 0.25 < 1 - pred["lookup_bwd_s"] / r.lookup_bwd_s < 0.55, (r, pred)


def test_compiled_steps_replayed_from_a_cuda_graph():
    """The whole step as a compiled trainer runs it (``dispatch: graphs``, ``fusion: compiled``),
    autocast and pure bf16: within 15% from 8,192 samples per GPU, 10% from 16,384 (below, the
    kernels' fixed costs, fitted on calls of ≥ 65,536 ids, under-predict: 2,048 is −31%)."""
    for r in _steps("h200", "step_graphs.csv").query("batch >= 8192").itertuples():
        pred = _predict(int(r.batch), str(r.ids), r.precision, trainer=COMPILED)["step_s"]
        err = pred / r.graph_s - 1
        assert abs(err) < (0.10 if r.batch >= 16384 else 0.15), (r, pred)


def test_dense_part_per_trainer_mode():
    """The dense part alone: eager unfused and compiled fused with CUDA graphs, autocast and
    pure bf16, at 32,768 samples within 10% (at 8,192, eager dispatch binds and the fused
    pure part is 19% under: not asserted)."""
    for r in _steps("h200", "dense.csv").query("batch == 32768").itertuples():
        trainer = COMPILED if r.mode == "graphs" else {}
        pred = _predict(32768, "uniform", r.precision, trainer=trainer)["dense_fwd_bwd_s"]
        assert abs(pred / r.fwd_bwd_s - 1) < 0.10, (r, pred)


def test_autocast_elementwise_traffic_is_the_mechanism():
    """With the elementwise ops in bf16 and no casts (``mixed_precision: pure``) the same dense
    part is a third faster than measured: autocast runs them in fp32 and copies into bf16."""
    meas = _steps("h200").set_index(["batch", "ids"])
    m = meas.loc[(32768, "uniform")]
    pure = _predict(32768, "uniform", "pure")["dense_fwd_bwd_s"] / m.dense_fwd_bwd_s - 1
    auto = _predict(32768, "uniform")["dense_fwd_bwd_s"] / m.dense_fwd_bwd_s - 1
    assert pure < -0.25 and abs(auto) < 0.15


def _dot_dense(batch: int, precision: str, mode: str, fusion: str = "compiled") -> float:
    """Predicted forward+backward seconds of ``criteo-dlrm``'s dense part on one H200 with the
    dense dtype and trainer a ``dense-dot.csv`` row was measured with (``fusion`` for the
    ``graphs`` mode: ``compiled`` as measured, or ``fused``, a hand-written interaction)."""
    m0 = load_model_spec("criteo-dlrm")
    graphs = {"dispatch": "graphs", "fusion": fusion} if mode == "graphs" else {}
    trainer = DlrmTrainer(pipeline="none", mixed_precision="pure" if precision == "pure"
                          else "autocast", **graphs)
    m = replace(m0, batch_size=batch, trainer=trainer, dense=replace(
        m0.dense, dtype="tf32" if precision == "tf32" else "bf16"))
    p = prepare(ShardingTask(model=m, topology="dgx-h100:gpu=h200,nodes=1,node.gpus=1,"
                                              "node.nics=1"), 1)
    return sum(p.cost.dense_times().passes.values())


def test_dot_interaction_dense_part_eager_and_compiled():
    """The original DLRM's dense part (dot interaction of 27 features, a 479-wide top layer)
    at 32,768 samples, eager and compiled, bf16 autocast / pure and TF32: within 20%, where it
    was 49-74% under before the model charged the sort behind eager PyTorch's gather backward,
    the slow cuBLAS kernels of GEMMs whose rows are not a multiple of 16 bytes, and Inductor's
    batched GEMMs (``fusion: compiled``) in place of one hand-written kernel."""
    rows = _steps("h200", "dense-dot.csv").query("model == 'dlrm-dot-dense' and batch == 32768")
    assert len(rows) == 6
    for r in rows.itertuples():
        pred = _dot_dense(32768, r.precision, r.mode)
        assert abs(pred / r.fwd_bwd_s - 1) < 0.20, (r, pred)
        if r.mode == "graphs":                     # a hand-written kernel is far faster
            assert _dot_dense(32768, r.precision, "graphs", "fused") < 0.6 * r.fwd_bwd_s


def test_interaction_constants_are_the_measured_ones():
    """The unaligned-GEMM fractions in the H200 efficiency file are the measured rate of a
    479-wide layer over a 480-wide one at 32,768 samples, and the gather backward's byte cost
    reproduces the measured ``index_put_`` rows (16-40 features) within 20% at 32,768 samples
    and 30% at 8,192 (where the host's dispatch of the eager ops shows)."""
    d = _steps("h200", "interaction.csv")
    lin = d[(d.op == "linear") & (d.batch == 32768)].pivot_table(index="dtype", columns="k",
                                                                  values="seconds")
    prof = load_compute_profile("h200")
    for dtype in ("bf16", "fp16", "tf32"):
        assert prof.unaligned_gemm[dtype] == pytest.approx(lin[480][dtype] / lin[479][dtype],
                                                           abs=0.005)
    bw = prof.gpu.hbm_bandwidth_Bps
    for r in d[d.op == "tril_bwd"].itertuples():
        e = 4.0 if r.dtype == "tf32" else 2.0
        nbytes = r.batch * r.m * (r.m - 1) / 2 * (INDEX_PUT_BYTES[0] + INDEX_PUT_BYTES[1] * e)
        pred = op_time(prof, flops=0.0, bytes_moved=nbytes)
        assert abs(pred / r.seconds - 1) < (0.2 if r.batch == 32768 else 0.3), r
        assert nbytes < 1.2 * r.seconds * bw, r


def test_dot_model_step_compiled_and_replayed():
    """``criteo-dlrm`` (26 one-hot tables at full size, 96 GB, dot interaction) on one H200 as a
    compiled trainer runs it, whole step from one CUDA graph (``step_graphs_dot.csv``; row-wise
    Adagrad, as measured): within 25% at 32,768 samples in bf16 autocast, pure bf16 and TF32
    (−14 to −21%); at 8,192 −26 to −34% (not asserted: the dense part's small kernels)."""
    for r in _steps("h200", "step_graphs_dot.csv").query("batch == 32768").itertuples():
        m0 = load_model_spec("criteo-dlrm")
        trainer = DlrmTrainer(pipeline="none", mixed_precision="pure" if r.precision == "pure"
                              else "autocast", **COMPILED)
        m = replace(m0, batch_size=32768, optimizer="rowwise_adagrad", trainer=trainer,
                    tables=tuple(replace(t, zipf_exponent=0.0, reuse_bins=None)
                                 for t in m0.tables),
                    dense=replace(m0.dense, dtype="tf32" if r.precision == "tf32" else "bf16"))
        topo = "dgx-h100:gpu=h200,nodes=1,node.gpus=1,node.nics=1"
        prep = prepare(ShardingTask(model=m, topology=topo), 1)
        plan = get_planner("greedy").plan(ShardingTask(model=m, topology=prep.topology_ref), 1,
                                          seed=0)
        per = simulate_step(prep, plan.shardings).result.per_device()
        pred = float(per.end_s.max() - per.start_s.min())
        assert -0.25 < pred / r.graph_s - 1 < 0.1, (r, pred)
