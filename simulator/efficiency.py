"""How much of its peak one op reaches, by its size: :class:`EfficiencyCurve`, piecewise
linear in log10(size) (FLOPs for compute curves, bytes for memory curves) and clamped at both
ends, checked so that a bigger op never finishes sooner; :func:`monotone_time_points` makes
measured points satisfy that. :mod:`simulator.compute` times ops with these curves."""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from simulator.errors import SpecError

__all__ = ["EfficiencyCurve", "monotone_time_points"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EfficiencyCurve:
    """Fraction of peak reached by one op, as a function of its size.

    Attributes
    ----------
    points : tuple of (float, float)
        ``(size, efficiency)`` pairs with strictly increasing positive sizes (FLOPs for matmul
        curves, bytes for memory curves) and efficiencies in (0, 1]. Between points the
        efficiency is linear in log10(size); outside them it is clamped to the end values.
        Efficiency may not rise faster than size (``e1 - e0 <= e0 * ln(s1 / s0)``), so the
        time of an op, size / (peak · efficiency), never falls as the op grows.
    """

    points: tuple[tuple[float, float], ...]
    _logx: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _eff: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pts = _validate_points(self.points)
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "_logx", tuple(math.log10(s) for s, _ in pts))
        object.__setattr__(self, "_eff", tuple(e for _, e in pts))

    @classmethod
    def from_points(cls, points: Any, *, source: str | None = None,
                    field: str | None = None) -> EfficiencyCurve:
        """Build from a list of ``[size, efficiency]`` pairs; errors located at source/field."""
        try:
            return cls(points=points)
        except SpecError as exc:
            inner = exc.field or ""
            where = f"{field or ''}{inner}" if inner.startswith("[") else (
                ".".join(p for p in (field, inner) if p))
            raise SpecError(exc.message, source=source or exc.source, field=where or None,
                            fix=exc.fix) from None

    @classmethod
    def constant(cls, efficiency: float) -> EfficiencyCurve:
        """A flat curve (efficiency independent of size)."""
        return cls(points=((1.0, efficiency),))

    def __call__(self, size: float) -> float:
        """Efficiency (dimensionless, in (0, 1]) of one op of ``size`` FLOPs or bytes."""
        lx, ef = self._logx, self._eff
        if size <= self.points[0][0]:
            return ef[0]
        x = math.log10(size)
        i = bisect.bisect_right(lx, x)
        if i >= len(lx):
            return ef[-1]
        x0, x1 = lx[i - 1], lx[i]
        return ef[i - 1] + (ef[i] - ef[i - 1]) * (x - x0) / (x1 - x0)

    def many(self, sizes: np.ndarray) -> np.ndarray:
        """Vectorised :meth:`__call__` over an array of sizes (FLOPs or bytes)."""
        s = np.maximum(np.asarray(sizes, dtype=float), self.points[0][0])
        return np.interp(np.log10(s), self._logx, self._eff)


def _number(v: Any) -> float | None:
    """A float from a number or a numeric string (YAML 1.1 reads ``1e9`` as a string)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float, np.number)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _validate_points(points: Any) -> tuple[tuple[float, float], ...]:
    fix = "write a list of [size, efficiency] pairs, sizes increasing, efficiencies in (0, 1]"
    if isinstance(points, (str, bytes, Mapping)) or not isinstance(points, Sequence) or not points:
        raise SpecError(f"expected a non-empty list of [size, efficiency] pairs, got {points!r}",
                        fix=fix)
    out: list[tuple[float, float]] = []
    for i, p in enumerate(points):
        pair = None
        if not isinstance(p, (str, bytes)) and isinstance(p, Sequence) and len(p) == 2:
            pair = (_number(p[0]), _number(p[1]))
        if pair is None or None in pair:
            raise SpecError(f"expected a [size, efficiency] pair of numbers, got {p!r}",
                            field=f"[{i}]", fix=fix)
        size, eff = pair
        if not math.isfinite(size) or size <= 0:
            raise SpecError(f"size must be positive and finite, got {p[0]!r}", field=f"[{i}][0]",
                            fix=fix)
        if not math.isfinite(eff) or not 0 < eff <= 1:
            raise SpecError(f"efficiency must be in (0, 1], got {p[1]!r}", field=f"[{i}][1]",
                            fix=fix)
        if out and size <= out[-1][0]:
            what = "repeats" if size == out[-1][0] else "is smaller than"
            raise SpecError(f"size {p[0]!r} {what} the previous size {out[-1][0]!r}",
                            field=f"[{i}][0]", fix="list points once each, in increasing size")
        if out and eff - out[-1][1] > out[-1][1] * math.log(size / out[-1][0]) + 1e-12:
            limit = out[-1][1] * (1 + math.log(size / out[-1][0]))
            raise SpecError(
                f"efficiency rises from {out[-1][1]:g} at size {out[-1][0]:g} to {eff:g} at "
                f"size {size:g}, faster than the size grows, so a bigger op would finish sooner",
                field=f"[{i}][1]",
                fix=f"use at most {math.floor(limit * 1000) / 1000:g} here or raise the previous "
                    "point (monotone_time_points does this)")
        out.append((size, eff))
    return tuple(out)


def monotone_time_points(points: Sequence[Sequence[float]], digits: int = 3
                         ) -> list[list[float]]:
    """Raise efficiencies of smaller sizes so that op time never falls as size grows.

    Between points the efficiency is linear in ln(size), and time ∝ size / efficiency is
    non-decreasing on a rising segment iff ``e1 - e0 <= e0 * ln(s1 / s0)``. Walking down from
    the largest size, each point is raised to at least ``e1 / (1 + ln(s1 / s0))`` (rounded up
    to ``digits`` decimals). Points must be sorted by size; efficiencies are dimensionless.
    """
    pts = [[float(s), float(e)] for s, e in points]
    scale = 10**digits
    for i in range(len(pts) - 2, -1, -1):
        (s0, e0), (s1, e1) = pts[i], pts[i + 1]
        need = e1 / (1 + math.log(s1 / s0))
        if e0 < need:
            pts[i][1] = min(1.0, math.ceil(need * scale - 1e-9) / scale)
    return pts
