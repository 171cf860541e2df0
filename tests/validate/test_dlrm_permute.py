"""TorchRec's reorder of column-wise pooled embeddings (issue 22): when a plan pays it, the fit
of its probe, and its place in the simulated step."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import planner.model.tables.shards as sh
from simulator.gloo_profile import gloo_profile_from_dict

from planner.measure.validate.dlrm_permute import PERMUTE_SHAPES, permute_costs, permute_section
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask, prepare
from planner.measure.tables.plans import cpu_topology_ref
from planner.workloads.dlrm.torchrec import cw_reorders, pooled_moves

from tests.validate.test_dlrm_timing import BASE


def test_reorder_follows_torchrec_order_rule():
    """The all-to-all returns slices rank by rank; TorchRec reorders them into table order,
    column offset within a table, unless the two orders agree."""
    two = [sh.column_wise(i, f"t{i}", 100, 32, [0, 1], [16, 16]) for i in range(2)]
    assert cw_reorders(two, 2) == [(4, 64)]                 # t0r0 t1r0 t0r1 t1r1
    assert cw_reorders(two[:1], 2) == []                    # one table: t0r0 t0r1 already
    flipped = [sh.column_wise(0, "t0", 100, 32, [1, 0], [16, 16])]
    assert cw_reorders(flipped, 2) == [(2, 32)]             # offset 16 arrives first
    mixed = two[:1] + [sh.table_wise(1, "t1", 100, 32, 0)]
    assert cw_reorders(mixed, 2) == []                      # table-wise slices never move
    assert cw_reorders([sh.table_wise(i, f"t{i}", 100, 32, i % 2) for i in range(4)], 2) == []


def test_fit_recovers_known_coefficients():
    fwd, bwd = (1e-4, 3e-10, 2e-8), (2e-4, 5e-10, 1e-8)
    pts = [[r, s, c, fwd[0] + fwd[1] * 4 * r * c + fwd[2] * r * s,
            bwd[0] + bwd[1] * 4 * r * c + bwd[2] * r * s] for r, s, c in PERMUTE_SHAPES]
    got = permute_costs(SimpleNamespace(permute_pooled={"points": pts}))
    for g, w in zip(got, (fwd, bwd)):
        assert g == pytest.approx(w, rel=1e-6, abs=1e-12)
    assert permute_costs(SimpleNamespace(permute_pooled=None)) is None
    assert permute_costs(SimpleNamespace()) is None


def test_section_takes_the_slowest_rank_then_the_median_round():
    def rows(scale):
        return [[r, s, c, scale * 1e-3, scale * 2e-3] for r, s, c in PERMUTE_SHAPES]
    ranks = [{0: rows(1.0), 1: rows(3.0), 2: rows(2.0)}, {0: rows(4.0), 1: rows(1.0), 2: rows(1.0)}]
    sec = permute_section(ranks)
    assert [p[3] for p in sec["points"]] == pytest.approx([3e-3] * len(PERMUTE_SHAPES))  # 4, 3, 2
    assert [p[4] for p in sec["points"]] == pytest.approx([6e-3] * len(PERMUTE_SHAPES))


def test_reorder_is_charged_in_the_forward_recat_and_backward_cat():
    tables = tuple(TableSpec(name=f"t{i}", num_embeddings=1000, embedding_dim=32,
                             pooling_factor=4.0) for i in range(3))
    model = ModelSpec(name="m", tables=tables, batch_size=2048, optimizer="sgd")
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(2)), 2)
    cw = [sh.column_wise(i, f"t{i}", 1000, 32, [0, 1], [16, 16]) for i in range(3)]
    compute = gloo_profile_from_dict(BASE, source="test").compute
    coef = ((1e-4, 1e-9, 1e-7), (2e-4, 2e-9, 3e-7))
    plain = pooled_moves(problem, cw, compute, None)
    moved = pooled_moves(problem, cw, compute, None, coef)
    b, slices, cols = 1024, 6, 96
    want_f = 1e-4 + 1e-9 * 4 * b * cols + 1e-7 * b * slices
    want_b = 2e-4 + 2e-9 * 4 * b * cols + 3e-7 * b * slices
    for p, m in zip(plain, moved):
        assert m[1] - p[1] == pytest.approx(want_f)
        assert m[2] - p[2] == pytest.approx(want_b)
        assert (m[0], m[3]) == (p[0], p[3])


def test_probe_times_every_shape_with_fbgemm(tmp_path):
    """The real op, on a one-process gloo group: a row per shape, forward and backward > 0,
    and the bigger shape of two with the same slices takes longer."""
    pytest.importorskip("fbgemm_gpu")
    import torch.distributed as dist
    from planner.measure.validate.dlrm_permute import time_permute_probe
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        rows = time_permute_probe(dist, repeats=2)
    finally:
        dist.destroy_process_group()
    assert [tuple(r[:3]) for r in rows] == list(PERMUTE_SHAPES)
    assert all(r[3] > 0 and r[4] > 0 for r in rows)
    by = {tuple(r[:3]): r for r in rows}
    assert by[(8192, 64, 1536)][3] > by[(2048, 32, 512)][3]


def test_pooled_moves_count_torchrec_s_copies_of_the_pooled_embeddings():
    """TorchRec 1.8's pooled all-to-all copies a table-wise rank's lookup output into its send
    buffer, reorders the receive buffer forward, and backward concatenates the per-feature
    gradients, makes each source rank's part contiguous and concatenates them (three copies of
    the local batch's columns), then divides the received gradient in place; a row-wise rank
    (reduce-scatter) has no send copy or division."""
    from simulator.compute import op_time
    tables = tuple(TableSpec(name=f"t{i}", num_embeddings=1000, embedding_dim=32,
                             pooling_factor=4.0) for i in range(2))
    model = ModelSpec(name="m", tables=tables, batch_size=2048, optimizer="sgd")
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(2)), 2)
    compute = gloo_profile_from_dict(BASE, source="test").compute

    def copy(n):
        return op_time(compute, flops=0.0, bytes_moved=2 * n)
    local = 4.0 * 1024 * 64
    tw = [sh.table_wise(0, "t0", 1000, 32, 0), sh.table_wise(1, "t1", 1000, 32, 0)]
    (f0, r0, b0, g0), (f1, r1, b1, g1) = pooled_moves(problem, tw, compute, None)
    send = 4.0 * 2048 * 64                           # rank 0's output: global batch, 64 columns
    assert f0 == pytest.approx(copy(send)) and g0 == pytest.approx(copy(send))
    assert f1 == g1 == 0.0                           # rank 1 looks nothing up
    assert r0 == r1 == pytest.approx(copy(local))
    assert b0 == b1 == pytest.approx(3 * copy(local))
    rw = [sh.row_wise(i, f"t{i}", 1000, 32, 2) for i in range(2)]
    for f, r, b, g in pooled_moves(problem, rw, compute, None):
        assert f == g == 0.0 and b == pytest.approx(3 * copy(local))
