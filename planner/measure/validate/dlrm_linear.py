"""A recommendation model's linear layers, timed by shape on this host (the gloo calibration).

The calibration's matmul curve is keyed by FLOPs and was measured on a small transformer's
GEMMs (32-512 tokens, widths 64-4,096). A DLRM's dense part is other shapes: large batches
through narrow layers (13→64, 496→32, 32→496, 64→1). On the 2026-11-28 AMD EPYC host one core
ran ``x Wᵀ`` of 18,152 × 496 by 496 × 64 at 35 GFLOP/s, and of 18,152 × 32 by 32 × 496 at 17
GFLOP/s with its 36 MB output freshly allocated, where the curve says 70: in a profiled
validation step the dense part's GEMMs took 213 ms against 105 ms predicted. So the
calibration times each of a layer's three GEMMs (:data:`simulator.linear_table.LINEAR_PASSES`)
as autograd runs them (a new output tensor each call, under the ranks' heap policy) on a grid
of batches and widths, on every rank at once, and
:class:`~simulator.linear_table.LinearTable` interpolates between them.
"""

from __future__ import annotations

import statistics

from simulator.linear_table import LINEAR_PASSES, linear_flops

__all__ = ["LINEAR_BATCHES", "LINEAR_WIDTHS", "LINEAR_MAX_FLOPS", "linear_shapes",
           "time_linear_probe", "linear_section"]

#: rows per rank through a layer (a validated plan's local batch is 256-32,768)
LINEAR_BATCHES = (256, 2048, 16384)
#: layer widths, in and out (bottom MLP inputs of 13, DCNv2 projections of 32, a 1-wide head,
#: interaction widths of hundreds to thousands)
LINEAR_WIDTHS = (1, 16, 64, 256, 1024, 4096)
#: shapes with more FLOPs per GEMM are left out (time); the table takes such a layer's rate at
#: its largest measured smaller batch
LINEAR_MAX_FLOPS = 2.2e9


def linear_shapes(quick: bool = False) -> list[tuple[int, int, int]]:
    """``(batch, in, out)`` of the probe, in sweep order (``quick``: a coarse subset)."""
    bs = LINEAR_BATCHES[:2] if quick else LINEAR_BATCHES
    ws = LINEAR_WIDTHS[::2] if quick else LINEAR_WIDTHS
    return [(b, i, o) for b in bs for i in ws for o in ws
            if linear_flops(b, i, o) <= LINEAR_MAX_FLOPS]


def time_linear_probe(torch, timer, *, quick: bool = False) -> list[list]:
    """``[pass, batch, in, out, seconds]`` per shape and pass on this rank; ``timer(fn)``
    times one call with every rank running the same (the calibration's synchronised loop)."""
    import torch.nn.functional as F

    out = []
    for b, i, o in linear_shapes(quick):
        x, w, g = torch.randn(b, i), torch.randn(o, i), torch.randn(b, o)
        calls = {"fwd": lambda: F.linear(x, w), "dx": lambda: g.mm(w),
                 "dw": lambda: g.t().mm(x)}
        for p in LINEAR_PASSES:
            out.append([p, b, i, o, timer(calls[p])])
    return out


def linear_section(per_rank_rounds: list[dict]) -> dict:
    """The profile's ``linear_layers:`` section from every rank's rows per round: per shape
    and pass the slowest rank of each round, then the median over rounds (seconds)."""
    rounds = sorted(per_rank_rounds[0])
    first = per_rank_rounds[0][rounds[0]]
    points = []
    for k, (p, b, i, o, _) in enumerate(first):
        per = [max(r[rnd][k][4] for r in per_rank_rounds) for rnd in rounds]
        points.append([p, b, i, o, float(f"{statistics.median(per):.4g}")])
    return {"what": "fp32 GEMMs of a linear layer y = x W^T on one core, every rank at once: "
                    "fwd x W^T, dx g W, dw g^T x, a new output each call "
                    "(planner/measure/validate/dlrm_linear.py)",
            "points": points}
