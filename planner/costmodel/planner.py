"""``--planner neuroshard``: NeuroShard's greedy grid search and column-wise beam search over the
learned cost.

For each cap ``s`` in {1.0, 1.05, …, 1.5}: tables sorted by their predicted single-table cost,
largest first; each goes to the device with the lowest predicted fused cost among the devices
where its memory fits and the device's dim sum stays ≤ ``s ×`` the mean dim sum per device
(ties: less memory used); the device's cost is then re-predicted on its whole table multiset
(memoised). Every feasible grid point's plan is scored with the full objective and the best
kept: ``max_r C_r + A_bw,r + A_fw,r`` with the learned compute ``C`` and, when comm nets for
this device count were shipped, the learned all-to-alls (the forward one with the straggler
waits ``w_r = (C_r + A_bw,r) − min``); otherwise the analytic model's communication terms of
the plan.

The shipped model was trained at one global batch (:attr:`Predictor.batch`, 4,096); a task with
another batch is mapped to it by scaling rows by ``batch_trained / batch`` and the predicted
times back by ``batch / batch_trained`` (distinct rows and lookups scale alike) — exact for
tasks scaled like the training data, an approximation otherwise. Tables that fit no single
device go row-wise (when allowed) and are costed by the analytic model only.

**Column-wise beam search** (NeuroShard's second stage): from the table-wise plan, at each depth
and for each of the ``beam`` (3) best states, the candidates are the top ``candidates`` (10)
shards by size and by predicted single-shard cost whose width halves into multiples of 4 (and
whose table allows column-wise); each is halved and the whole grid search rerun. The ``beam``
best new states go on; the search stops when no candidate is valid, after ``depth`` (10)
halvings or at the time limit (``time_limit_s``, default 8 s), and returns the best plan seen
(zero halvings included). Halves that land on one device are merged into one shard.
"""

from __future__ import annotations

import time

import numpy as np

from planner.sharding.access import default_reuse_bins, zipf_reuse
from planner.sharding.memory import check_feasible, shard_memory_bytes
from planner.sharding.plan import Plan, PlannerStats, evaluate_shardings, make_plan
from planner.sharding.shards import ShardingType, table_wise
from planner.sharding.task import ShardingTask, prepare

__all__ = ["NeuroShardPlanner", "GRID"]

GRID = tuple(round(1.0 + 0.05 * i, 2) for i in range(11))
_COMM_KEYS = ("input_a2a_s", "output_a2a_fwd_s", "output_a2a_bwd_s", "row_wise_comm_s",
              "table_row_wise_comm_s", "data_parallel_allreduce_s")


def _bins(t, batch: int):
    if t.reuse_bins is not None:
        return list(t.reuse_bins)
    if t.zipf_exponent is not None:
        return list(zipf_reuse(float(t.zipf_exponent), int(t.num_embeddings),
                               float(batch * t.pooling_factor))[0])
    return list(default_reuse_bins())


