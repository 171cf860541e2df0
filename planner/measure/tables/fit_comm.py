"""The collective sweep of ``clusterplan calibrate embedding``: all-to-alls and grouped
collectives timed on gloo groups of each world size, and the per-rank lines fitted to them
(``alpha + max(sent, received) / Bps`` for the all-to-all, the form of
:meth:`~planner.model.tables.comm_model.CommModel.a2a_times`, and where the uneven exchanges
fall between the ranks' mean and busiest volume, ``a2a_uneven_weight``; ``alpha + bytes / Bps``
for the others).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from planner.measure.tables.comm import GlooGroup
from planner.measure.tables.logfit import fit_log_nonneg

__all__ = ["measure_comm_points", "fit_comm_profile"]


def _a2a_cases(world: int, rng: np.random.Generator) -> list[tuple[str, list[list[float]]]]:
    cases = []
    for per in (4.0, 4096.0, 65536.0, 524288.0, 2097152.0, 4194304.0):
        m = np.full((world, world), per)
        cases.append((f"a2a_even_{int(per)}", m))
    for k, scale in enumerate((16384.0, 262144.0, 2097152.0)):
        y = rng.uniform(0.2, 1.8, size=world) * scale           # rank-owned volume per peer
        cases.append((f"a2a_rows_{k}", np.repeat(y[:, None], world, axis=1)))
        cases.append((f"a2a_cols_{k}", np.repeat(y[None, :], world, axis=0)))
    return [(name, m.tolist()) for name, m in cases]


def measure_comm_points(worlds: Sequence[int], *, repeats: int = 9, warmup: int = 3,
                        seed: int = 0, progress=None) -> dict[int, list[dict]]:
    """Time all-to-alls and grouped collectives for each world size (gloo, spawned processes)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xC033]))
    out: dict[int, list[dict]] = {}
    for n in worlds:
        if n < 2:
            continue
        ops = []
        meta = {}
        for name, m in _a2a_cases(n, rng):
            ops.append(("a2a", name, m))
            meta[name] = ("a2a", m)
        for kind in ("allreduce", "reducescatter", "allgather"):
            for size in (4096.0, 262144.0, 4194304.0, 16777216.0):
                name = f"{kind}_{int(size)}"
                ops.append((kind, name, size))
                meta[name] = (kind, size)
        with GlooGroup(n) as g:
            res = g.run(ops, repeats=repeats, warmup=warmup)
        pts = []
        for name, (kind, arg) in meta.items():
            for r in range(n):
                if kind == "a2a":
                    m = np.asarray(arg)
                    off = ~np.eye(n, dtype=bool)
                    sent = float(m[r][off[r]].sum())
                    recv = float(m[:, r][off[:, r]].sum())
                    pts.append({"kind": kind, "name": name, "rank": r, "sent_bytes": sent,
                                "received_bytes": recv, "seconds": res[r][name]["median_s"]})
                else:
                    pts.append({"kind": kind, "name": name, "rank": r, "bytes": float(arg),
                                "seconds": res[r][name]["median_s"]})
        out[n] = pts
        if progress:
            progress(f"collectives: world {n} done")
    return out


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """alpha, Bps, mape of ``y = alpha + x / Bps`` (both ≥ 0; squared log ratio,
    :func:`~.logfit.fit_log_nonneg`)."""
    X = np.stack([np.ones_like(x), x], axis=1)
    coef = fit_log_nonneg(X, y)
    alpha, inv = float(coef[0]), float(coef[1])
    pred = X @ coef
    return alpha, (1.0 / inv if inv > 0 else math.inf), float(np.mean(np.abs(pred / y - 1.0)))


def _uneven_weight(a2a: list[dict], alpha: float, bw: float) -> float | None:
    """Where the uneven exchanges' time falls between the fitted line at the ranks' mean and at
    their busiest ``max(sent, received)`` (0: the mean's, 1: the busiest rank's): per uneven
    case the slowest rank's time, median over cases, clipped to [0, 1]; None without uneven
    cases. The exchange synchronises its ranks, so the slowest rank's time is the case's."""
    cases: dict[str, list[dict]] = {}
    for p in a2a:
        name = p.get("name")
        if name is not None and not name.startswith("a2a_even"):
            cases.setdefault(name, []).append(p)
    weights = []
    for pts in cases.values():
        v = np.array([max(p["sent_bytes"], p["received_bytes"]) for p in pts])
        span = (v.max() - v.mean()) / bw
        if span <= 0:
            continue
        t = max(p["seconds"] for p in pts)
        weights.append((t - alpha - v.mean() / bw) / span)
    if not weights:
        return None
    return float(min(1.0, max(0.0, float(np.median(weights)))))


def fit_comm_profile(points: dict[int, list[dict]]) -> dict:
    """Per world size: a2a alpha and Bps, and (alpha, Bps) of the grouped collectives."""
    out = {}
    for n, pts in sorted(points.items()):
        a = [p for p in pts if p["kind"] == "a2a"]
        # the line from the equal exchanges (every point where none is named one); the uneven
        # ones, whose ranks finish together whatever each sent, only place the weight
        even = [p for p in a if str(p.get("name", "")).startswith("a2a_even")] or \
            [p for p in a if p.get("name") is None]
        x = np.array([max(p["sent_bytes"], p["received_bytes"]) for p in even])
        y = np.array([p["seconds"] for p in even])
        alpha, bw, err = _fit_line(x, y)
        entry = {"a2a_alpha_s": alpha, "a2a_Bps": bw, "a2a_mape": err}
        weight = _uneven_weight(a, alpha, bw)
        if weight is not None:
            entry["a2a_uneven_weight"] = weight
        for kind in ("allreduce", "reducescatter", "allgather"):
            q = [p for p in pts if p["kind"] == kind]
            if not q:
                continue
            al, b, e = _fit_line(np.array([p["bytes"] for p in q]),
                                 np.array([p["seconds"] for p in q]))
            entry[kind] = {"alpha_s": al, "Bps": b, "mape": e}
        out[int(n)] = entry
    return out
