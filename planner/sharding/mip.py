"""MIP planner: minimise the step cost under memory caps (PuLP; CBC bundled).

The model (variables, constraints, why its objective equals the analytic step cost of its
plan: each phase's slowest rank, summed) is in :mod:`.mip_model`.

Solving, within ``time_limit_s`` for the whole call (model build included):

- warm start: greedy with a *work* budget (20% of the limit at a fixed rate: a short limit
  narrows its shortlist of ranks and drops its second rule), then local search with one
  (rank-evaluations, a fixed rate times 10% of the limit) and a safety stop at 20% of it;
- the model offers the options whose build fits 40% of the time left (finest column splits
  dropped first, then table-row-wise, row-wise and data-parallel); a build that overruns its
  deadline is abandoned;
- CBC (serial, a seed, the warm start) gets a *node* budget from the time left and the
  model's size, and a safety stop before the limit; a watchdog kills it (and a dead parent
  kills it too) and its temporary folder is removed.

Same inputs, same plan: a plan comes from a stop that depends only on the inputs (the local
search's work budget, CBC proving optimality or reaching its node budget). When a safety stop
fires first (a much slower machine) CBC's incumbent is set aside for the warm start and the
notes say so. HiGHS is used instead with ``solver="highs"`` when ``highspy`` is installed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pulp

from simulator.errors import SpecError

from planner.model.tables.features import F_MEM
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.task import ShardingTask, prepare
from planner.progress import stages
from planner.sharding.common import CW_PARTS, Catalog, catalog
from planner.sharding.greedy import greedy_choices
from planner.sharding.greedy_work import Work
from planner.sharding.local_search import improve_choices
from planner.sharding.mip_cbc import run_cbc
from planner.sharding.mip_model import _CW, _DP, _RW, _TW, _TWRW, EPS, US, BuildTimeout, MipModel

__all__ = ["MipPlanner", "MipResult", "solve_mip"]

#: local-search rank-evaluations per second (measured on the 2-core CI machine: 1.0-1.5 M)
WARM_RANK_EVALS_PER_S = 1.0e6
#: greedy's work units per second (:class:`~planner.sharding.greedy_work.Work`; measured on the
#: 2-core CI machine: 3-6 M at 16-256 ranks) and the share of the limit it is planned for
GREEDY_WORK_PER_S, GREEDY_SHARE = 4.0e6, 0.2
#: CBC with a warm start, measured there from 1.7 k to 116 k nonzeros: the root node (presolve,
#: cuts) takes 0.5-1.2 s up to 25 k, then grows ~ quadratically (9 s at 105 k, 12 s at 116 k);
#: a node takes ~2.5 µs per nonzero (2-51 ms up to 25 k), growing faster past 50 k (0.46 s at
#: 105 k, 0.65 s at 116 k). :func:`root_s` and :func:`node_s` bound those figures.
CBC_ROOT_MIN_S, CBC_ROOT_NZ = 1.3, 25e3
CBC_NODE_S_PER_NZ, CBC_NODE_NZ = 2.5e-6, 50e3
#: seconds PuLP takes per model term (measured there: 7-12 µs)
BUILD_S_PER_TERM = 15e-6
#: the deterministic budgets plan for this share of the time they get; the rest is margin
#: for a slower or busier machine before the safety stops fire
BUDGET_SHARE = 0.5


@dataclass
class MipResult:
    """What one MIP solve produced (``choices`` None when it found nothing).

    ``status``, decided by the inputs alone: ``optimal``, ``node_limit`` (its node budget
    spent), ``no_time`` (not run: the root node would not fit its plan); decided by the clock
    (a safety stop, so by machine speed): ``time_limit``, ``killed``, ``build_timeout``.
    """

    choices: list | None
    status: str
    objective_s: float | None
    bound_s: float | None
    gap: float | None
    solver: str
    build_s: float
    solve_s: float
    note: str = ""

    @property
    def deterministic(self) -> bool:
        return self.status in ("optimal", "node_limit", "no_time")


def _status(info: dict) -> str:
    result = info.get("result", "").lower()
    if info.get("not_run"):
        return "no_time"
    if info.get("killed"):
        return "killed"
    if "optimal" in result:
        return "optimal"
    if "node limit" in result:
        return "node_limit"
    return "time_limit"


def _solve_highs(model: MipModel, *, seconds: float, seed: int) -> tuple[list | None, dict]:
    solver = pulp.HiGHS(msg=False, timeLimit=max(seconds, 0.05), threads=1, gapRel=1e-7,
                        random_seed=int(seed), warmStart=True)
    model.lp.solve(solver)
    info: dict = {"result": pulp.LpStatus.get(model.lp.status, "")}
    try:  # pragma: no cover - needs highspy
        h = model.lp.solverModel
        info["bound"] = float(h.getInfo().mip_dual_bound)
        info["objective"] = float(h.getInfo().objective_function_value)
        if h.getModelStatus() == h.getModelStatus().kOptimal:
            info["result"] = "Optimal solution found"
    except Exception:  # noqa: BLE001
        pass
    return model.choices(), info


def root_s(nonzeros: float) -> float:
    """Planned seconds of CBC's root node on a model of ``nonzeros``."""
    return max(CBC_ROOT_MIN_S, 0.5 * (nonzeros / CBC_ROOT_NZ) ** 2)


