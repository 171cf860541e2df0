"""Linear layers timed by shape (simulator/linear_table.py, validate/dlrm_linear.py):
the table interpolates measured rates, the dense part's GEMMs name their shapes, and a profile
with the table prices exactly those GEMMs from it."""

from __future__ import annotations

import doctest
import math

import pytest

import simulator.linear_table as linear_table
from simulator.compute import op_time
from simulator.errors import SpecError
from simulator.gloo_profile import gloo_profile_from_dict
from simulator.linear_table import LinearTable, linear_flops

from planner.measure.validate.dlrm_linear import linear_section, linear_shapes
from planner.measure.validate.dlrm_probes import probe_config
from planner.measure.validate.dlrm_report import predicted
from planner.model.tables.dense import dense_op_list
from planner.model.tables.spec import DenseSpec

from tests.validate.test_dlrm_timing import BASE


def test_doctests():
    res = doctest.testmod(linear_table)
    assert res.failed == 0 and res.attempted > 0


def _points(rate):
    """Every pass on a 2×3×3 grid at ``rate(pass, b, i, o)`` seconds per FLOP."""
    return [[p, b, i, o, rate(p, b, i, o) * linear_flops(b, i, o)]
            for p in ("fwd", "dx", "dw") for b in (256, 4096) for i in (1, 32, 1024)
            for o in (1, 32, 1024)]


def test_rates_interpolate_in_log_space_and_hold_at_the_edges():
    # seconds per FLOP falls with the narrower width, as measured: 1/(1 + log2 min(i, o))
    rate = lambda p, b, i, o: 1e-11 * (1 + 10 / (1 + math.log2(min(i, o))))
    t = LinearTable.from_points(_points(rate))
    for p, b, i, o in (("fwd", 256, 32, 1024), ("dw", 4096, 1, 1)):
        assert t.seconds(p, b, i, o) == pytest.approx(rate(p, b, i, o) * linear_flops(b, i, o))
    # halfway in log2 between widths 32 and 1024 (181 = 2^7.5): the log rate's midpoint
    mid = t.seconds("dx", 1024, 181, 1024) / linear_flops(1024, 181, 1024)
    lo, hi = rate("dx", 0, 32, 1024), rate("dx", 0, 1024, 1024)
    assert mid == pytest.approx(math.sqrt(lo * hi), rel=1e-9)
    # beyond the grid: the edge rate, time still proportional to FLOPs; flagged as not covered
    big = t.seconds("fwd", 65536, 1024, 1024)
    assert big == pytest.approx(16 * t.seconds("fwd", 4096, 1024, 1024), rel=1e-9)
    assert not t.covers(65536, 1024, 1024) and t.covers(1000, 500, 2)
    assert t.ranges() == {"batch": (256, 4096), "in": (1, 1024), "out": (1, 1024)}


def test_a_skipped_shape_takes_the_smaller_batchs_rate_else_none():
    pts = [r for r in _points(lambda *a: 2e-11) if not (r[1] == 4096 and r[2] == r[3] == 1024)]
    t = LinearTable.from_points(pts)
    assert t.seconds("fwd", 4096, 1024, 1024) == pytest.approx(
        2e-11 * linear_flops(4096, 1024, 1024))
    only_big = LinearTable.from_points([r for r in _points(lambda *a: 2e-11)
                                        if r[1] == 4096 and r[0] == "fwd"]
                                       + [["fwd", 256, 1, 1, 1e-6]])
    assert only_big.seconds("fwd", 256, 1024, 1024) is None          # nothing measured near
    assert only_big.seconds("dx", 4096, 32, 32) is None                # pass not measured


@pytest.mark.parametrize("row,field", [(["fwd", 256, 1, 1], "points[0]"),
                                       (["up", 256, 1, 1, 1e-3], "points[0]"),
                                       (["fwd", 0, 1, 1, 1e-3], "points[0]"),
                                       (["fwd", 256, 1, 1, -1.0], "points[0]")])
def test_bad_points_name_the_row(row, field):
    with pytest.raises(SpecError) as e:
        LinearTable.from_points([row], source="cal.yaml")
    assert e.value.source == "cal.yaml" and e.value.field == field


