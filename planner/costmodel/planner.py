"""``--planner neuroshard``: NeuroShard's greedy grid search and column-wise beam search over the
learned cost, then a local search on the full objective.

For each cap ``s`` in {1.0, 1.05, …, 1.5}: tables sorted by their predicted single-table cost,
largest first; each goes to the device with the lowest predicted fused cost among the devices
where its memory fits and the device's dim sum stays ≤ ``s ×`` the mean dim sum per device
(ties: less memory used); the device's cost is then re-predicted on its whole table multiset
(memoised). Every feasible grid point's plan is scored with the full objective
(:class:`~.objective.Objective`: ``max_r C_r + A_bw,r + A_fw,r`` with the learned compute and,
when comm nets for this device count were shipped, the learned all-to-alls; otherwise the
analytic model's communication) and the best kept. Tables that fit no single device go
row-wise (when allowed), costed as row blocks.

**Column-wise beam search** (NeuroShard's second stage): from the table-wise plan, at each depth
and for each of the ``beam`` (3) best states, the candidates are the top ``candidates`` (10)
shards by size and by predicted single-shard cost whose width halves into multiples of 4 (and
whose table allows column-wise); each is halved and the whole grid search rerun. The ``beam``
best new states go on; the search stops when no candidate is valid or after ``depth`` (10)
halvings or ``max_grids`` grid searches, and returns the best plan seen (zero halvings
included). Halves that land on one device are one shard.

**Local search** (``refine``, :mod:`.refine`; the improvements of the reference notes):
moves, swaps, column splits that need not be halvings and row-wise for hot tables, descending
on the full objective from the search's plan; never worse than it.

Each stage's work is bounded by counts (shards placed by grid searches, objective
evaluations) planned into ``time_limit_s`` (default 8 s) from the seconds each took on this
project's host (:mod:`.budget`), so the plan depends only on the inputs, the limit included;
the clock is a safety stop for a machine much slower than planned, noted when hit.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from simulator.errors import SpecError

from planner.costmodel.budget import Budget, work_budget
from planner.costmodel.objective import Objective
from planner.costmodel.refine import refine as local_search
from planner.costmodel.weights import (
    WEIGHTS_DIR,
    HardwareMismatchWarning,
    load_predictor,
    weights_device,
    weights_for,
)
from planner.model.tables.feasible import check_feasible
from planner.model.tables.memory import shard_memory_bytes
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["NeuroShardPlanner", "GRID", "learned_plan_cost_ms"]

GRID = tuple(round(1.0 + 0.05 * i, 2) for i in range(11))
class NeuroShardPlanner:
    """Greedy grid search, column-wise beam search and local search on the learned cost
    (module docstring).

    ``beam=0`` skips the beam search (table-wise grid search only); otherwise ``beam``
    sequences, ``candidates`` shards per ranking, ``depth`` halvings and ``max_grids`` grid
    searches at most. ``refine``: the local search, with at most ``refine_evals`` objective
    evaluations. Both also stop on the work :func:`.budget.work_budget` plans into the limit.

    The learned model times one kind of device: the weights (``weights``, default the shipped
    ones) must have been trained on the task's device kind (``cpu`` or a catalog GPU, from the
    weights' hardware record). Where none were, ``fallback`` (a
    :class:`~planner.sharding.protocols.Planner` on the analytic cost model; ``get_planner``
    passes ``local_search``) plans instead, with a :class:`HardwareMismatchWarning` and a note
    that say so; without a fallback that is a SpecError.
    """

    name = "neuroshard"

    def __init__(self, weights=None, grid=GRID, beam: int = 3, candidates: int = 10,
                 depth: int = 10, max_grids: int = 601, refine: bool = True,
                 refine_evals: int = 20000, fallback=None) -> None:
        self.weights = weights
        self.fallback = fallback
        self.grid = tuple(grid)
        self.beam, self.candidates, self.depth = int(beam), int(candidates), int(depth)
        self.max_grids = int(max_grids)
        self.refine, self.refine_evals = bool(refine), int(refine_evals)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        """Plan ``task`` on ``devices`` ranks: grid search, column-wise beam search and local
        search on the learned cost (module docstring); ``time_limit_s`` (default 8 s) is a
        safety stop, noted in the plan when hit."""

        t0 = time.perf_counter()
        limit = 8.0 if time_limit_s is None else float(time_limit_s)
        deadline = t0 + limit
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                 ShardingType.ROW_WISE))
        kind = problem.topology.gpu.name
        weights = self._weights_for(kind)
        if weights is None:
            return self._fallback_plan(task, devices, kind, seed=seed, time_limit_s=time_limit_s)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HardwareMismatchWarning)
            pred = load_predictor(weights)
        notes = [str(w.message) for w in caught]
        model = problem.model
        n = problem.devices
        rowwise = _oversized_rowwise(problem)
        tw = [i for i in range(model.num_tables) if i not in rowwise]
        obj = Objective(problem, pred, forced_rowwise=rowwise)
        base_used = obj.memory([], [])
        mean_dim = sum(model.tables[i].embedding_dim for i in tw) / n
        state0 = tuple((i, (model.tables[i].embedding_dim,)) for i in tw)
        # the beam stops at 75% of the time limit so that the local search has time left
        beam_deadline = t0 + (0.75 if self.refine else 1.0) * limit
        stops: list[str] = []
        learned_comm = pred.comm_ms([0.0] * n, [0.0] * n) is not None
        budget = Budget(*work_budget(limit, model.num_tables, learned_comm=learned_comm,
                                     refine=self.refine))

        best = self._table_wise_plan(obj, state0, mean_dim, base_used, notes, budget)
        tw_best = best
        best, grids, depth_done = self._beam_search(obj, best, state0, mean_dim, base_used,
                                                    beam_deadline, limit, stops, budget)
        score, state, units, ranks, s_best = best
        splits = sum(len(w) - 1 for _, w in state)
        notes.append(f"learned cost: predicted max {score:.3f} ms per step at batch "
                     f"{model.batch_size} after the grid search (cap s={s_best}, {splits} "
                     f"column halvings, {grids} grid searches, beam depth {depth_done})")
        rw_final = frozenset()
        if self.refine and n >= 2:
            units, ranks, rw_final = self._local_search(obj, best, tw_best, deadline, limit,
                                                        notes, stops, budget.evals)
        notes += stops
        shardings = obj.layouts(units, ranks, rw_final)
        if rowwise:
            notes.append(f"{len(rowwise)} tables row-wise (fit no single device)")
        if pred.batch != model.batch_size:
            notes.append(f"model trained at batch {pred.batch}: rows scaled by "
                         f"{obj.factor:.4g}")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, shardings, self.name, stats)

    def _weights_for(self, kind: str) -> Path | None:
        """The weights to plan ``kind`` devices with: the given ones if trained on ``kind``
        (or without metadata: :func:`load_predictor` then says what is missing), else the
        shipped ones trained on ``kind``; None when there are none."""
        if self.weights is None:
            return weights_for(kind)
        path = Path(self.weights)
        if not path.with_suffix(".json").exists():
            return path
        return path if weights_device(path) == kind else None

    def _fallback_plan(self, task: ShardingTask, devices: int, kind: str, *, seed: int,
                       time_limit_s: float | None) -> Plan:
        """No weights for ``kind``: the fallback planner on the analytic cost model, with a
        warning and a note that say so."""
        given = (f"the given weights {Path(self.weights).name} were trained on "
                 f"{weights_device(self.weights)}" if self.weights is not None else
                 "none shipped were trained on it (shipped: "
                 + ", ".join(f"{p.stem}, trained on {weights_device(p)}"
                             for p in sorted(WEIGHTS_DIR.glob("*.pt"))) + ")")
        if self.fallback is None:
            raise SpecError(f"no cost-model weights for {kind}: {given}",
                            source="--planner neuroshard",
                            fix="collect and train on the target (`clusterplan costmodel "
                                "collect --device cuda`), or use --planner local_search")
        msg = (f"neuroshard: no learned cost model for {kind}: {given}. Planned with the "
               f"analytic cost model instead ({self.fallback.name}); collect and train on the "
               "target to use the learned one")
        warnings.warn(msg, HardwareMismatchWarning, stacklevel=3)
        plan = self.fallback.plan(task, devices, seed=seed, time_limit_s=time_limit_s)
        stats = replace(plan.stats, notes=(msg,) + tuple(plan.stats.notes))
        return replace(plan, planner=self.name, stats=stats)

    def _grid_search(self, obj: Objective, state, mean_dim: float, base_used,
                     budget: "Budget | None" = None):
        """The best grid point of ``state`` (learned cost, ms) as ``(score, state, units,
        ranks, s)``, over the dim caps ``s × mean_dim``; None when no cap admits a plan."""
        units = obj.units(state)
        if budget is not None:
            budget.units -= len(units)
        order = sorted(range(len(units)), key=lambda k: (-obj.single(units[k]), k))
        best = None
        for s in self.grid:
            ranks = _grid_point(obj, units, order, s * mean_dim, base_used)
            if ranks is None:
                continue
            score = obj.score(units, ranks)
            if best is None or score < best[0] - 1e-12:
                best = (score, state, units, ranks, s)
        return best

    def _table_wise_plan(self, obj: Objective, state0, mean_dim: float, base_used,
                         notes: list[str], budget: "Budget | None" = None):
        """The grid search's plan of the whole tables ``state0``; when no grid point keeps the
        dim cap, a memory-only greedy one (round robin, noted, when even that fails)."""
        best = self._grid_search(obj, state0, mean_dim, base_used, budget)
        if best is None:           # no grid point kept the dim cap: memory-only greedy
            units = obj.units(state0)
            order = sorted(range(len(units)), key=lambda k: (-obj.single(units[k]), k))
            ranks = _grid_point(obj, units, order, float("inf"), base_used)
            if ranks is None:
                ranks = [k % obj.n for k in range(len(units))]
                notes.append("no device has room for every table; plan is over memory")
            best = (obj.score(units, ranks), state0, units, ranks, None)
        return best

    def _beam_search(self, obj: Objective, best, state0, mean_dim: float, base_used,
                     beam_deadline: float, limit: float, stops: list[str], budget: "Budget"):
        """Column-wise beam search from ``best``: the best plan seen, the grid searches run
        and the depth reached. Why it stopped early goes to ``stops``."""
        grids, depth_done = 1, 0
        beams = [best]
        seen = {state0}
        if not (self.beam > 0 and obj.n >= 2):
            return best, grids, depth_done
        for depth in range(self.depth):
            found = []
            for b in beams:
                for cand in _candidates(obj, b[1], self.candidates):
                    if grids >= self.max_grids:
                        stops.append(f"beam search stopped at its {self.max_grids} grid "
                                      "searches")
                        break
                    if time.perf_counter() > beam_deadline:
                        stops.append(f"time limit {limit:g} s: beam search stopped at "
                                     f"depth {depth + 1}")
                        break
                    new = _halve(b[1], cand)
                    if new in seen:
                        continue
                    if len(obj.units(new)) > budget.units:
                        stops.append(f"beam search stopped at depth {depth + 1}: its work "
                                     f"budget for {limit:g} s is spent (a larger --time-limit "
                                     "searches further)")
                        break
                    seen.add(new)
                    grids += 1
                    r = self._grid_search(obj, new, mean_dim, base_used, budget)
                    if r is not None:
                        found.append(r)
                if stops:
                    break
            if not found:
                break
            depth_done = depth + 1
            found.sort(key=lambda r: r[0])
            beams = found[:self.beam]
            if found[0][0] < best[0] - 1e-12:
                best = found[0]
            if stops:
                break
        return best, grids, depth_done

    def _local_search(self, obj: Objective, best, tw_best, deadline: float, limit: float,
                      notes: list[str], stops: list[str], evals: int):
        """Local search from the beam's plan and from the table-wise one (the halvings the
        beam chose on the compute-only grid can be a worse start for the full objective);
        the better result's units, ranks and row-wise tables."""
        starts = [("beam", best), ("table-wise", tw_best)] if tw_best is not best \
            else [("table-wise", tw_best)]
        results = []
        for label, (_, _, u0, r0, _) in starts:
            res = local_search(obj, u0, r0, max_evals=min(self.refine_evals, evals),
                               deadline=deadline)
            results.append((res.score_ms, len(results), label, res))
            done = ", ".join(f"{v} {k}" for k, v in sorted(res.moves.items())) \
                or "no move"
            notes.append(f"local search from the {label} plan: {res.start_ms:.3f} → "
                         f"{res.score_ms:.3f} ms predicted ({done}; {res.evals} "
                         f"evaluations, stopped: {res.stopped_by})")
            if res.stopped_by == "deadline":
                stops.append(f"time limit {limit:g} s: local search stopped early")
        res = min(results)[3]
        return res.units, res.ranks, res.rowwise