def node_s(nonzeros: float) -> float:
    """Planned seconds of one CBC node on a model of ``nonzeros``."""
    return CBC_NODE_S_PER_NZ * nonzeros * max(1.0, nonzeros / CBC_NODE_NZ)


def node_budget(nonzeros: int, planned_s: float) -> int | None:
    """CBC nodes that fit ``BUDGET_SHARE`` of ``planned_s`` after the root node; None when
    the root alone would not (a function of the inputs: the same budget on every run)."""
    spare = planned_s - root_s(nonzeros)
    return int(BUDGET_SHARE * spare / node_s(max(nonzeros, 1))) if spare > 0 else None


def cbc_plan_s(limit_s: float, build_s: float) -> float:
    """Seconds CBC plans for: 90% of the limit less the warm start's safety stop (20%) and the
    model's planned build."""
    return 0.7 * limit_s - build_s


def _solve_cbc(model: MipModel, *, seconds: float, planned_s: float, hard_deadline: float,
               seed: int, warm: bool) -> tuple[list | None, dict]:
    """CBC with a node budget for ``planned_s`` (a share of the limit) and a safety stop
    after ``seconds`` (what is really left)."""
    nodes = node_budget(model.nonzeros, planned_s)
    if nodes is None:
        return None, {"result": "not run: its root node would not finish in the time planned "
                                f"({model.nonzeros:,} nonzeros)", "not_run": True}
    values, info = run_cbc(model.lp, start=warm, seconds=seconds, max_nodes=nodes,
                           hard_deadline=hard_deadline, seed=seed)
    info["node_budget"] = nodes
    if values is None:
        return None, info
    model.lp.assignVarsVals(values)
    return model.choices(), info


def solve_mip(cat: Catalog, *, time_limit_s: float, seed: int = 0, start=None,
              parts=CW_PARTS, types=None, solver: str = "cbc", t_start: float | None = None
              ) -> MipResult:
    """Build and solve the MIP of ``cat``'s problem within ``time_limit_s`` counted from
    ``t_start`` (default: now); ``start`` (choices) warm-starts it."""
    t0 = time.perf_counter() if t_start is None else t_start
    try:
        model = MipModel(cat, parts=parts, types=types, deadline=t0 + 0.6 * time_limit_s)
    except BuildTimeout:
        built = time.perf_counter()
        return MipResult(None, "build_timeout", None, None, None, solver, built - t0, 0.0,
                         note="stopped by the clock while the model was built")
    if start is not None:
        model.set_start(start)
    built = time.perf_counter()
    # the safety stop leaves time to read the solution back (~1 µs per nonzero)
    seconds = 0.93 * time_limit_s - (built - t0) - 0.05 - 2e-6 * model.nonzeros
    if seconds < 0.05:
        return MipResult(None, "time_limit", None, None, None, solver, built - t0, 0.0,
                         note="stopped by the clock: no time left to solve after the build")
    if solver == "highs":
        choices, info = _solve_highs(model, seconds=seconds, seed=seed)
    else:
        planned = cbc_plan_s(time_limit_s, BUILD_S_PER_TERM * model.nonzeros)
        choices, info = _solve_cbc(model, seconds=seconds, planned_s=planned,
                                   seed=seed, warm=start is not None,
                                   hard_deadline=t0 + 0.97 * time_limit_s)
    return _result(cat, choices, info, solver, built - t0, time.perf_counter() - built)


