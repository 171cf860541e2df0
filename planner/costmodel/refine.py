"""Local search on the full learned objective: the improvements over NeuroShard's search.

NeuroShard places tables greedily on the predicted compute alone (the grid over dim caps is its
only handle on communication) and splits columns only in halves. This search starts from its
plan and descends on the whole objective (:class:`~.objective.Objective`: learned compute,
learned all-to-alls with straggler waits, row-wise communication) over the neighbourhood of the
bottleneck rank ``b``:

- **move** a table's part on ``b`` to another rank (parts of one table on one rank merge, so
  this also merges column shards back);
- **split** a part on ``b``: move ``q`` of its ``w`` columns to another rank, for ``q`` a
  multiple of 4 near ``w/4``, ``w/3`` and ``w/2`` — column splits that need not be halvings;
- **swap** a part on ``b`` with another table's part on another rank;
- **row-wise** a table with a part on ``b`` (hot tables whose lookups no column split can
  spread, e.g. narrow ones), or put a row-wise table back on one rank.

Moves must keep every rank within its memory and the table's sharding type allowed. Steepest
descent on ``(max_r cost_r, Σ_r cost_r²)`` (the second term relieves the runner-up ranks on the
plateaus of a min-max objective); only strict improvements are taken, so the result is never
worse than the start. The work is bounded by ``max_evals`` objective evaluations, so the result
depends only on the inputs; ``deadline`` (a ``time.perf_counter()`` value) is a safety stop.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from planner.model.tables.shards import ShardingType

__all__ = ["refine", "RefineResult", "split_widths"]

_TW, _CW, _RW = ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE


@dataclass(frozen=True)
class RefineResult:
    """Outcome of :func:`refine`: the state, its score (ms) and what was done."""
    units: list
    ranks: list
    rowwise: frozenset
    score_ms: float
    start_ms: float
    moves: dict
    evals: int
    stopped_by: str           # "optimum", "max_evals" or "deadline"


def split_widths(w: int) -> list[int]:
    """Column counts ``q`` to move off a part of width ``w``: multiples of 4 near w/4, w/3 and
    w/2, each leaving at least 4 columns behind."""
    out = []
    for f in (0.25, 1 / 3, 0.5):
        q = int(round(w * f / 4)) * 4
        if 4 <= q <= w - 4 and q not in out:
            out.append(q)
    return out


def _flat(parts: dict) -> tuple[list, list]:
    units, ranks = [], []
    for t in sorted(parts):
        for k, (r, w) in enumerate(sorted(parts[t].items())):
            units.append((t, k, w))
            ranks.append(r)
    return units, ranks


def _key(per: np.ndarray) -> tuple[float, float]:
    return float(per.max()), float(np.dot(per, per))


def refine(obj, units, ranks, rowwise=frozenset(), *, max_evals: int = 20000,
           deadline: float | None = None, allow_rowwise: bool = True) -> RefineResult:
    """Descend from the state ``(units, ranks, rowwise)`` (module docstring)."""
    parts: dict[int, dict[int, int]] = {}
    for u, r in zip(units, ranks):
        per = parts.setdefault(u[0], {})
        per[r] = per.get(r, 0) + u[2]
    rw = frozenset(rowwise) - obj.forced_rowwise
    cur_per = obj.per_rank(*_flat(parts), rw)
    cur = _key(cur_per)
    start = cur[0]
    evals, moves, stopped = 1, {}, "optimum"
    while True:
        b = int(np.argmax(cur_per))
        best = None
        for kind, change, new_rw in _neighbours(obj, parts, rw, b, allow_rowwise):
            if evals >= max_evals:
                stopped = "max_evals"
                break
            if deadline is not None and time.perf_counter() > deadline:
                stopped = "deadline"
                break
            cand = _changed(parts, change)
            u2, r2 = _flat(cand)
            if np.any(obj.memory(u2, r2, new_rw) > obj.cap * (1 + 1e-12)):
                continue
            per_rank = obj.per_rank(u2, r2, new_rw)
            evals += 1
            k = _key(per_rank)
            if k[0] < cur[0] - 1e-9 or (k[0] <= cur[0] + 1e-12 and k[1] < cur[1] * (1 - 1e-9)):
                if best is None or k < best[0]:
                    best = (k, kind, cand, new_rw, per_rank)
        if best is not None:                  # also the best found before a stop
            cur, kind, parts, rw, cur_per = best
            moves[kind] = moves.get(kind, 0) + 1
        if best is None or stopped != "optimum":
            break
    u, r = _flat(parts)
    return RefineResult(units=u, ranks=r, rowwise=rw, score_ms=cur[0], start_ms=start,
                        moves=moves, evals=evals, stopped_by=stopped)


def _changed(parts: dict, change: dict) -> dict:
    """``parts`` with ``change`` applied: a table's new ``{rank: width}``, or None (row-wise)."""
    cand = dict(parts)
    for t, per in change.items():
        if per is None:
            cand.pop(t, None)
        else:
            cand[t] = per
    return cand


def _neighbours(obj, parts: dict, rw: frozenset, b: int, allow_rowwise: bool):
    """``(kind, change, rowwise)`` of every move off the bottleneck rank ``b``, in the order the
    descent tries them: its tables' moves and column splits to each other rank (costliest
    table first), row-wise turns, row-wise tables back onto one rank, then swaps."""
    n, allowed = obj.n, obj.problem.allowed
    dims = [t.embedding_dim for t in obj.problem.model.tables]
    on_b = sorted((t for t in parts if b in parts[t]),
                  key=lambda t: (-obj.single((t, 0, parts[t][b])), t))
    for t in on_b:
        w = parts[t][b]
        for r in range(n):
            if r == b:
                continue
            per = dict(parts[t])
            del per[b]
            per[r] = per.get(r, 0) + w
            if _legal(allowed, t, per):
                yield "move", {t: per}, rw
            if allowed(t, _CW):
                for q in split_widths(w):
                    per = dict(parts[t])
                    per[b] = w - q
                    per[r] = per.get(r, 0) + q
                    yield "split", {t: per}, rw
        if allow_rowwise and allowed(t, _RW):
            yield "rowwise", {t: None}, rw | {t}
    for t in sorted(rw):
        if allowed(t, _TW):
            for r in range(n):
                yield "unrowwise", {t: {r: dims[t]}}, rw - {t}
    yield from _swaps(allowed, parts, on_b, b, rw)


def _swaps(allowed, parts: dict, on_b: list, b: int, rw: frozenset):
    """Swaps of a table's part on rank ``b`` with another table's part on a rank it is not on."""
    for t in on_b:
        w = parts[t][b]
        for t2 in sorted(parts):
            if t2 == t or b in parts[t2]:
                continue
            for r2, w2 in sorted(parts[t2].items()):
                if r2 in parts[t]:
                    continue
                p1 = dict(parts[t])
                del p1[b]
                p1[r2] = w
                p2 = dict(parts[t2])
                del p2[r2]
                p2[b] = w2
                if _legal(allowed, t, p1) and _legal(allowed, t2, p2):
                    yield "swap", {t: p1, t2: p2}, rw


def _legal(allowed, t: int, per: dict) -> bool:
    """Whether table ``t`` may lie as ``per`` (one rank: table-wise, several: column-wise)."""
    return allowed(t, _TW if len(per) == 1 else _CW)
