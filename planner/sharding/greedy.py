"""Cost-driven LPT greedy with column splitting and row-wise or table-row-wise spreading.

1. Tables that fit on no single device are cut into the fewest equal column parts (2, 4 or 8,
   widths multiples of 4) whose part fits, or go row-wise when column-wise cannot help.
2. Every table's *standalone cost* is the rise of each phase's slowest rank (analytic model,
   communication included; their sum is the step cost, ``CostModel.step_cost``) when it
   alone is added to an empty plan (one whose ranks each make a table-wise lookup call
   already: :func:`_table_wise_call`). Costliest first, a table whose cost plus the share every
   rank already carries of the tables spread row-wise before it exceeds the per-rank average
   of all tables (in total, or in one phase: two rules, two plans, the lower step cost kept)
   stays whole, is cut into 2, 4 or 8 column parts, is spread row-wise over every rank or,
   on a topology of several hosts, table-row-wise over one host's ranks, whichever bounds
   the plan's step cost lowest (:func:`_heavy_split`), each option priced for what it is: a
   column part still serves every id, so on a GPU profile whose backward is dominated by
   per-id work it costs nearly the whole table, while a spread splits the ids but adds its
   collectives. Each choice updates the average and, for a row-wise spread, the share.
3. Units (whole tables, column parts, spreads), costliest first, each go to the rank (a host
   spread: the host; a row-wise spread: every rank) that minimises the resulting step cost,
   then the sum over phases and ranks of the phase's cost squared (a host spread: that
   host's slowest rank), then the index; only ranks with memory room are candidates, and of
   those at most :data:`SHORTLIST`, the cheapest now. Parts of one table that land on one
   rank merge into one shard (no duplicated ids), so the cost of a unit depends on where its
   siblings are.
4. Every rank pays each lookup group it holds one call (``CostModel.calls``), so plans of
   one group per rank are candidates too: every table row-wise, and every table
   table-row-wise on the host that keeps the step cost lowest (:func:`_one_type`). The plan
   with the lowest step cost that fits memory is greedy's.
"""

from __future__ import annotations

import time

import numpy as np

from simulator.errors import SpecError

from planner.model.tables.features import BREAKDOWN_KEYS, F_BWD, F_FWD, F_MEM
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import CW_PARTS, Catalog, catalog, step_scores
from planner.sharding.greedy_work import CALL_EVALS, SHORTLIST, Work

__all__ = ["GreedyPlanner", "greedy_choices"]


def greedy_choices(cat: Catalog, *, split: bool = True, parts=CW_PARTS,
                   work: Work | None = None) -> tuple[list, list[str]]:
    """The greedy plan's choices (one per table) and notes: of the plans by both split rules
    (:func:`_heavy_split`) and the one-type plans (:func:`_one_type`), the one with the lowest
    step cost that fits memory (ties: the total rule, then the one-type plans). With a
    ``work`` budget the phase rule runs only when what is left would pay for a run like the
    first."""
    work = work or Work()
    if not split:
        return _greedy(cat, split=False, parts=parts, by_phase=False, work=work)
    plans = [_greedy(cat, split=True, parts=parts, by_phase=False, work=work)]
    for kind in ("twrw", "rw"):          # cheaper than a second rule's run: first
        one = _one_type(cat, kind, work)
        if one is not None:
            plans.append(one)
    if work.left is None or work.left >= work.spent:
        plans.append(_greedy(cat, split=True, parts=parts, by_phase=True, work=work))
    else:
        plans[0][1].append("greedy's phase rule was skipped: the time limit leaves no work "
                           "for it")
    costs = [_valid_cost(cat, c) for c, _ in plans]
    return plans[int(np.argmin(costs))]


def _valid_cost(cat: Catalog, choices) -> float:
    """The step cost of complete choices that fit every rank's memory; else infinite."""
    if any(x is None for x in choices):
        return np.inf
    F = cat.features(choices)
    return float(cat.cost.step_cost(F)) if np.all(F[:, F_MEM] <= cat.cap) else np.inf


