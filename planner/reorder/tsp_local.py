"""Heuristic rings for any n: nearest-neighbour start, then 2-opt and Or-opt local search.

All moves are scored with numpy over every candidate position at once (one vector operation per
tour position), which keeps a 1,024-rank ring well under a second on one core:

* **2-opt**: remove edges (a, b) and (c, d), reconnect as (a, c) and (b, d), reversing the path
  between; gain ``c_ab + c_cd − c_ac − c_bd``.
* **Or-opt**: move a run of 1–3 consecutive ranks (either way round) between two other
  neighbours.

Small instances get several starts (nearest neighbour from different ranks) and a few random
double-bridge kicks, keeping the best ring: within 5% of the exact MIP on the seeded instances of
``tests/test_reorder.py``. Costs must be symmetric (``c[i, j] == c[j, i]``).
"""

from __future__ import annotations

import time

import numpy as np

__all__ = ["nearest_neighbour", "two_opt", "or_opt", "local_search", "heuristic_ring"]

_EPS = 1e-9   # relative improvement a move must make (float noise is ~1e-16)


def nearest_neighbour(c: np.ndarray, start: int = 0) -> np.ndarray:
    """Greedy ring: from ``start`` always go to the closest unvisited rank."""
    n = c.shape[0]
    tour = np.empty(n, dtype=np.int64)
    free = np.ones(n, dtype=bool)
    cur = start
    for k in range(n):
        tour[k] = cur
        free[cur] = False
        if k + 1 < n:
            row = np.where(free, c[cur], np.inf)
            cur = int(np.argmin(row))
    return tour


def two_opt(c: np.ndarray, tour: np.ndarray, *, deadline: float = np.inf) -> tuple[np.ndarray, bool]:
    """2-opt to a local optimum (best move per position); returns the tour and whether it moved."""
    t = tour.copy()
    n = len(t)
    moved_any = False
    if n < 5:
        return t, False
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for i in range(n - 2):
            a, b = t[i], t[i + 1]
            js = np.arange(i + 2, n - 1 if i == 0 else n)
            if js.size == 0:
                continue
            cs = t[js]
            ds = t[(js + 1) % n]
            delta = c[a, cs] + c[b, ds] - c[a, b] - c[cs, ds]
            k = int(np.argmin(delta))
            if delta[k] < -_EPS * abs(c[a, b]):
                j = int(js[k])
                t[i + 1:j + 1] = t[i + 1:j + 1][::-1].copy()
                improved = moved_any = True
    return t, moved_any


def or_opt(c: np.ndarray, tour: np.ndarray, *, max_len: int = 3,
           deadline: float = np.inf) -> tuple[np.ndarray, bool]:
    """One sweep of Or-opt moves (runs of 1..``max_len`` ranks); returns tour, whether it moved."""
    t = tour.copy()
    n = len(t)
    moved_any = False
    if n < 5:
        return t, False
    for L in range(1, max_len + 1):
        if n - L < 3:
            break
        i = 0
        while i < n and time.perf_counter() < deadline:
            r = np.roll(t, -i)                  # segment is r[1 : 1 + L], p = r[0]
            p, s0, s1, nx = r[0], r[1], r[L], r[(L + 1) % n]
            gain = c[p, s0] + c[s1, nx] - c[p, nx]
            rest = np.concatenate(([p], r[L + 1:]))  # ring without the segment
            u = rest
            v = np.roll(rest, -1)
            base = c[u, v]
            fwd = c[u, s0] + c[s1, v] - base
            rev = c[u, s1] + c[s0, v] - base
            fwd[0] = rev[0] = np.inf            # edge (p, nx): where it came from
            kf, kr = int(np.argmin(fwd)), int(np.argmin(rev))
            best, k, flip = (fwd[kf], kf, False) if fwd[kf] <= rev[kr] else (rev[kr], kr, True)
            if best - gain < -_EPS * abs(gain):
                seg = r[1:L + 1][::-1] if flip else r[1:L + 1]
                t = np.concatenate((rest[:k + 1], seg, rest[k + 1:]))
                moved_any = True
            i += 1
    return t, moved_any


def local_search(c: np.ndarray, tour: np.ndarray, *, deadline: float = np.inf) -> np.ndarray:
    """Alternate 2-opt and Or-opt until neither improves (or the deadline passes)."""
    t, _ = two_opt(c, tour, deadline=deadline)
    while time.perf_counter() < deadline:
        t, moved = or_opt(c, t, deadline=deadline)
        if not moved:
            break
        t, moved = two_opt(c, t, deadline=deadline)
        if not moved:
            break
    return t


def _cost(c: np.ndarray, t: np.ndarray) -> float:
    return float(c[t, np.roll(t, -1)].sum())


def _double_bridge(t: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(t)
    a, b, d = np.sort(rng.choice(np.arange(1, n), size=3, replace=False))
    return np.concatenate((t[:a], t[b:d], t[a:b], t[d:]))


def heuristic_ring(c: np.ndarray, *, starts: int | None = None, kicks: int | None = None,
                   seed: int = 0, time_limit_s: float = 10.0, init=None) -> np.ndarray:
    """Best ring found by multi-start nearest neighbour + local search + double-bridge kicks.

    ``starts`` and ``kicks`` default by size: every rank as a start and 30 kicks up to 16 ranks,
    fewer as n grows, a single start and no kicks from 256 ranks. ``init``: a ring to start from
    as well.
    """
    n = c.shape[0]
    if n <= 3:
        return np.arange(n)
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    if starts is None:
        starts = n if n <= 16 else 8 if n <= 64 else 2 if n < 256 else 1
    if kicks is None:
        kicks = 30 if n <= 16 else 20 if n <= 64 else 5 if n < 256 else 0
    rng = np.random.default_rng(seed)
    first = [0] + list(rng.choice(np.arange(1, n), size=min(starts, n) - 1, replace=False))
    cands = [nearest_neighbour(c, int(s)) for s in first]
    if init is not None:
        cands.append(np.asarray(init, dtype=np.int64))
    best, best_cost = None, np.inf
    for t in cands:
        t = local_search(c, t, deadline=deadline)
        v = _cost(c, t)
        if v < best_cost:
            best, best_cost = t, v
        if time.perf_counter() > deadline:
            break
    for _ in range(kicks):
        if time.perf_counter() > deadline or n < 8:
            break
        t = local_search(c, _double_bridge(best, rng), deadline=deadline)
        v = _cost(c, t)
        if v < best_cost - 1e-15 * abs(best_cost):
            best, best_cost = t, v
    return best
