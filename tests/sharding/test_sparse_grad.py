"""The trainer's ``embedding_update: sparse_grad`` (PyTorch's sparse-gradient embedding path,
as DeepLearningExamples' PyTorch DLRM runs it): each pass priced against its bytes by hand, the
cost model's calls and features, the step and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from simulator.errors import SpecError

from planner.model.tables.cost_config import CostConfig
from planner.model.tables.features import F_BWD, F_FWD
from planner.model.tables.lookup_cost import SparseGradPath, shard_lookup_s
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import DLRM_PRESETS, dlrm_trainer_from_mapping
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import simulate_step

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
TW = ShardingType.TABLE_WISE


def _lookup(t, *, ids, outputs, out_bytes, sparse, apr=1.0, cfg=CostConfig()):
    return shard_lookup_s(t, t.num_embeddings, t.embedding_dim, TW, ids=ids, outputs=outputs,
                          apr=apr, cfg=cfg, Bps=1e12, out_bytes=out_bytes, element_bytes=4.0,
                          optimizer="sgd", sparse=sparse)


def test_each_pass_costs_its_bytes():
    """A pooling-1 fp32 table of 128 columns, 1,000 ids into 10⁶ rows (every id a distinct
    row, apr 1, so every id reads HBM), lookup bandwidth 1 TB/s, streaming 2 TB/s, half
    embedding output, fp16 unscale. By hand, bytes:
    - row reads: 1,000 × (128·4 + 64 overhead + 8 id) = 584,000; the forward writes
      1,000 × 512 fp32 rows; the cast reads those and writes half: 1,000 × 128 × 6;
    - backward: the cast back (768,000 streamed), the unscale (2 × 512,000 streamed), the
      index_add's values (512,000 streamed), its row reads (584,000) and write-backs
      (512,000) at the lookup bandwidth; and each call's 2 µs shard overhead."""
    t = TableSpec(name="t", num_embeddings=10**6, embedding_dim=128)
    path = SparseGradPath(stream_Bps=2e12, scale_pass=True)
    fwd, bwd = _lookup(t, ids=1000, outputs=1000, out_bytes=2.0, sparse=path)
    assert fwd == pytest.approx((584_000 + 512_000) / 1e12 + 768_000 / 2e12 + 2e-6)
    assert bwd == pytest.approx((768_000 + 1_024_000 + 512_000) / 2e12
                                + (584_000 + 512_000) / 1e12 + 2e-6)
    f32, b32 = _lookup(t, ids=1000, outputs=1000, out_bytes=4.0,
                       sparse=replace(path, scale_pass=False))
    assert fwd - f32 == pytest.approx(768_000 / 2e12)       # no cast at fp32
    assert bwd - b32 == pytest.approx((768_000 + 1_024_000) / 2e12)


def test_pooled_ids_are_expanded_and_repeats_read_the_cache():
    """Pooling 4 (4,000 ids for 1,000 outputs) copies each bag's gradient row to its ids
    ((4,000 + 1,000) × 512 B streamed); with 4 accesses per row, a quarter of the ids are
    first touches and the repeats hit L2 at 0.8: misses 0.25 + 0.75 × 0.2 = 0.4 of the ids,
    and 1,000 distinct rows are written back."""
    t = TableSpec(name="t", num_embeddings=10**6, embedding_dim=128, pooling_factor=4.0)
    path = SparseGradPath(stream_Bps=2e12, scale_pass=False)
    fwd, bwd = _lookup(t, ids=4000, outputs=1000, out_bytes=4.0, sparse=path, apr=4.0)
    reads = 4000 * (0.4 * 512 + 64 + 8)
    assert fwd == pytest.approx((reads + 1000 * 512) / 1e12 + 2e-6)
    assert bwd == pytest.approx((5000 * 512 + 4000 * 512) / 2e12
                                + (reads + 1000 * 512) / 1e12 + 2e-6)
    fused = _lookup(t, ids=4000, outputs=1000, out_bytes=4.0, sparse=None, apr=4.0)
    assert fused[1] == pytest.approx(2 * (fused[0] - 2e-6) + 2e-6)   # the prior's 2× rule


