"""TorchRec's reorder of column-wise pooled embeddings, timed on this host and fitted.

A column-wise (or table-column-wise) group's output all-to-all returns each rank's pooled
embeddings in shard order: rank 0's slices of every table, then rank 1's. TorchRec puts the
slices of each table back together with FBGEMM's ``PermutePooledEmbeddingsSplit`` (on a CPU a
``cat`` of as many narrow column blocks as there are shards, per sample) whenever that order
is not already table order, and autograd runs the inverse reorder on the gradient. On the
2026-11-27 AMD EPYC host one such reorder of 3,744 samples × 48 slices (1,744 columns, 26 MB)
took 19 ms each way in a TorchRec step, as long as the plan's forward lookups. Alone, on one
input reused, it takes 7-8 ms; with a fresh input each time, as in a step (the all-to-all's
output), 16-19 ms: the frees and new tensors of a step keep returning the heap's top to the
OS, so the op's 26 MB output page-faults although it is below glibc's 32 MiB mmap threshold
(with ``MALLOC_MMAP_THRESHOLD_=64 MiB`` both take 8 ms). No kernel curve holds it, so the
gloo calibration times the op as a step runs it, fresh tensors in and out, at a few shapes on
every rank at once (:func:`time_permute_probe`), and :func:`permute_costs` fits seconds =
``a + b·bytes + c·blocks`` (blocks = samples × slices) to them, forward and backward apart;
the page faults are in ``b``.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

__all__ = ["PERMUTE_SHAPES", "time_permute_probe", "permute_section", "permute_costs"]

#: (samples, slices, columns) of the probe (outputs of 1-48 MiB)
PERMUTE_SHAPES = ((1024, 8, 256), (2048, 32, 512), (2048, 96, 3072), (4096, 16, 1536),
                  (8192, 48, 768), (8192, 64, 1536))


def _order(slices: int) -> list[int]:
    """TorchRec's order for ``slices`` = tables × 2 ranks: the all-to-all gives rank-major
    slices (t0r0, t1r0, ..., t0r1, ...); table order takes t0r0, t0r1, t1r0, ..."""
    tables = slices // 2
    return [t + r * tables for t in range(tables) for r in range(2)]


def time_permute_probe(dist, *, repeats: int = 7) -> list[list[float]]:
    """``[samples, slices, columns, forward s, backward s]`` per :data:`PERMUTE_SHAPES` on this
    rank, every rank starting each shape together after a barrier (medians of ``repeats``)."""
    import torch
    from fbgemm_gpu.permute_pooled_embedding_modules_split import PermutePooledEmbeddingsSplit

    out = []
    for rows, slices, cols in PERMUTE_SHAPES:
        op = PermutePooledEmbeddingsSplit([cols // slices] * slices, _order(slices),
                                          device=torch.device("cpu"))
        fw, bw = [], []
        dist.barrier()
        for i in range(repeats + 1):
            # fresh tensors each pass, as in a step (the all-to-all's output going in, the
            # dense part's gradient coming back): their frees and the op's new output then
            # churn the heap as a step does, page faults included
            x = torch.randn(rows, cols, requires_grad=True)
            t0 = time.perf_counter()
            y = op(x)
            t1 = time.perf_counter()
            g = torch.randn(rows, cols)
            t2 = time.perf_counter()
            y.backward(g)
            t3 = time.perf_counter()
            del x, y, g
            if i:                       # the first pass warms the allocator
                fw.append(t1 - t0)
                bw.append(t3 - t2)
        out.append([rows, slices, cols, statistics.median(fw), statistics.median(bw)])
    return out


def permute_section(per_rank_rounds: list[dict]) -> dict:
    """The profile's ``permute_pooled:`` section from every rank's rows per round: per shape
    the slowest rank of each round, then the median over rounds (seconds)."""
    rounds = sorted(per_rank_rounds[0])
    points = []
    for k, (rows, slices, cols) in enumerate(PERMUTE_SHAPES):
        fw = [max(r[rnd][k][3] for r in per_rank_rounds) for rnd in rounds]
        bw = [max(r[rnd][k][4] for r in per_rank_rounds) for rnd in rounds]
        points.append([rows, slices, cols, float(f"{statistics.median(fw):.4g}"),
                       float(f"{statistics.median(bw):.4g}")])
    return {"what": "FBGEMM PermutePooledEmbeddingsSplit forward and backward of fp32 "
                    "[samples, columns] in `slices` equal blocks, on every rank at once "
                    "(planner/measure/validate/dlrm_permute.py)",
            "points": points}


def permute_costs(calibration) -> tuple[tuple[float, float, float],
                                        tuple[float, float, float]] | None:
    """``(forward, backward)`` coefficients ``(a s, b s per byte, c s per block)`` of the
    calibration's permute probe (non-negative least squares on seconds: the page faults that
    only the larger shapes take dominate what a plan pays, and relative errors would let the
    1 MB shapes, which take none, pull ``b`` down); None when the calibration has no probe."""
    sec = getattr(calibration, "permute_pooled", None) or {}
    pts = sec.get("points") or []
    if len(pts) < 3:
        return None
    from scipy.optimize import nnls          # here: only validation predictions need it

    X = np.array([[1.0, 4.0 * r * c, float(r * s)] for r, s, c, *_ in pts])
    out = []
    for col in (3, 4):
        y = np.array([float(p[col]) for p in pts])
        coef, _ = nnls(X, y)
        out.append(tuple(float(x) for x in coef))
    return out[0], out[1]