def _one_type(cat: Catalog, kind: str, work: Work) -> tuple[list, list[str]] | None:
    """Every table row-wise (``kind`` "rw"), or every table table-row-wise on the host that
    keeps the step cost lowest, costliest first ("twrw"): plans whose ranks make one lookup
    call each, which moving one table at a time from greedy's plan cannot reach (each move
    adds a call before the last one removes one). None when a table may not take the type,
    or the work budget cannot pay for it."""
    T, n = cat.model.num_tables, cat.n
    st = ShardingType.ROW_WISE if kind == "rw" else ShardingType.TABLE_ROW_WISE
    if not all(cat.can(t, st) for t in range(T)):
        return None
    note = [f"greedy's plan is every table {st.value}: the lowest step cost of its candidates"]
    if kind == "rw":
        return [("rw",)] * T, note
    hosts = len(cat.cost.hosts)
    if work.left is not None and work.left < T * (hosts * n + 2 * CALL_EVALS):
        return None
    F = _call_mark(cat, st)
    choices: list = [None] * T
    for t in sorted(range(T), key=lambda t: (-float(cat.tw(t)[F_FWD] + cat.tw(t)[F_BWD]), t)):
        work.spend(hosts * n, calls=2)
        F, (h, _) = _place_on_host(cat, t, F)
        choices[t] = ("twrw", h)
    return choices, note


def _greedy(cat: Catalog, *, split: bool, parts, by_phase: bool, work: Work
            ) -> tuple[list, list[str]]:
    """One greedy plan: choices and notes; ``by_phase``: the split rule of
    :func:`_heavy_split`; ``work``: charged for every candidate plan priced."""
    n, T = cat.n, cat.model.num_tables
    choices: list = [None] * T
    notes: list[str] = []
    forced_k = _forced_splits(cat, parts, choices, notes)
    F = cat.features(choices) + _table_wise_call(cat)
    units, parts_of, F = _sized_units(cat, F, [t for t in range(T) if choices[t] is None],
                                      forced_k, split=split, parts=parts, by_phase=by_phase,
                                      work=work)
    hosts = len(cat.cost.hosts)
    placed = sum(1 for _, _, k in units if k not in (TWRW_UNIT, RW_UNIT))
    on_hosts = sum(k == TWRW_UNIT for _, _, k in units)
    short = work.shortlist(n * (placed + hosts * on_hosts) + 2 * on_hosts * CALL_EVALS, placed,
                           n)
    if short < min(SHORTLIST, n):
        notes.append(f"greedy scored {short} of the ranks with room per unit (else "
                     f"{min(SHORTLIST, n)}): the time limit's work budget")
    counts: dict[int, np.ndarray] = {}
    for _, t, k in units:
        if k == TWRW_UNIT:
            work.spend(hosts * n, calls=2)
            F, note = _place_on_host(cat, t, F)
            choices[t] = ("twrw", note[0])
            if note[1]:
                notes.append(note[1])
            continue
        if k == RW_UNIT:
            F = F + cat.uniform(t, "rw")
            choices[t] = ("rw",)
            if np.any(F[:, F_MEM] > cat.cap):
                notes.append(f"{cat.model.tables[t].name}: row-wise over ranks without room "
                             "(over capacity)")
            continue
        if k == 1:
            delta = np.broadcast_to(cat.tw(t), (n, cat.cost.width))
        else:
            base, part = cat.cw(t, k)
            held = counts.setdefault(t, np.zeros(n, dtype=int)) > 0
            delta = part[None, :] + (~held)[:, None] * base[None, :]
        d = _best_rank(cat, t, F, delta, short, work, notes)
        F = F.copy()
        F[d] += delta[d]
        if k == 1:
            choices[t] = ("tw", d)
        else:
            counts[t][d] += 1
    for t, c in counts.items():
        choices[t] = cat.normalise(("cw", parts_of[t], tuple(int(x) for x in c)))
    return choices, notes