def _task(update: str, dtype="fp16"):
    m = load_model_spec("criteo-dlrm")
    trainer = replace(DLRM_PRESETS["dle-pytorch"], embedding_update=update)
    return ShardingTask(model=replace(m, trainer=trainer, dense=replace(m.dense, dtype=dtype)),
                        topology="dgx-a100")


def test_cost_model_prices_the_path_per_rank():
    """Under fp16 the path unscales and casts: two forward ops and three backward ops per
    lookup call; a rank's forward features grow by its shards' fp32 writes and casts, as the
    streaming bandwidth of the A100's memory curve prices them."""
    sparse, fused = prepare(_task("sparse_grad"), 8), prepare(_task("fused"), 8)
    cs, cf = sparse.cost, fused.cost
    assert cs.sparse_grad.scale_pass and cf.sparse_grad is None
    assert any("sparse_grad" in x for x in cs.extrapolated())
    assert not any("sparse_grad" in x for x in cf.extrapolated())
    assert cs.fwd_call_s >= 2 * cs.launch_s and cs.bwd_call_s >= 3 * cs.launch_s
    assert prepare(_task("sparse_grad", "tf32"), 8).cost.sparse_grad.scale_pass is False
    plan = get_planner("dle_pytorch").plan(_task("sparse_grad"), 8).shardings
    Fs, Ff = cs.plan_features(plan), cf.plan_features(plan)
    S = cs.sparse_grad.stream_Bps
    assert 1.0e12 < S <= 2.039e12                     # A100 80GB's HBM, at most its peak
    per_rank = np.zeros(8)
    for ts in plan:
        t = cs.model.tables[ts.table]
        for sh in ts.shards:
            per_rank[sh.rank] += 65536 * sh.cols * (2.0 / cs.hbm_Bps + 6.0 / S)
    assert np.allclose(Fs[:, F_FWD] - Ff[:, F_FWD], per_rank, rtol=1e-9, atol=1e-12)
    assert (Fs[1:, F_BWD] > Ff[1:, F_BWD]).all() and Fs[0, F_BWD] == Ff[0, F_BWD] == 0.0
    steps = {u: simulate_step(p, plan).step_time_s for u, p in (("sparse", sparse),
                                                                ("fused", fused))}
    assert steps["sparse"] > steps["fused"]


def test_bad_value_names_the_key():
    with pytest.raises(SpecError) as e:
        dlrm_trainer_from_mapping({"embedding_update": "dense"}, source="s.yaml")
    assert e.value.field == "trainer.embedding_update" and "sparse_grad" in str(e.value)
    assert DLRM_PRESETS["dle-pytorch"].sparse_grad and not DLRM_PRESETS["torchrec"].sparse_grad


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_cli_trainer_set_embedding_update():
    base = ("simulate", "criteo-dlrm", "--topology", "dgx-a100", "--gpus", "8", "--trainer",
            "dle-pytorch", "--planner", "dle_pytorch", "--dense-dtype", "fp16", "--json")
    r = _cli(*base)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["trainer"]["embedding_update"] == "sparse_grad"
    f = json.loads(_cli(*base, "--trainer-set", "embedding_update=fused").stdout)
    assert d["step_time_s"] > f["step_time_s"]
    bad = _cli(*base, "--trainer-set", "embedding_update=sgd")
    assert bad.returncode == 2 and "embedding_update" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_per_peer_output_dist_copies_the_pieces_each_way():
    """``output_dist: per_peer`` (DLE's ``BottomToTop``): the 26 pooled 128-wide rows and
    the bottom MLP's 128-wide output, half precision under fp16: 27 × 128 × 2 = 6,912 bytes
    per sample concatenated forward and copied contiguous backward, each op reading and
    writing them; none on one rank, none under ``flat``."""
    from planner.model.tables.dense import dense_op_list

    per = prepare(_task("sparse_grad"), 8).cost
    assert per._a2a_copy_bytes([128] * 26) == 27 * 128 * 2
    flat_task = _task("sparse_grad")
    flat_task = replace(flat_task, model=replace(
        flat_task.model, trainer=replace(flat_task.model.trainer, output_dist="flat")))
    assert prepare(flat_task, 8).cost._a2a_copy_bytes([128] * 26) == 0.0
    assert prepare(_task("sparse_grad"), 1).cost._a2a_copy_bytes([128] * 26) == 0.0
    d = per.model.dense
    base = dense_op_list(d, [128] * 26, 8192, elem_bytes=2.0, fused=True)
    ops = dense_op_list(d, [128] * 26, 8192, elem_bytes=2.0, fused=True, a2a_copy_bytes=6912)
    extra = [op for op in ops if op not in base]
    assert len(ops) == len(base) + 2 and {op.phase for op in extra} == {"fwd", "bwd"}
    assert all(op.bytes == 2 * 8192 * 6912 and op.out_bytes == 8192 * 6912 for op in extra)
    with_copies = per.dense_times().passes
    without = prepare(flat_task, 8).cost.dense_times().passes
    assert with_copies[("top", "fwd")] > without[("top", "fwd")]
    assert with_copies[("top", "bwd")] > without[("top", "bwd")]