def _oversized_rowwise(problem) -> list[int]:
    """Tables whose whole table-wise memory fits no device and that may go row-wise."""
    model = problem.model
    cap = np.array(problem.capacity_bytes, dtype=float)
    full = [shard_memory_bytes(t, t.num_embeddings, t.embedding_dim,
                               ShardingType.TABLE_WISE, model.optimizer)
            for t in model.tables]
    return [i for i, m in enumerate(full) if m > cap.max()
            and problem.allowed(i, ShardingType.ROW_WISE)]


def learned_plan_cost_ms(task: ShardingTask, devices: int, shardings, *, predictor=None
                         ) -> float | None:
    """The learned cost (ms per step, max over devices, as the search scores its states) of any
    plan whose tables are all table-, column- or row-wise; None when another type occurs (the
    learned model times fused lookups of those only). Used to rank other planners' plans."""
    kinds = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)
    if any(ts.sharding_type not in kinds for ts in shardings):
        return None
    pred = predictor or load_predictor(check_hardware=False)
    problem = prepare(task, devices)
    obj = Objective(problem, pred)
    units, ranks, rw = [], [], set()
    for ts in shardings:
        if ts.sharding_type == ShardingType.ROW_WISE:
            rw.add(ts.table)
            continue
        for k, sh in enumerate(ts.shards):
            units.append((ts.table, k, sh.cols))
            ranks.append(sh.rank)
    return obj.score(units, ranks, frozenset(rw))


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