def _forced_splits(cat: Catalog, parts, choices: list, notes: list[str]) -> dict[int, int]:
    """Tables that fit no single device: the fewest column parts that fit (table -> parts),
    else row-wise (set in ``choices``); each noted."""
    capmax = float(cat.cap.max())
    forced_k: dict[int, int] = {}
    for t in range(cat.model.num_tables):
        if cat.tw(t)[F_MEM] <= capmax:
            continue
        ks = [k for k in cat.cw_parts(t, parts)
              if cat.cw(t, k)[0][F_MEM] + cat.cw(t, k)[1][F_MEM] <= capmax]
        if ks:
            forced_k[t] = ks[0]
            notes.append(f"{cat.model.tables[t].name}: {ks[0]} column parts (fits no single "
                         "device)")
        elif cat.can(t, ShardingType.ROW_WISE):
            choices[t] = ("rw",)
            notes.append(f"{cat.model.tables[t].name}: row-wise (fits no single device)")
    return forced_k


def _sized_units(cat: Catalog, F: np.ndarray, free: list[int], forced_k: dict[int, int], *,
                 split: bool, parts, by_phase: bool, work: Work
                 ) -> tuple[list[tuple[float, int, int]], dict[int, int], np.ndarray]:
    """The units to place, costliest first: ``(cost, table, parts)`` per unit (``parts``
    units of a column-split table; one of a table placed whole, row-wise or on a host), the
    parts per table, and ``F`` with the row-wise tables' lookup calls marked. A table heavier
    than a rank's fair share (every phase's with ``by_phase``, the total's otherwise) is split
    by :func:`_heavy_split` when ``split``."""
    n, cm = cat.n, cat.cost
    empty = _phase_max(cm, F)
    one = np.zeros((cat.model.num_tables, n, cm.width))
    for t in range(cat.model.num_tables):
        one[t] = F
        one[t, 0] += cat.tw(t)
    standalone = _phase_max(cm, one) - empty            # (tables, phases)
    work.spend(cat.model.num_tables * n)
    target = standalone[free].sum(axis=0) / n if free else np.zeros(len(BREAKDOWN_KEYS))
    shared = np.zeros(len(BREAKDOWN_KEYS))     # per phase, what every rank carries (row-wise)
    units: list[tuple[float, int, int]] = []
    parts_of: dict[int, int] = {}
    # costliest first: a table spread over every rank raises the load beside every other one
    for t in sorted(free, key=lambda t: (-float(standalone[t].sum()), t)):
        k, unit = forced_k.get(t, 1), float(standalone[t].sum())
        own = standalone[t] + shared
        heavy = np.any(own > target * (1 + 1e-9)) if by_phase else own.sum() > target.sum() > 0
        if split and k == 1 and heavy:
            k, unit, c, units_n = _heavy_split(cat, t, F, empty, standalone[t], target, shared,
                                               parts, by_phase)
            options = 2 + len(cat.cw_parts(t, parts))
            work.spend(n * options, calls=options)
            target = target + (units_n * c - standalone[t]) / n
            if k == RW_UNIT:
                shared = shared + c
                # every rank now makes a row-wise call: the next spread's price excludes it
                F = F + _call_mark(cat, ShardingType.ROW_WISE, t)
                empty = _phase_max(cm, F)
        parts_of[t] = k
        units.extend([(unit, t, k)] * max(k, 1))
    units.sort(key=lambda u: (-u[0], u[1]))
    return units, parts_of, F