def test_every_gemm_of_the_dense_part_names_its_layer():
    d = DenseSpec(num_dense_features=13, bottom_mlp=(64, 32), top_mlp=(64, 1),
                  interaction="dcnv2", dcn_layers=2, dcn_projection=32)
    dims = [32, 64, 16]
    ops = dense_op_list(d, dims, 2048)
    gemms = [op for op in ops if op.gemm is not None]
    assert {op.flops > 0 for op in ops if op.gemm is None} <= {False}   # the rest move bytes
    for op in gemms:
        p, b, i, o = op.gemm
        assert op.flops == pytest.approx(linear_flops(b, i, o)) and b == 2048
        assert (p == "fwd") == (op.phase == "fwd")
    ls = d.layers(dims)
    mlp = len(ls["bottom"]) + len(ls["top"])
    # per MLP layer fwd, dw, dx (none for the first bottom layer); per cross layer its two
    # projections' three GEMMs each
    assert len(gemms) == 3 * mlp - 1 + 6 * d.dcn_layers
    w = ls["top"][0][0]
    assert ("fwd", 2048, w, 32) in [op.gemm for op in gemms]       # U: w → projection
    assert ("dx", 2048, 32, w) in [op.gemm for op in gemms]        # V's input gradient
    dot = DenseSpec(num_dense_features=13, bottom_mlp=(64, 16), top_mlp=(64, 1))
    bmm = [op for op in dense_op_list(dot, [16, 16], 512) if op.flops and op.gemm is None]
    assert len(bmm) == 3                  # the dot interaction's batched products: curve-priced


def test_a_profile_with_the_table_prices_the_gemms_from_it():
    """Closed form: with a table of one rate, the predicted MLP passes are that rate times the
    GEMM FLOPs plus the other ops on the curves, and without the table the old pricing."""
    cfg = probe_config("table_wise", "large", 2)
    dense = DenseSpec(num_dense_features=13, bottom_mlp=(64, 32), top_mlp=(64, 1),
                      interaction="dcnv2", dcn_layers=1, dcn_projection=32)
    from dataclasses import replace
    cfg = replace(cfg, model=replace(cfg.model, dense=dense))
    rate = 3e-11
    section = {"what": "test", "points": _points(lambda *a: rate)}
    bare, timed = gloo_profile_from_dict(BASE), gloo_profile_from_dict(
        {**BASE, "linear_layers": section})
    assert bare.linear is None and timed.linear is not None
    dims = [t.embedding_dim for t in cfg.model.tables]
    ops = dense_op_list(dense, dims, cfg.model.batch_size / 2)
    for phase in ("fwd", "bwd"):
        rest = sum(op_time(bare.compute, flops=op.flops, bytes_moved=op.bytes, dtype="fp32")
                   for op in ops if op.phase == phase and op.gemm is None)
        gemm = sum(rate * op.flops for op in ops if op.phase == phase and op.gemm is not None)
        curve = sum(op_time(bare.compute, flops=op.flops, bytes_moved=op.bytes, dtype="fp32")
                    for op in ops if op.phase == phase and op.gemm is not None)
        got = predicted(cfg, cfg.warmup, timed)["per_kind"][f"mlp_{phase}"]
        assert got == pytest.approx(rest + gemm, rel=1e-9)
        assert predicted(cfg, cfg.warmup, bare)["per_kind"][f"mlp_{phase}"] == pytest.approx(
            rest + curve, rel=1e-9)
    # the probe's grid (batches 256-4,096 here) holds this batch; a larger one is flagged
    assert not any("linear layer" in x for x in predicted(cfg, cfg.warmup, timed)["extrapolated"])
    big = replace(cfg, model=replace(cfg.model, batch_size=2 * 16384))
    flags = [x for x in predicted(big, big.warmup, timed)["extrapolated"] if "linear layer" in x]
    assert flags and all("16,384 rows" in x and "256-4096" in x for x in flags)


def test_the_section_keeps_each_shapes_slowest_rank_median_over_rounds():
    shapes = linear_shapes(quick=True)
    assert all(linear_flops(*s) <= 2.2e9 for s in shapes) and (256, 1, 1) in shapes
    row = lambda s: [["fwd", 256, 1, 1, s]]
    ranks = [{0: row(1e-3), 1: row(3e-3), 2: row(2e-3)}, {0: row(2e-3), 1: row(1e-3),
                                                          2: row(5e-3)}]
    sec = linear_section(ranks)
    assert sec["points"] == [["fwd", 256, 1, 1, 3e-3]]       # median of 2, 3, 5 ms