class NeuroShardPlanner:
    """Greedy grid search (and column-wise beam search) on the learned cost (module docstring).

    ``beam=0`` keeps the plan table-wise; otherwise ``beam`` sequences, ``candidates`` shards
    per ranking and ``depth`` halvings at most, within ``time_limit_s`` (default 8 s).
    """

    name = "neuroshard"

    def __init__(self, weights=None, grid=GRID, beam: int = 3, candidates: int = 10,
                 depth: int = 10) -> None:
        self.weights = weights
        self.grid = tuple(grid)
        self.beam, self.candidates, self.depth = int(beam), int(candidates), int(depth)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        import warnings
        from .weights import HardwareMismatchWarning, load_predictor
        t0 = time.perf_counter()
        limit = 8.0 if time_limit_s is None else float(time_limit_s)
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                 ShardingType.ROW_WISE))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HardwareMismatchWarning)
            pred = load_predictor(self.weights)
        notes = [str(w.message) for w in caught]
        model = problem.model
        n = problem.devices
        recs, factor = _table_records(model, pred)
        cap = np.array(problem.capacity_bytes, dtype=float)
        full = [shard_memory_bytes(t, t.num_embeddings, t.embedding_dim,
                                   ShardingType.TABLE_WISE, model.optimizer)
                for t in model.tables]
        rowwise = [i for i, m in enumerate(full) if m > cap.max()
                   and problem.allowed(i, ShardingType.ROW_WISE)]
        tw = [i for i in range(model.num_tables) if i not in rowwise]
        ctx = _Context(problem, pred, recs, rowwise, factor, cap)
        mean_dim = sum(model.tables[i].embedding_dim for i in tw) / n
        state0 = tuple((i, (model.tables[i].embedding_dim,)) for i in tw)

        def grid(state):
            units = ctx.units(state)
            order = sorted(range(len(units)), key=lambda k: (-ctx.single(units[k]), k))
            best = None
            for s in self.grid:
                ranks = ctx.grid_point(units, order, s * mean_dim)
                if ranks is None:
                    continue
                score = ctx.score(units, ranks)
                if best is None or score < best[0] - 1e-12:
                    best = (score, state, units, ranks, s)
            return best

        best = grid(state0)
        if best is None:           # no grid point kept the dim cap: memory-only greedy
            units = ctx.units(state0)
            order = sorted(range(len(units)), key=lambda k: (-ctx.single(units[k]), k))
            ranks = ctx.grid_point(units, order, float("inf"))
            if ranks is None:
                ranks = [int(np.argmin(ctx.unit_mem(u) * 0 + np.arange(n))) for u in units]
                notes.append("no device has room for every table; plan is over memory")
            best = (ctx.score(units, ranks), state0, units, ranks, None)
        grids, depth_done, timed_out = 1, 0, False
        beams = [best]
        seen = {state0}
        if self.beam > 0 and n >= 2:
            for depth in range(self.depth):
                found = []
                for b in beams:
                    for cand in ctx.candidates(b[1], self.candidates):
                        if time.perf_counter() - t0 > limit:
                            timed_out = True
                            break
                        new = _halve(b[1], cand)
                        if new in seen:
                            continue
                        seen.add(new)
                        grids += 1
                        r = grid(new)
                        if r is not None:
                            found.append(r)
                    if timed_out:
                        break
                if not found:
                    break
                depth_done = depth + 1
                found.sort(key=lambda r: r[0])
                beams = found[:self.beam]
                if found[0][0] < best[0] - 1e-12:
                    best = found[0]
                if timed_out:
                    break
        score, state, units, ranks, s_best = best
        shardings = ctx.layouts(units, ranks)
        splits = sum(len(w) - 1 for _, w in state)
        notes.append(f"learned cost: predicted max {score:.3f} ms per step at batch "
                     f"{model.batch_size} (cap s={s_best}, {splits} column halvings, "
                     f"{grids} grid searches, beam depth {depth_done})")
        if timed_out:
            notes.append(f"time limit {limit:g} s: beam search stopped at depth {depth_done + 1}")
        if rowwise:
            notes.append(f"{len(rowwise)} tables row-wise (fit no single device)")
        if not problem.topology_ref.startswith("localhost"):
            notes.append(f"the learned model times this machine's CPU kernels, not "
                         f"{problem.topology.gpu.name}: collect and train on the target to plan "
                         "for it")
        if pred.batch != model.batch_size:
            notes.append(f"model trained at batch {pred.batch}: rows scaled by {factor:.4g}")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, shardings, self.name, stats)


def _table_records(model, pred) -> tuple[list, float]:
    """The predictor's per-table records ``[rows, dim, pooling, bins…]`` at its training batch
    (rows scaled by ``factor = batch_trained / batch``), and that factor."""
    factor = pred.batch / model.batch_size
    recs = [[max(1.0, round(t.num_embeddings * factor)), t.embedding_dim,
             t.pooling_factor] + _bins(t, model.batch_size) for t in model.tables]
    return recs, factor


def learned_plan_cost_ms(task: ShardingTask, devices: int, shardings, *, predictor=None
                         ) -> float | None:
    """The learned cost (ms per step, max over devices, as the search scores its states) of any
    plan whose tables are all table- or column-wise; None when another type occurs (the
    learned model times fused TW/CW lookups only). Used to rank other planners' plans."""
    from .weights import load_predictor
    if any(ts.sharding_type not in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)
           for ts in shardings):
        return None
    pred = predictor or load_predictor(check_hardware=False)
    problem = prepare(task, devices)
    model = problem.model
    recs, factor = _table_records(model, pred)
    ctx = _Context(problem, pred, recs, [], factor, np.array(problem.capacity_bytes, float))
    units, ranks = [], []
    for ts in shardings:
        for k, sh in enumerate(ts.shards):
            units.append((ts.table, k, sh.cols))
            ranks.append(sh.rank)
    return ctx.score(units, ranks)