def _best_rank(cat: Catalog, t: int, F: np.ndarray, delta: np.ndarray, short: int, work: Work,
               notes: list[str]) -> int:
    """The rank that takes one unit of table ``t`` (``delta``: the features it adds per
    rank): of the ranks with room (the ``short`` least loaded of them), the one whose plan
    has the lowest slowest rank, then the smallest spread; the roomiest rank, noted, when
    none has room."""
    cands = np.flatnonzero(F[:, F_MEM] + delta[:, F_MEM] <= cat.cap)
    if cands.size == 0:
        d = int(np.argmax(cat.cap - F[:, F_MEM]))
        notes.append(f"{cat.model.tables[t].name}: no rank has room; put on rank {d} "
                     "(over capacity)")
        return d
    cm = cat.cost
    if cands.size > short:
        work.spend(cat.n)
        now = cm.rank_costs(F)[cands]
        cands = np.sort(cands[np.lexsort((cands, now))[:short]])
    work.spend(cands.size * cat.n)
    Fc = np.repeat(F[None], cands.size, axis=0)
    Fc[np.arange(cands.size), cands] += delta[cands]
    worst, spread = step_scores(cm, Fc)
    return int(cands[np.lexsort((cands, spread, worst))[0]])


def _table_wise_call(cat: Catalog) -> np.ndarray:
    """Features (n, width) that mark every rank as already making a table-wise lookup call
    (the precision most tables have). Greedy prices and places with them: every rank will
    make one call anyway, so a table's cost excludes it and an empty rank is not dearer
    than one holding tables; a row-wise spread or a column part beside table-wise shards
    still pays its own call. The plan's costs are computed without them."""
    return _call_mark(cat, ShardingType.TABLE_WISE)


def _call_mark(cat: Catalog, st: ShardingType, of: int | None = None) -> np.ndarray:
    """Features (n, width) marking every rank as making the lookup call of type ``st`` for
    the precision of table ``of`` (None: the precision most tables have)."""
    cm = cat.cost
    precisions = [t.precision for t in cat.model.tables]
    precision = (max(sorted(set(precisions)), key=precisions.count) if of is None
                 else precisions[of])
    out = np.zeros((cat.n, cm.width))
    out[:, cm.group_col[st, precision]] = 1.0
    return out


#: a unit that is a whole table spread table-row-wise over one host's ranks
TWRW_UNIT = 0
#: a unit that is a whole table spread row-wise over every rank
RW_UNIT = -1


def _phase_max(cm, F: np.ndarray) -> np.ndarray:
    """Each phase's slowest rank, seconds: shape ``F.shape[:-2] + (phases,)`` (their sum is
    the step cost)."""
    comp = cm.components(F)
    return np.stack([comp[k].max(axis=-1) for k in BREAKDOWN_KEYS], axis=-1)