def test_tensorflow_scatter_add_path():
    """``scatter_add`` (DLE's TF2 DLRM): a multi-hot table's gradient op merges its ids into
    one row per distinct id: 4,000 ids of 1,000 bags into 1,000 distinct rows cost the sort
    (4,000 × 629 B-equivalents, PyTorch's measured sort-based index_put_), each id's bag
    gradient read and the merged rows written ((4,000 + 1,000) × 512 B); SGD's ``−lr · g``
    rewrites those rows (2 × 1,000 × 512 B); the scatter streams them and reads and writes each
    distinct row in memory (1,000 × (2 × 512 + 64 + 8) B at the lookup bandwidth)."""
    t = TableSpec(name="t", num_embeddings=10**6, embedding_dim=128, pooling_factor=4.0)
    path = SparseGradPath(stream_Bps=2e12, scale_pass=True, merged_bags=True)
    fwd, bwd = _lookup(t, ids=4000, outputs=1000, out_bytes=4.0, sparse=path, apr=4.0)
    assert bwd == pytest.approx((4000 * 629 + 5000 * 512 + 1000 * 1024 + 1000 * 512) / 2e12
                                + 1000 * 1096 / 1e12 + 2e-6)
    one_hot = TableSpec(name="t", num_embeddings=10**6, embedding_dim=128)
    merged = SparseGradPath(stream_Bps=2e12, scale_pass=False, dedup=True)
    _, b = _lookup(one_hot, ids=1000, outputs=1000, out_bytes=4.0, sparse=merged, apr=2.0)
    # Adam's merge of 1,000 ids into 500 rows: the sort, each id's row in, merged rows out
    assert b == pytest.approx((1000 * 629 + 1500 * 512 + 500 * 512) / 2e12 + 500 * 1096 / 1e12
                              + 2e-6)


def test_dle_tf2_preset_scatters_with_sgd_and_merges_with_adam():
    m = load_model_spec("criteo-dlrm")
    tf2 = DLRM_PRESETS["dle-tf2"]
    assert tf2.embedding_update == "scatter_add" and tf2.sparse_grad
    for opt, dtype, scale, dedup in (("sgd", "tf32", True, False), ("adam", "tf32", False, True),
                                     ("adam", "fp16", True, True)):
        task = ShardingTask(model=replace(m, trainer=tf2, optimizer=opt,
                                          dense=replace(m.dense, dtype=dtype)),
                            topology="dgx-a100")
        path = prepare(task, 8).cost.sparse_grad
        assert (path.scale_pass, path.dedup, path.merged_bags) == (scale, dedup, True)