def _candidates(obj: Objective, state, k: int):
    """Top-k shards by size ∪ top-k by predicted cost that may be halved."""
    units = [u for u in obj.units(state)
             if u[2] % 8 == 0 and obj.problem.allowed(u[0], ShardingType.COLUMN_WISE)]
    by_size = sorted(units, key=lambda u: (-obj.unit_mem(u), u))[:k]
    by_cost = sorted(units, key=lambda u: (-obj.single(u), u))[:k]
    out = []
    for u in by_size + by_cost:
        if u not in out:
            out.append(u)
    return out


def _grid_point(obj: Objective, units, order, dim_cap: float, base_used):
    """One grid point: each unit (in ``order``) to the device with the lowest predicted fused
    cost among those with memory room and dim sum ≤ ``dim_cap``; None when one fits nowhere."""
    n = obj.n
    used = np.array(base_used, dtype=float)
    dsum = np.zeros(n)
    cost = np.zeros(n)
    pred = obj.pred
    members: list[list] = [[] for _ in range(n)]
    summed = [0.0] * n                  # additive nets: the device's summed per-table terms
    ranks = [0] * len(units)
    for k in order:
        u = units[k]
        m = obj.unit_mem(u)
        ok = [r for r in range(n) if used[r] + m <= obj.cap[r]
              and dsum[r] + u[2] <= dim_cap + 1e-9]
        if not ok:
            return None
        r = min(ok, key=lambda r: (cost[r], used[r], r))
        ranks[k] = r
        used[r] += m
        dsum[r] += u[2]
        if pred.additive:
            summed[r] = summed[r] + pred.terms(obj.rec(u))
            cost[r] = pred.combine(summed[r])
        else:
            members[r].append(obj.rec(u))
            cost[r] = pred.compute_ms([members[r]])[0]
    return ranks
