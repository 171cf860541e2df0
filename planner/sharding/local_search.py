"""Local search: improve any plan's maximum per-rank cost by moves, swaps, splits and merges.

Steepest descent on the key ``(max per-rank cost, Σ per-rank cost²)`` — the second term breaks
the plateaus of a min-max objective by also relieving the runner-up ranks — over the
neighbourhood of the bottleneck rank ``r*``:

- move a table-wise table from ``r*`` to another rank, or one column part of a column-wise
  table from ``r*`` to another rank (parts on one rank merge);
- swap a table-wise table on ``r*`` with a table-wise table on another rank;
- split a table-wise table on ``r*`` into two column halves, one staying, one on another rank;
- merge a column-wise table with parts on ``r*`` back into one table-wise table on any rank;
- turn a table on ``r*`` row-wise, data-parallel or (on several hosts) table-row-wise over any
  one host, or such a table back into a table-wise one (when those types are allowed).

Only moves that keep every rank within its memory are scored, and only strict improvements are
taken, so the result is never worse than the start. When no move improves, an iterated-local-
search round perturbs the best plan with a few random moves (seeded) and descends again; the
best plan over ``rounds`` rounds wins. The work done depends only on the inputs and the seed;
``time_limit_s`` is a safety stop (noted in the stats when it triggers).
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from planner.model.tables.cost import F_MEM
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType, TableSharding
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import Catalog, catalog
from planner.sharding.greedy import GreedyPlanner
from planner.sharding.protocols import Planner

__all__ = ["LocalSearchPlanner", "improve_choices", "improve"]

_TW, _CW, _RW, _DP, _TWRW = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                             ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL,
                             ShardingType.TABLE_ROW_WISE)


class _Search:
    def __init__(self, cat: Catalog, rng: np.random.Generator, deadline: float) -> None:
        self.cat = cat
        self.cm = cat.cost
        self.n = cat.n
        self.rng = rng
        self.deadline = deadline
        self._contrib: dict[tuple, np.ndarray] = {}
        self.evaluated = 0
        self.timed_out = False
        self.work_budget = float("inf")
        self.out_of_work = False

    def contrib(self, t: int, ch) -> np.ndarray:
        key = (t, ch)
        c = self._contrib.get(key)
        if c is None:
            c = self._contrib[key] = self.cat.contrib(t, ch)
        return c

    def key(self, costs: np.ndarray) -> tuple[float, float]:
        return float(costs.max()), float((costs ** 2).sum())

    @staticmethod
    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        tol = 1e-12 * max(abs(b[0]), 1e-30)
        if a[0] < b[0] - tol:
            return True
        return abs(a[0] - b[0]) <= tol and a[1] < b[1] * (1 - 1e-12)

    # -- neighbourhood ------------------------------------------------------------------------
    def moves(self, choices: Sequence, r: int) -> list[tuple[tuple[int, tuple], ...]]:
        cat, n = self.cat, self.n
        out: list[tuple[tuple[int, tuple], ...]] = []
        on_r: list[int] = []
        tw_by_rank: dict[int, list[int]] = {}
        for t, ch in enumerate(choices):
            if ch[0] == "tw":
                tw_by_rank.setdefault(ch[1], []).append(t)
        for t, ch in enumerate(choices):
            kind = ch[0]
            if kind == "tw" and ch[1] == r:
                on_r.append(t)
                for d in range(n):
                    if d != r:
                        out.append(((t, ("tw", d)),))
                if 2 in cat.cw_parts(t, (2,)):
                    for d in range(n):
                        if d != r:
                            c = [0] * n
                            c[r] = c[d] = 1
                            out.append(((t, ("cw", 2, tuple(c))),))
            elif kind == "cw" and ch[2][r] > 0:
                on_r.append(t)
                for d in range(n):
                    if d != r:
                        c = list(ch[2])
                        c[r] -= 1
                        c[d] += 1
                        out.append(((t, cat.normalise(("cw", ch[1], tuple(c)))),))
                    out.append(((t, ("tw", d)),))
            elif kind in ("rw", "dp", "twrw"):
                for d in range(n):
                    out.append(((t, ("tw", d)),))
        hosts = len(self.cm.hosts)
        for t in on_r:
            if cat.can(t, _RW):
                out.append(((t, ("rw",)),))
            if cat.can(t, _DP):
                out.append(((t, ("dp",)),))
            if hosts > 1 and cat.can(t, _TWRW):
                out.extend(((t, ("twrw", h)),) for h in range(hosts))
        for t in tw_by_rank.get(r, []):
            for d in range(n):
                if d == r:
                    continue
                for u in tw_by_rank.get(d, []):
                    out.append(((t, ("tw", d)), (u, ("tw", r))))
        return [m for m in out if all(self._allowed(t, ch) for t, ch in m)]

    def _allowed(self, t: int, ch) -> bool:
        kind = ch[0]
        st = {"tw": _TW, "cw": _CW, "rw": _RW, "dp": _DP, "twrw": _TWRW}[kind]
        return self.cat.can(t, st) or (kind == "tw" and self.cat.problem.allowed(t, _TW))

    # -- descent ------------------------------------------------------------------------------
    def descend(self, choices: list, F: np.ndarray, max_iters: int) -> tuple[list, np.ndarray, int]:
        cm = self.cm
        cap = self.cat.cap
        costs = cm.rank_costs(F)
        cur = self.key(costs)
        iters = 0
        while iters < max_iters:
            if self.evaluated * self.n >= self.work_budget:
                self.out_of_work = True
                break
            if time.perf_counter() > self.deadline:
                self.timed_out = True
                break
            r = int(np.argmax(costs))
            moves = self.moves(choices, r)
            if not moves:
                break
            deltas = np.empty((len(moves),) + F.shape)
            for i, m in enumerate(moves):
                d = np.zeros_like(F)
                for t, ch in m:
                    d += self.contrib(t, ch) - self.contrib(t, choices[t])
                deltas[i] = d
            cand = F[None] + deltas
            ok = (cand[:, :, F_MEM] <= cap[None, :] + 0.5).all(axis=1)
            if not ok.any():
                break
            idx = np.flatnonzero(ok)
            c = cm.rank_costs(cand[idx])
            self.evaluated += idx.size
            mx = c.max(axis=1)
            sq = (c ** 2).sum(axis=1)
            best = np.lexsort((idx, sq, mx))[0]
            k = (float(mx[best]), float(sq[best]))
            if not self.better(k, cur):
                break
            i = int(idx[best])
            for t, ch in moves[i]:
                choices[t] = ch
            F = cand[i]
            costs = c[best]
            cur = k
            iters += 1
        return choices, F, iters

    def perturb(self, choices: list, F: np.ndarray, steps: int) -> tuple[list, np.ndarray]:
        choices = list(choices)
        cap = self.cat.cap
        for _ in range(steps):
            r = int(self.rng.integers(self.n))
            moves = self.moves(choices, r)
            if not moves:
                continue
            for _try in range(8):
                m = moves[int(self.rng.integers(len(moves)))]
                d = np.zeros_like(F)
                for t, ch in m:
                    d += self.contrib(t, ch) - self.contrib(t, choices[t])
                if ((F + d)[:, F_MEM] <= cap + 0.5).all():
                    for t, ch in m:
                        choices[t] = ch
                    F = F + d
                    break
        return choices, F


def improve_choices(cat: Catalog, choices: Sequence, *, seed: int = 0, rounds: int = 6,
                    max_iters: int = 400, perturb_steps: int = 3,
                    time_limit_s: float | None = None,
                    work_budget: float | None = None) -> tuple[list, dict]:
    """Improve ``choices`` (one per table); returns the best choices and search statistics.

    ``work_budget`` bounds the work in rank-evaluations (candidate plans scored × ranks): a
    stop that depends only on the inputs, so a budgeted search gives the same plan on any
    machine. ``time_limit_s`` is the safety stop (``timed_out`` in the statistics).
    """
    t0 = time.perf_counter()
    deadline = t0 + (time_limit_s if time_limit_s is not None else float("inf"))
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x4C53]))
    s = _Search(cat, rng, deadline)
    if work_budget is not None:
        s.work_budget = float(work_budget)
    choices = list(choices)
    F = cat.features(choices)
    best, Fb, iters = s.descend(list(choices), F.copy(), max_iters)
    best_key = s.key(cat.cost.rank_costs(Fb))
    total = iters
    for _ in range(rounds):
        if s.out_of_work:
            break
        if s.timed_out or time.perf_counter() > deadline:
            s.timed_out = True
            break
        c, Fc = s.perturb(best, Fb, perturb_steps)
        c, Fc, iters = s.descend(c, Fc, max_iters)
        total += iters
        k = s.key(cat.cost.rank_costs(Fc))
        if s.better(k, best_key) and (Fc[:, F_MEM] <= cat.cap + 0.5).all():
            best, Fb, best_key = c, Fc, k
    return best, {"iterations": total, "evaluated": s.evaluated, "timed_out": s.timed_out,
                  "out_of_work": s.out_of_work}


def improve(problem, shardings: Sequence[TableSharding], *, seed: int = 0,
            **kw) -> tuple[TableSharding, ...]:
    """Improve the layouts of any plan of ``problem``; never returns a worse plan."""
    cat = catalog(problem)
    start = cat.choices_of(shardings)
    best, _ = improve_choices(cat, start, seed=seed, **kw)
    return cat.layouts(best)


class LocalSearchPlanner:
    """``greedy`` (or another planner's plan) improved by local search."""

    name = "local_search"

    def __init__(self, *, start: Planner | None = None, rounds: int = 6, max_iters: int = 400,
                 default_time_limit_s: float = 20.0) -> None:
        self.start = start if start is not None else GreedyPlanner()
        self.rounds = rounds
        self.max_iters = max_iters
        self.default_time_limit_s = default_time_limit_s

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        limit = self.default_time_limit_s if time_limit_s is None else time_limit_s
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                 ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL))
        start = self.start.plan(task, devices, seed=seed)
        cat = catalog(problem)
        choices, info = improve_choices(cat, cat.choices_of(start.shardings), seed=seed,
                                        rounds=self.rounds, max_iters=self.max_iters,
                                        time_limit_s=max(0.0, limit - (time.perf_counter() - t0)))
        notes = list(start.stats.notes)
        notes.append(f"start {self.start.name}: max cost {start.max_cost_s:.6g} s")
        if info["timed_out"]:
            notes.append("stopped at the time limit: the result may depend on machine speed")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, iterations=info["iterations"],
                             notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
