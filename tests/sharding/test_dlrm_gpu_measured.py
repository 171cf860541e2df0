"""The GPU DLRM step model against the one-GPU MLPerf DLRM-DCNv2 steps measured on an H200 and
an H100 (``traces/measured/<gpu>/dlrm-triton/step.csv``: the 26 tables, at full size on the H200
and with the five 40 M-row tables cut to fit on the H100, fused lookups, eager dense part under
bf16 autocast; method in ``traces/measured/README.md``).

Nothing here was fitted: the lookup constants come from the separate lookup sweep of the same
run (``tbe.csv`` → ``traces/calibration/embedding-<gpu>.yaml``), the dense part from the GEMM
and copy curves of ``traces/efficiency/<gpu>.yaml``. The measured lookup phases also hold the
copies that turn the table-major pooled output into a batch-major one and back (~0.2 ms each
at 32,768 samples), which a TBE does not make: the comparison adds that copy, timed on the
same H200 curves, to each predicted lookup phase.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from simulator.compute import load_compute_profile, op_time

from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import DlrmTrainer
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import simulate_step

MEASURED = Path(__file__).parents[2] / "traces" / "measured"
GPUS = ["h200", "h100-sxm"]


def _steps(gpu: str) -> pd.DataFrame:
    return pd.read_csv(MEASURED / gpu / "dlrm-triton" / "step.csv")


def _cap(rows: list[int], total: int) -> int:
    """The per-table row cap under which ``rows`` add up to ``total`` (what the run used)."""
    for c in sorted(set(rows), reverse=True):
        small = [r for r in rows if r < c]
        cap = (total - sum(small)) / (len(rows) - len(small))
        if cap >= max(small, default=0):
            return int(round(cap))
    return total


def _predict(batch: int, ids: str, precision: str = "autocast", gpu: str = "h200",
             table_rows: int | None = None) -> dict:
    m0 = load_model_spec("mlperf-dcnv2")
    a = 0.0 if ids == "uniform" else float(ids.removeprefix("zipf"))
    cap = _cap([t.num_embeddings for t in m0.tables], table_rows) if table_rows else None
    m = replace(m0, batch_size=batch, tables=tuple(
        replace(t, zipf_exponent=a, reuse_bins=None,
                num_embeddings=min(t.num_embeddings, cap or t.num_embeddings))
        for t in m0.tables), trainer=DlrmTrainer(pipeline="none", mixed_precision=precision))
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
    for col in ("lookup_fwd_s_err", "lookup_bwd_s_err"):
        assert big[col].abs().max() < 0.3, big.to_string()
    assert big.lookup_bwd_s_err.abs().mean() < 0.15, big.to_string()


def test_dense_part_and_step_match_where_the_gpu_bounds_them(rows):
    """From 16,384 samples the eager dense part is GPU-bound (below, eager dispatch on the
    measuring host, which the shipped host floor underrates, binds: not asserted)."""
    big = rows[rows.batch >= 16384]
    assert len(big) == 4
    assert big.dense_fwd_bwd_s_err.abs().max() < 0.12, big.to_string()
    assert big.step_s_err.abs().max() < 0.1, big.to_string()


def test_autocast_elementwise_traffic_is_the_mechanism():
    """With the elementwise ops in bf16 and no casts (``mixed_precision: pure``) the same dense
    part is a third faster than measured: autocast runs them in fp32 and copies into bf16."""
    meas = _steps("h200").set_index(["batch", "ids"])
    m = meas.loc[(32768, "uniform")]
    pure = _predict(32768, "uniform", "pure")["dense_fwd_bwd_s"] / m.dense_fwd_bwd_s - 1
    auto = _predict(32768, "uniform")["dense_fwd_bwd_s"] / m.dense_fwd_bwd_s - 1
    assert pure < -0.25 and abs(auto) < 0.15