def _heavy_split(cat: Catalog, t: int, F: np.ndarray, empty: np.ndarray, whole: np.ndarray,
                 target: np.ndarray, shared: np.ndarray, parts, by_phase: bool
                 ) -> tuple[int, float, np.ndarray, int]:
    """How to cut a heavy table: ``(k, step cost of one unit, its cost per phase, units)``
    for ``k`` column parts (1: whole), :data:`RW_UNIT` for a spread row-wise over every rank,
    or :data:`TWRW_UNIT` for a spread table-row-wise over one host (multi-host topologies
    only). ``whole``: its standalone cost per phase; ``target``: per phase, the plan's
    per-rank average; ``shared``: per phase, what every rank already carries of the tables
    spread row-wise before it; ``empty``: the phase maxima before it.

    Each option is priced for what it is (a column part still serves every id, so it costs
    more than the table's cost over ``k``; a spread splits the ids over the host's ranks but
    adds its collectives), and the one with the lowest bound on the step cost wins: no rank
    below its largest unit nor below the average work, which a split raises; ties go to fewer
    units. Two rules: the *total* one (a table is heavy when its cost exceeds the per-rank
    average; bound ``max(Σ (unit + shared), Σ (target + (units · unit − whole) / ranks))``)
    and the *phase* one (heavy in any phase; the bound taken phase by phase and summed). The
    row-wise option and ``shared`` took greedy's step cost on MLPerf DCNv2 over 8 A100s from
    5.47 to 4.19 ms (local search's from 4.31 to 4.19). The phase
    rule sees a table that swamps one phase (its ids all-to-all) but splits tables whose
    phase the other tables' packing would absorb anyway; greedy runs both and keeps the lower
    (on bench_vs_torchrec's tasks, 64 GPUs: step costs 7.4% lower than by the total rule
    alone; 8 GPUs: the same)."""
    n = cat.n

    def bound(c: np.ndarray, units: int) -> float:
        avg = target + (units * c - whole) / n
        if by_phase:
            return float(np.maximum(c + shared, avg).sum())
        return max(float((c + shared).sum()), float(avg.sum()))

    options = [(bound(whole, 1), 1, 1, whole)]
    one = np.zeros_like(F)
    for q in cat.cw_parts(t, parts):
        base, part = cat.cw(t, q)
        one[:] = 0.0
        one[0] = base + part
        c = _phase_max(cat.cost, F + one) - empty
        options.append((bound(c, q), q, q, c))
    if len(cat.cost.hosts) > 1 and cat.can(t, ShardingType.TABLE_ROW_WISE):
        g = len(cat.cost.hosts[0])
        c = _phase_max(cat.cost, F + cat.uniform(t, "twrw", 0)) - empty
        options.append((bound(c, g), g, TWRW_UNIT, c))
    if cat.can(t, ShardingType.ROW_WISE):
        c = _phase_max(cat.cost, F + cat.uniform(t, "rw")) - empty
        options.append((bound(c, n), n, RW_UNIT, c))
    _, units, k, unit = min(options, key=lambda o: (o[0], o[1]))
    return k, float(unit.sum()), unit, units


def _place_on_host(cat: Catalog, t: int, F: np.ndarray) -> tuple[np.ndarray, tuple]:
    """``F`` with table ``t`` table-row-wise on the host that keeps the step cost lowest (then
    that host's slowest rank, then its index) among hosts with room; ``(host, note)``. Every
    host is scored in one batch."""
    hosts = [list(r) for r in cat.cost.hosts]
    Fh = F[None] + np.stack([cat.uniform(t, "twrw", h) for h in range(len(hosts))])
    costs = cat.cost.rank_costs(Fh)
    steps = np.atleast_1d(cat.cost.step_cost(Fh))
    keys = [(not bool(np.all(Fh[h][r, F_MEM] <= cat.cap[r])), float(steps[h]),
             float(costs[h][r].max()), h) for h, r in enumerate(hosts)]
    key = min(keys)
    h = key[3]
    note = "" if not key[0] else (f"{cat.model.tables[t].name}: no host has room; table-row-"
                                  f"wise on host {h} (over capacity)")
    return Fh[h], (h, note)


class GreedyPlanner:
    """LPT on the analytic step cost with column splitting (see the module docstring)."""

    name = "greedy"

    def __init__(self, *, split: bool = True, parts=CW_PARTS) -> None:
        self.split = split
        self.parts = tuple(parts)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                                 ShardingType.ROW_WISE))
        no_tw = [problem.model.tables[i].name for i in range(problem.num_tables)
                 if not problem.allowed(i, ShardingType.TABLE_WISE)]
        if no_tw:
            raise SpecError(f"the greedy planner places tables table-wise (column-split when "
                            f"that helps), but {len(no_tw)} table(s) may not be table-wise "
                            f"({', '.join(no_tw[:4])}{', …' if len(no_tw) > 4 else ''})",
                            field="--sharding-types",
                            fix="allow table_wise, or use --planner local_search or mip, "
                                "which choose among any allowed types")
        cat = catalog(problem)
        choices, notes = greedy_choices(cat, split=self.split, parts=self.parts)
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, cat.layouts(choices), self.name, stats)