def _result(cat: Catalog, choices, info: dict, solver: str, build_s: float,
            solve_s: float) -> MipResult:
    status = _status(info)
    scale = 1.0 / (US * (1.0 + EPS * cat.n))
    bound = info.get("bound", info.get("best_possible"))
    bound_s = bound * scale if bound is not None else None
    objective_s = None
    if choices is not None:
        objective_s = float(cat.cost.step_cost(cat.features(choices)))
        if status == "optimal":
            bound_s = objective_s        # proved: CBC's gap tolerance is 1e-7
    gap = None
    if objective_s is not None and bound_s is not None and objective_s > 0:
        gap = max(0.0, (objective_s - bound_s) / objective_s)
        if status == "optimal":
            gap = 0.0 if gap < 1e-6 else gap
    note = info.get("result", "") or status
    if status in ("optimal", "node_limit", "no_time"):
        if "node_budget" in info:
            note += f" ({info.get('nodes', 0)} nodes of a budget of {info['node_budget']})"
    else:      # where a safety stop caught it depends on machine speed: keep it out of the plan
        bound_s = gap = None
        note = "stopped by the clock" + (f" before its node budget ({info['node_budget']})"
                                         if "node_budget" in info else "")
    return MipResult(choices, status, objective_s, bound_s, gap, solver, build_s, solve_s,
                     note=note)


