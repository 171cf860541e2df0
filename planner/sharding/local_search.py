"""Local search: improve any plan's step cost by moves, swaps, splits and merges.

Descent on the key ``(step cost, Σ over phases and ranks of the phase's cost²)`` (the step
cost is each phase's slowest rank, summed: ``CostModel.step_cost``; the second term breaks the
plateaus of a min-max objective by also relieving the runner-up ranks). The bottleneck ranks
are the slowest rank of each phase and of the total, the one whose lightening would shorten
the step most first; each step takes the best improving move of the first bottleneck rank
``r*`` whose neighbourhood has one:

- move a table-wise table from ``r*`` to another rank, or one column part of a column-wise
  table from ``r*`` to another rank (parts on one rank merge);
- swap a table-wise table on ``r*`` with a table-wise table on another rank;
- split a table-wise table on ``r*`` into two column halves, one staying, one on another rank;
- merge a column-wise table with parts on ``r*`` back into one table-wise table on any rank;
- turn a table on ``r*`` row-wise, data-parallel or (on several hosts) table-row-wise over any
  one host, or such a table spread over ``r*`` back into a table-wise one on one of the
  :data:`SPREAD_DESTS` cheapest ranks (when those types are allowed).

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

from planner.model.tables.features import BREAKDOWN_KEYS, F_MEM
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType, TableSharding
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import Catalog, catalog, step_scores
from planner.sharding.greedy import GreedyPlanner
from planner.sharding.protocols import Planner

__all__ = ["LocalSearchPlanner", "improve_choices", "improve"]

_TW, _CW, _RW, _DP, _TWRW = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                             ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL,
                             ShardingType.TABLE_ROW_WISE)


#: ranks a spread table may go to table-wise in one descent step (the cheapest now)
SPREAD_DESTS = 16


class _Search:
    def __init__(self, cat: Catalog, rng: np.random.Generator, deadline: float) -> None:
        self.cat = cat
        self.cm = cat.cost
        self.n = cat.n
        self.rng = rng
        self.deadline = deadline
        self._contrib: dict[tuple, np.ndarray] = {}
        self._diff: dict[tuple, np.ndarray] = {}
        self.evaluated = 0
        self.timed_out = False
        self.work_budget = float("inf")
        self.out_of_work = False
        kinds = {"tw": _TW, "cw": _CW, "rw": _RW, "dp": _DP, "twrw": _TWRW}
        self._kinds = [{k for k, st in kinds.items() if cat.can(t, st)
                        or (k == "tw" and cat.problem.allowed(t, _TW))}
                       for t in range(cat.model.num_tables)]
        self._halves = [2 in cat.cw_parts(t, (2,)) for t in range(cat.model.num_tables)]
        # table-wise features per table, and a zero row (index -1) for "no table"
        self._tw = np.stack([cat.tw(t) for t in range(cat.model.num_tables)]
                            + [np.zeros_like(cat.tw(0))])

    def contrib(self, t: int, ch) -> np.ndarray:
        key = (t, ch)
        c = self._contrib.get(key)
        if c is None:
            c = self._contrib[key] = self.cat.contrib(t, ch)
        return c

    def diff(self, t: int, ch, cur) -> np.ndarray:
        """Per-rank features (n, width) that table t gains moving from choice ``cur`` to ``ch``."""
        key = (t, ch, cur)
        d = self._diff.get(key)
        if d is None:
            d = self._diff[key] = self.contrib(t, ch) - self.contrib(t, cur)
        return d

    def key(self, F: np.ndarray) -> tuple[float, float]:
        step, sq = step_scores(self.cm, F)
        return float(step), float(sq)

    def bottlenecks(self, F: np.ndarray) -> list[int]:
        """Ranks whose load bounds the step, most promising first: a rank's gain is what the
        step would lose if that rank alone were lightened (per phase it is the slowest in,
        the gap to the runner-up); the slowest rank in total comes first among equals."""
        comp = self.cm.components(F)
        total = sum(comp[k] for k in BREAKDOWN_KEYS)
        gain = np.zeros(self.n)
        top = int(np.argmax(total))
        ranks = {top}
        for k in BREAKDOWN_KEYS:
            c = comp[k]
            if np.ptp(c) > 0:
                r = int(np.argmax(c))
                ranks.add(r)
                gain[r] += c[r] - np.partition(c, -2)[-2]
        return sorted(ranks, key=lambda r: (-gain[r], r != top, r))

    @staticmethod
    def better(a: tuple[float, float], b: tuple[float, float]) -> bool:
        tol = 1e-12 * max(abs(b[0]), 1e-30)
        if a[0] < b[0] - tol:
            return True
        return abs(a[0] - b[0]) <= tol and a[1] < b[1] * (1 - 1e-12)

    # -- neighbourhood ------------------------------------------------------------------------
    def moves(self, choices: Sequence, r: int, F: np.ndarray | None = None
              ) -> tuple[list, np.ndarray]:
        """The moves from rank ``r``: ``(moves, tw)``, ``moves`` a list of changes
        ``((table, choice), ...)`` and ``tw`` the table-wise moves and swaps as rows
        ``(t, u, d)``: table t from r to d and, when ``u ≥ 0``, table u from d to r. A table
        spread over r (row-wise, data-parallel, table-row-wise on r's host) may become
        table-wise on any rank, or with the features ``F`` of the plan now on the
        :data:`SPREAD_DESTS` ranks of lowest cost (every spread table to every rank is
        ranks × tables candidate plans: 77 k of 256 ranks each for 300 tables)."""
        n = self.n
        dests = range(n)
        if F is not None and n > SPREAD_DESTS:
            costs = self.cm.rank_costs(F)
            dests = np.sort(np.argsort(costs, kind="stable")[:SPREAD_DESTS]).tolist()
        host = self.cm.host_of[r]
        out: list[tuple[tuple[int, tuple], ...]] = []
        on_r: list[int] = []
        for t, ch in enumerate(choices):
            kind = ch[0]
            if kind == "tw" and ch[1] == r:
                on_r.append(t)
                if self._halves[t] and "cw" in self._kinds[t]:
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
                        out.append(((t, self.cat.normalise(("cw", ch[1], tuple(c)))),))
                    out.append(((t, ("tw", d)),))
            elif kind in ("rw", "dp") or (kind == "twrw" and ch[1] == host):
                out.extend(((t, ("tw", d)),) for d in dests)
        hosts = len(self.cm.hosts)
        for t in on_r:
            out.extend(((t, (k,)),) for k in ("rw", "dp") if k in self._kinds[t])
            if hosts > 1 and "twrw" in self._kinds[t]:
                out.extend(((t, ("twrw", h)),) for h in range(hosts))
        kinds = self._kinds
        out = [m for m in out if all(ch[0] in kinds[t] for t, ch in m)]
        return out, self._tw_moves(choices, r)

    def _tw_moves(self, choices: Sequence, r: int) -> np.ndarray:
        """Rows ``(t, u, d)`` (see :meth:`moves`): every table-wise table on r to every other
        rank, and swapped with every table-wise table elsewhere."""
        tw = [(t, ch[1]) for t, ch in enumerate(choices) if ch[0] == "tw"]
        mine = np.array([t for t, d in tw if d == r], dtype=np.int64)
        if mine.size == 0:
            return np.zeros((0, 3), dtype=np.int64)
        others = np.array([(t, d) for t, d in tw if d != r], dtype=np.int64).reshape(-1, 2)
        dests = np.array([d for d in range(self.n) if d != r], dtype=np.int64)
        single = np.column_stack([np.repeat(mine, dests.size), np.full(mine.size * dests.size, -1),
                                  np.tile(dests, mine.size)])
        swap = np.column_stack([np.repeat(mine, len(others)), np.tile(others[:, 0], mine.size),
                                np.tile(others[:, 1], mine.size)])
        return np.concatenate([single, swap])

    @staticmethod
    def tw_move(row, r: int) -> tuple[tuple[int, tuple], ...]:
        t, u, d = (int(x) for x in row)
        return ((t, ("tw", d)),) if u < 0 else ((t, ("tw", d)), (u, ("tw", r)))

    def all_moves(self, choices: Sequence, r: int) -> list:
        moves, tw = self.moves(choices, r)
        return moves + [self.tw_move(row, r) for row in tw]

    def deltas(self, choices: Sequence, moves: list, tw: np.ndarray, r: int) -> np.ndarray:
        """Feature change (len(moves) + len(tw), n, width) of each move from ``choices``."""
        d = np.zeros((len(moves) + len(tw), self.n, self._tw.shape[1]))
        if moves:
            d[:len(moves)] = np.stack([self.diff(m[0][0], m[0][1], choices[m[0][0]])
                                       for m in moves])
            two = [i for i, m in enumerate(moves) if len(m) > 1]
            if two:
                d[two] += np.stack([self.diff(moves[i][1][0], moves[i][1][1],
                                              choices[moves[i][1][0]]) for i in two])
        if len(tw):
            v = self._tw[tw[:, 0]] - self._tw[tw[:, 1]]        # row -1 of _tw is zero
            rows = np.arange(len(moves), len(moves) + len(tw))
            d[rows, tw[:, 2]] += v
            d[rows, r] -= v
        return d

    # -- descent ------------------------------------------------------------------------------
    def best_move(self, choices: Sequence, F: np.ndarray, cur: tuple[float, float]):
        """The best improving move among the bottleneck ranks' neighbourhoods, taken from the
        first rank (in :meth:`bottlenecks` order) that has one: ``(move, F, key)`` or None."""
        cap = self.cat.cap
        for r in self.bottlenecks(F):
            moves, tw = self.moves(choices, r, F)
            if not moves and not len(tw):
                continue
            cand = F[None] + self.deltas(choices, moves, tw, r)
            idx = np.flatnonzero((cand[:, :, F_MEM] <= cap[None, :] + 0.5).all(axis=1))
            if idx.size == 0:
                continue
            mx, sq = step_scores(self.cm, cand[idx])
            self.evaluated += idx.size
            best = np.lexsort((idx, sq, mx))[0]
            k = (float(mx[best]), float(sq[best]))
            if self.better(k, cur):
                i = int(idx[best])
                move = moves[i] if i < len(moves) else self.tw_move(tw[i - len(moves)], r)
                return move, cand[i], k
        return None

    def descend(self, choices: list, F: np.ndarray, max_iters: int) -> tuple[list, np.ndarray, int]:
        cur = self.key(F)
        iters = 0
        while iters < max_iters:
            if self.evaluated * self.n >= self.work_budget:
                self.out_of_work = True
                break
            if time.perf_counter() > self.deadline:
                self.timed_out = True
                break
            found = self.best_move(choices, F, cur)
            if found is None:
                break
            move, F, cur = found
            for t, ch in move:
                choices[t] = ch
            iters += 1
        return choices, F, iters

    def perturb(self, choices: list, F: np.ndarray, steps: int) -> tuple[list, np.ndarray]:
        choices = list(choices)
        cap = self.cat.cap
        for _ in range(steps):
            r = int(self.rng.integers(self.n))
            moves = self.all_moves(choices, r)
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
    best_key = s.key(Fb)
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
        k = s.key(Fc)
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
                 default_time_limit_s: float = 60.0) -> None:
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
        notes.append(f"start {self.start.name}: step cost {start.step_cost_s:.6g} s")
        if info["timed_out"]:
            notes.append("stopped at the time limit: the result may depend on machine speed")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, iterations=info["iterations"],
                             notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
