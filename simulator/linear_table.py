"""Measured times of a linear layer's three GEMMs by shape, where FLOPs alone mislead.

A FLOP-keyed efficiency curve (:class:`simulator.efficiency.EfficiencyCurve`) holds for the
shapes it was measured on. A recommendation model's layers are skinny: a 16,384-sample batch
through a 496→32 projection, a 32→496 expansion, a 64→1 head. One CPU core ran such GEMMs at
17-48 GFLOP/s where square ones of the same FLOPs reached 65-73 (2026-11-28 AMD EPYC host,
fp32): with a small reduction depth every output element costs a trip to memory, and a narrow
output re-reads the wide input per block. So these are timed where they are used, per pass of
a layer ``y = x Wᵀ`` (``x``: batch × in; ``W``: out × in):

- ``fwd``: ``x Wᵀ`` (batch × in times in × out),
- ``dx``:  ``g W`` (the input gradient: batch × out times out × in),
- ``dw``:  ``gᵀ x`` (the weight gradient: out × batch times batch × in),

on a grid of batches and widths (``points``: ``[pass, batch, in, out, seconds]``). A query
interpolates the seconds per FLOP linearly in the logarithms of batch, in and out (between
measured shapes the rate changes smoothly; time stays proportional to FLOPs at one rate) and
holds the grid's edge rate outside it (:meth:`LinearTable.covers` says when). A shape the
sweep skipped for time (too many FLOPs) takes the rate of the same layer at the largest
measured smaller batch; with none, :meth:`LinearTable.seconds` returns None and the caller's
FLOP curve applies.

>>> t = LinearTable.from_points([["fwd", b, i, o, 2e-11 * 2 * b * i * o * (2 if i < 64 else 1)]
...                              for b in (256, 4096) for i in (16, 256) for o in (16, 256)])
>>> round(t.seconds("fwd", 1024, 256, 64) / (2 * 1024 * 256 * 64), 14)
2e-11
>>> round(t.seconds("fwd", 1024, 16, 64) / (2 * 1024 * 16 * 64), 14)
4e-11
>>> t.covers(1024, 16, 64), t.covers(8192, 16, 64), t.seconds("dw", 1024, 16, 64) is None
(True, False, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from simulator.errors import SpecError

__all__ = ["LinearTable", "LINEAR_PASSES", "linear_flops"]

#: the GEMMs of a linear layer: forward, input gradient, weight gradient
LINEAR_PASSES = ("fwd", "dx", "dw")


def linear_flops(batch: float, n_in: float, n_out: float) -> float:
    """FLOPs of any one of a linear layer's three GEMMs: ``2 · batch · in · out``."""
    return 2.0 * batch * n_in * n_out


@dataclass(frozen=True)
class _Grid:
    """One pass's log2 axes and log(seconds per FLOP) on them (NaN: not measured)."""

    axes: tuple[np.ndarray, np.ndarray, np.ndarray]
    log_rate: np.ndarray

    def at(self, x: np.ndarray) -> float:
        """Trilinear interpolation at ``x`` (log2 batch, in, out), clamped to the grid."""
        idx, wts = [], []
        for a, v in zip(self.axes, x):
            v = min(max(v, a[0]), a[-1])
            j = int(np.clip(np.searchsorted(a, v, side="right") - 1, 0, max(len(a) - 2, 0)))
            f = 0.0 if len(a) == 1 else (v - a[j]) / (a[j + 1] - a[j])
            idx.append((j, min(j + 1, len(a) - 1)))
            wts.append((1.0 - f, f))
        total = 0.0
        for c0 in range(2):
            for c1 in range(2):
                for c2 in range(2):
                    w = wts[0][c0] * wts[1][c1] * wts[2][c2]
                    if w == 0.0:
                        continue
                    total += w * self.log_rate[idx[0][c0], idx[1][c1], idx[2][c2]]
        return total


class LinearTable:
    """Measured linear-layer GEMM times by pass and shape (see the module docstring)."""

    def __init__(self, grids: Mapping[str, _Grid], source: str = "") -> None:
        self._grids = dict(grids)
        self.source = source

    @classmethod
    def from_points(cls, points: Sequence[Sequence[Any]], *, source: str = "<points>",
                    field: str = "points") -> "LinearTable":
        """Build from ``[pass, batch, in, out, seconds]`` rows; a SpecError naming ``source``
        and ``field`` for a malformed row."""
        by_pass: dict[str, dict[tuple[int, int, int], float]] = {}
        for k, row in enumerate(points):
            try:
                p, b, i, o, s = row
                key, sec = (int(b), int(i), int(o)), float(s)
            except (TypeError, ValueError):
                raise SpecError(f"expected [pass, batch, in, out, seconds], got {row!r}",
                                source=source, field=f"{field}[{k}]",
                                fix="measure it again with clusterplan calibrate gloo") from None
            if p not in LINEAR_PASSES or min(key) < 1 or not (sec > 0 and math.isfinite(sec)):
                raise SpecError(f"bad linear-layer point {row!r}", source=source,
                                field=f"{field}[{k}]",
                                fix=f"pass one of {', '.join(LINEAR_PASSES)}, sizes ≥ 1, "
                                    "seconds > 0")
            by_pass.setdefault(str(p), {})[key] = sec
        return cls({p: _grid(cells) for p, cells in by_pass.items()}, source)

    def seconds(self, pass_: str, batch: float, n_in: float, n_out: float) -> float | None:
        """Seconds of pass ``pass_`` of a ``n_in → n_out`` layer on ``batch`` rows; None where
        the table has no rate for it (the pass was not measured, or no batch of this layer)."""
        g = self._grids.get(pass_)
        if g is None or min(batch, n_in, n_out) <= 0:
            return None
        r = g.at(np.log2([batch, n_in, n_out]))
        if not math.isfinite(r):
            return None
        return math.exp(r) * linear_flops(batch, n_in, n_out)

    def covers(self, batch: float, n_in: float, n_out: float) -> bool:
        """True when the shape lies inside the measured grid (no edge rate held beyond it)."""
        if not self._grids:
            return False
        g = next(iter(self._grids.values()))
        x = np.log2([max(batch, 1e-9), max(n_in, 1e-9), max(n_out, 1e-9)])
        return all(a[0] - 1e-9 <= v <= a[-1] + 1e-9 for a, v in zip(g.axes, x))

    def ranges(self) -> dict[str, tuple[int, int]]:
        """The measured ``batch``, ``in`` and ``out`` ranges."""
        if not self._grids:
            return {}
        g = next(iter(self._grids.values()))
        return {k: (int(round(2 ** a[0])), int(round(2 ** a[-1])))
                for k, a in zip(("batch", "in", "out"), g.axes)}


def _grid(cells: Mapping[tuple[int, int, int], float]) -> _Grid:
    """The log grid of one pass's cells; a layer the sweep skipped at a batch takes its rate at
    the largest measured smaller batch."""
    bs, ins, outs = (sorted({c[k] for c in cells}) for k in range(3))
    rate = np.full((len(bs), len(ins), len(outs)), np.nan)
    for (b, i, o), s in cells.items():
        rate[bs.index(b), ins.index(i), outs.index(o)] = math.log(s / linear_flops(b, i, o))
    for j in range(1, len(bs)):
        hole = np.isnan(rate[j])
        rate[j][hole] = rate[j - 1][hole]
    axes = tuple(np.log2(np.array(v, dtype=float)) for v in (bs, ins, outs))
    return _Grid(axes, rate)