class MipPlanner:
    """Step-cost MIP over TW/CW/RW/DP/TWRW options (see the module docstring).

    Parameters
    ----------
    default_time_limit_s : float
        Limit when ``plan`` gets none, seconds (whole call, model build included).
    parts : tuple of int
        Column-part counts offered.
    types : tuple of ShardingType or None
        Option types offered (None: all; each table's allowed types still apply).
    solver : str
        ``cbc`` (bundled with PuLP) or ``highs`` (needs ``highspy``).
    warm_start : bool
        Start from the ``local_search`` plan (greedy + local search within 20% of the limit).
    """

    name = "mip"

    def __init__(self, *, default_time_limit_s: float = 10.0, parts=CW_PARTS, types=None,
                 solver: str = "cbc", warm_start: bool = True) -> None:
        if solver not in ("cbc", "highs"):
            raise ValueError("solver must be 'cbc' or 'highs'")
        if solver == "highs" and not pulp.HiGHS().available():
            raise SpecError("HiGHS is not installed", source="--mip-solver",
                            fix="pip install highspy, or use --mip-solver cbc")
        self.default_time_limit_s = default_time_limit_s
        self.parts = tuple(parts)
        self.types = tuple(types) if types is not None else None
        self.solver = solver
        self.warm_start = warm_start

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        limit = self.default_time_limit_s if time_limit_s is None else float(time_limit_s)
        problem = prepare(task, devices)
        types = self.types or (_TW, _CW, _RW, _DP, _TWRW)
        check_feasible(problem, types)
        cat = catalog(problem)
        with stages("plan mip", 2, quiet=limit < 2.0) as stage:     # short runs stay silent
            stage("warm start (greedy, local search)")
            start, notes = self._warm_start(cat, types, limit, seed, t0)
            warm_s = time.perf_counter() - t0
            parts, types = self._options_for_budget(cat, types, limit, notes)
            warm = start if start is not None and self._representable(cat, start, types,
                                                                       parts) else None
            stage(f"model build and CBC (within {limit:g} s)" if types else "no model fits")
            if types:
                res = solve_mip(cat, time_limit_s=limit, seed=seed, start=warm, parts=parts,
                                types=types, solver=self.solver, t_start=t0)
            else:
                res = MipResult(None, "no_time", None, None, None, self.solver, 0.0, 0.0,
                                note="no model builds within a quarter of the limit")
        choices, status = self._pick(cat, res, start, parts, limit, notes)
        if res.note:
            notes.append(f"{res.solver}: {res.note}")
        objective = self._cost(cat, choices)
        gap = res.gap
        if res.bound_s is not None and objective > 0:
            gap = max(0.0, (objective - res.bound_s) / objective)
            if status == "optimal" and gap < 1e-6:
                gap = 0.0
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status=status, gap=gap,
                             objective_s=objective, bound_s=res.bound_s, seed=seed,
                             time_limit_s=limit, solver=res.solver, notes=tuple(notes),
                             timings_s=(("warm_start_s", warm_s), ("build_s", res.build_s),
                                        ("solve_s", res.solve_s)))
        return make_plan(problem, cat.layouts(choices), self.name, stats)

    def _warm_start(self, cat: Catalog, types, limit: float, seed: int,
                    t0: float) -> tuple[list | None, list[str]]:
        """Greedy improved by local search with a work budget planned for 10% of the limit
        (safety stop at 20%); None when off, or when it is not a plan the MIP can take."""
        if not self.warm_start:
            return None, []
        greedy, notes = greedy_choices(cat, parts=self.parts, work=Work(
            BUDGET_SHARE * GREEDY_WORK_PER_S * GREEDY_SHARE * limit))
        if not all(c is not None for c in greedy) or \
                not self._representable(cat, greedy, types, self.parts):
            return None, list(notes)
        safety = min(0.2 * limit, 0.5 * limit - (time.perf_counter() - t0))
        start, info = improve_choices(
            cat, greedy, seed=seed, work_budget=BUDGET_SHARE * WARM_RANK_EVALS_PER_S * 0.2 * limit,
            time_limit_s=max(0.0, safety))
        notes = list(notes)
        if info["timed_out"]:
            notes.append("the warm start's local search hit its safety stop before its work "
                         "budget: the plan may depend on machine speed")
        if not self._fits(cat, start) or not self._representable(cat, start, types, self.parts):
            return None, notes
        return start, notes

    def _pick(self, cat: Catalog, res: MipResult, start, parts, limit: float,
              notes: list) -> tuple[list, str]:
        """The MIP's plan when it is deterministic and no worse than the warm start, else the
        warm start (status ``fallback``)."""
        choices, status = res.choices, res.status
        if status == "optimal" and parts != self.parts:
            status = "optimal_reduced"       # proved over the options that fitted the budget
        if start is None:
            if choices is None:
                raise SpecError(f"the MIP found no plan within {limit:g} s "
                                f"({res.note or res.status})", source="--planner mip",
                                fix="raise --time-limit or use --planner greedy")
            if not res.deterministic:
                notes.append("CBC was stopped by the clock: the plan may depend on machine "
                             "speed")
            return choices, status
        if choices is not None and res.deterministic and \
                self._cost(cat, choices) <= self._cost(cat, start):
            return choices, status
        why = "was stopped by the clock (what it had found depends on machine speed)" \
            if not res.deterministic else f"returned no better plan ({res.status})"
        notes.append(f"MIP {why}; kept the warm start")
        return start, "fallback"

    def _options_for_budget(self, cat: Catalog, types, limit_s: float,
                            notes: list) -> tuple[tuple, tuple]:
        """Drop the finest column splits, then table-row-wise, row-wise and data-parallel,
        while the model would take over 25% of the limit to build, or its build and CBC's root
        node would leave CBC under a quarter of its time for nodes (functions of the inputs
        alone, so the same model every run); no types left when not even table-wise fits."""
        parts, types = list(self.parts), list(types)

        def too_big() -> bool:
            terms = self._terms(cat, types, parts)
            build = terms * BUILD_S_PER_TERM
            return build > 0.25 * limit_s or root_s(terms) > 0.75 * cbc_plan_s(limit_s, build)
        while types and too_big():
            if _CW in types and parts:
                notes.append(f"{parts.pop()} column parts left out: the model would not "
                             "build and solve in time")
                continue
            drop = next((t for t in (_CW, _TWRW, _RW, _DP, _TW) if t in types))
            types.remove(drop)
            notes.append(f"{drop.value} left out of the MIP: the model would not build and "
                         "solve in time")
        return tuple(parts), tuple(types)

    @staticmethod
    def _terms(cat: Catalog, types, parts) -> int:
        """Nonzeros the model of these options would have (its build time is ∝ them)."""
        n, hosts, terms = cat.n, len(cat.problem.hosts), 0
        for t in range(cat.model.num_tables):
            if _TW in types:
                terms += 9 * n
            if _CW in types:
                terms += (2 * 9 * n + 3 * n) * len(cat.cw_parts(t, tuple(parts)))
            terms += 9 * n * sum(s in types and cat.can(t, s) for s in (_RW, _DP))
            if _TWRW in types and cat.can(t, _TWRW):
                terms += 9 * n * hosts
        return terms

    @staticmethod
    def _cost(cat: Catalog, choices) -> float:
        return float(cat.cost.step_cost(cat.features(choices)))

    @staticmethod
    def _fits(cat: Catalog, choices) -> bool:
        return bool((cat.features(choices)[:, F_MEM] <= cat.cap + 0.5).all())

    @staticmethod
    def _representable(cat: Catalog, choices, types, parts) -> bool:
        kinds = {"tw": _TW, "cw": _CW, "rw": _RW, "dp": _DP, "twrw": _TWRW}
        for t, c in enumerate(choices):
            if kinds[c[0]] not in types or not cat.problem.allowed(t, kinds[c[0]]):
                return False
            if c[0] == "cw" and c[1] not in parts:
                return False
        return True