def _halve(state, unit):
    """The state with shard ``unit = (table, k, width)`` cut into two halves."""
    t, k, w = unit
    out = []
    for i, widths in state:
        if i == t:
            ws = list(widths)
            ws[k:k + 1] = [w // 2, w // 2]
            widths = tuple(ws)
        out.append((i, widths))
    return tuple(out)


class _Context:
    """Per-plan caches: unit records, memory, single-unit costs, scoring and layouts."""

    def __init__(self, problem, pred, recs, rowwise, factor, cap) -> None:
        self.problem, self.pred, self.recs = problem, pred, recs
        self.rowwise, self.factor, self.cap = rowwise, factor, cap
        self.n = problem.devices
        self._mem: dict = {}
        self._single: dict = {}

    @staticmethod
    def units(state):
        return [(t, k, w) for t, widths in state for k, w in enumerate(widths)]

    def rec(self, unit):
        r = list(self.recs[unit[0]])
        r[1] = unit[2]
        return r

    def unit_mem(self, unit) -> float:
        key = (unit[0], unit[2])
        if key not in self._mem:
            t = self.problem.model.tables[unit[0]]
            st = ShardingType.TABLE_WISE if unit[2] == t.embedding_dim \
                else ShardingType.COLUMN_WISE
            self._mem[key] = float(shard_memory_bytes(t, t.num_embeddings, unit[2], st,
                                                      self.problem.model.optimizer))
        return self._mem[key]

    def single(self, unit) -> float:
        key = (unit[0], unit[2])
        if key not in self._single:
            self._single[key] = float(self.pred.compute_ms([[self.rec(unit)]])[0])
        return self._single[key]

    def candidates(self, state, k: int):
        """Top-k shards by size ∪ top-k by predicted cost that may be halved."""
        units = [u for u in self.units(state)
                 if u[2] % 8 == 0 and self.problem.allowed(u[0], ShardingType.COLUMN_WISE)]
        by_size = sorted(units, key=lambda u: (-self.unit_mem(u), u))[:k]
        by_cost = sorted(units, key=lambda u: (-self.single(u), u))[:k]
        out = []
        for u in by_size + by_cost:
            if u not in out:
                out.append(u)
        return out

    def grid_point(self, units, order, dim_cap):
        n = self.n
        used = np.zeros(n)
        dsum = np.zeros(n)
        cost = np.zeros(n)
        members: list[list] = [[] for _ in range(n)]
        ranks = [0] * len(units)
        for k in order:
            u = units[k]
            m = self.unit_mem(u)
            ok = [r for r in range(n) if used[r] + m <= self.cap[r]
                  and dsum[r] + u[2] <= dim_cap + 1e-9]
            if not ok:
                return None
            r = min(ok, key=lambda r: (cost[r], used[r], r))
            ranks[k] = r
            used[r] += m
            dsum[r] += u[2]
            members[r].append(self.rec(u))
            cost[r] = self.pred.compute_ms([members[r]])[0]
        return ranks

    def score(self, units, ranks) -> float:
        n, pred, factor = self.n, self.pred, self.factor
        members: list[list] = [[] for _ in range(n)]
        dsum = np.zeros(n)
        for u, r in zip(units, ranks):
            members[r].append(self.rec(u))
            dsum[r] += u[2]
        comp = pred.compute_ms(members) / factor
        comm = None if self.rowwise else pred.comm_ms(list(dsum), [0.0] * n)
        if comm is not None:
            bwd = comm[1] / factor
            base = comp + bwd
            waits = base - base.min()
            fwd = pred.comm_ms(list(dsum), list(waits * factor))[0] / factor
            per = comp + bwd + fwd
        else:
            ev = evaluate_shardings(self.problem, self.layouts(units, ranks))
            per = comp + sum(np.asarray(ev.breakdown_s[k]) for k in _COMM_KEYS) * 1e3
        return float(per.max())

    def layouts(self, units, ranks):
        from planner.sharding.shards import column_wise, row_wise
        model = self.problem.model
        parts: dict[int, list] = {}
        for u, r in zip(units, ranks):
            parts.setdefault(u[0], []).append((r, u[2]))
        out = []
        for i, t in enumerate(model.tables):
            if i not in parts:
                out.append(row_wise(i, t.name, t.num_embeddings, t.embedding_dim,
                                    self.problem.devices))
                continue
            per_rank: dict[int, int] = {}
            for r, w in parts[i]:
                per_rank[r] = per_rank.get(r, 0) + w
            if len(per_rank) == 1:
                out.append(table_wise(i, t.name, t.num_embeddings, t.embedding_dim,
                                      next(iter(per_rank))))
            else:
                rs = sorted(per_rank)
                out.append(column_wise(i, t.name, t.num_embeddings, t.embedding_dim, rs,
                                       [per_rank[r] for r in rs]))
        return tuple(out)
