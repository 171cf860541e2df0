"""MIP planner: minimise the maximum per-rank cost under memory caps (PuLP; CBC bundled).

The model (variables, constraints, why its objective equals the analytic maximum per-rank
cost of its plan) is in :mod:`.mip_model`.

Solving: CBC with ``threads=1``, a seed, a warm start from the ``local_search`` plan (so the
result is never worse than it), ``timeMode elapsed`` and a time left after the model is built;
a watchdog stops CBC at 107% of the limit and falls back to the warm start, so the whole call
stays within 110% of ``time_limit_s``. HiGHS is used instead with ``solver="highs"`` when
``highspy`` is installed. A run that stops at its time limit returns its incumbent and the gap
to CBC's best bound; such a run depends on machine speed, one that proves optimality does not.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pulp

from simulator.errors import SpecError

from planner.lp import cbc
from planner.model.tables.cost import F_MEM
from planner.model.tables.feasible import check_feasible
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.common import CW_PARTS, Catalog, catalog
from planner.sharding.greedy import greedy_choices
from planner.sharding.local_search import improve_choices
from planner.sharding.mip_model import _CW, _DP, _RW, _TW, _TWRW, EPS, US, MipModel

__all__ = ["MipPlanner", "MipResult", "solve_mip"]


@dataclass
class MipResult:
    """What one MIP solve produced (``choices`` None when it found nothing)."""

    choices: list | None
    status: str
    objective_s: float | None
    bound_s: float | None
    gap: float | None
    solver: str
    build_s: float
    solve_s: float
    note: str = ""


_NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"


def _parse_cbc_log(text: str) -> dict:
    info: dict = {}
    m = re.search(r"Result - (.+)", text)
    info["result"] = m.group(1).strip() if m else ""
    m = re.search(r"Objective value:\s+" + _NUM, text)
    if m:
        info["objective"] = float(m.group(1))
    m = re.search(r"Lower bound:\s+" + _NUM, text)
    if m:
        info["bound"] = float(m.group(1))
    possible = re.findall(r"best possible " + _NUM, text)
    if possible:
        info["best_possible"] = float(possible[-1])
    return info


def _solve_cbc(model: MipModel, *, seconds: float, hard_deadline: float, seed: int,
               warm: bool) -> tuple[list | None, dict]:
    solver = cbc()
    path = solver.path
    if not path or not solver.available():
        raise SpecError("no CBC solver found (PuLP's bundled CBC or cbc on PATH)",
                        source="--planner mip", fix="pip install 'pulp[cbc]' or install coinor-cbc")
    lp = model.lp
    with tempfile.TemporaryDirectory(prefix="clusterplan-mip-") as tmp:
        mps = os.path.join(tmp, "model.mps")
        sol = os.path.join(tmp, "model.sol")
        mst = os.path.join(tmp, "start.mst")
        vs, vnames, cnames, _ = lp.writeMPS(mps, rename=1)
        args = [path, mps]
        if warm:
            solver.writesol(mst, lp, vs, vnames, cnames)
            args += ["-mips", mst]
        args += ["-sec", f"{max(seconds, 0.05):.3f}", "-timeMode", "elapsed", "-threads", "1",
                 "-randomCbcSeed", str(int(seed) % 2_000_000_000 + 1), "-ratio", "1e-7",
                 "-allow", "1e-9", "-solve", "-solution", sol]
        logf = os.path.join(tmp, "cbc.log")
        with open(logf, "w") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            killed = False
            try:
                proc.wait(timeout=max(0.05, hard_deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                killed = True
        with open(logf) as f:
            info = _parse_cbc_log(f.read())
        info["killed"] = killed
        if killed or not os.path.exists(sol):
            return None, info
        status, values, *_ = solver.readsol_MPS(sol, lp, vs, vnames, cnames)
        lp.assignVarsVals(values)
        with open(sol) as f:
            info["sol_header"] = f.readline().strip()
        if "infeasible" in info["sol_header"].lower() or "no feasible" in info["result"].lower():
            return None, info
        return model.choices(), info


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


def solve_mip(cat: Catalog, *, time_limit_s: float, seed: int = 0, start=None,
              parts=CW_PARTS, types=None, solver: str = "cbc", t_start: float | None = None
              ) -> MipResult:
    """Build and solve the MIP of ``cat``'s problem within ``time_limit_s`` counted from
    ``t_start`` (default: now); ``start`` (choices) warm-starts it."""
    t0 = time.perf_counter() if t_start is None else t_start
    model = MipModel(cat, parts=parts, types=types)
    if start is not None:
        model.set_start(start)
    built = time.perf_counter()
    cbc_seconds = 0.93 * time_limit_s - (built - t0) - 0.1
    if cbc_seconds < 0.05:
        return MipResult(None, "no_time", None, None, None, solver, built - t0, 0.0,
                         note=f"model build took {built - t0:.2f} s of a {time_limit_s:.2f} s "
                              "limit; no time left to solve")
    if solver == "highs":
        choices, info = _solve_highs(model, seconds=cbc_seconds, seed=seed)
    else:
        choices, info = _solve_cbc(model, seconds=cbc_seconds,
                                   hard_deadline=t0 + 1.07 * time_limit_s, seed=seed,
                                   warm=start is not None)
    solved = time.perf_counter()
    result = info.get("result", "")
    optimal = "optimal" in result.lower() and not info.get("killed")
    scale = 1.0 / (US * (1.0 + EPS * cat.n))
    bound = info.get("bound", info.get("best_possible"))
    bound_s = bound * scale if bound is not None else None
    objective_s = None
    if choices is not None:
        objective_s = float(cat.cost.rank_costs(cat.features(choices)).max())
        if optimal:
            bound_s = objective_s        # proved: CBC's gap tolerance is 1e-7
    status = "optimal" if optimal else ("killed" if info.get("killed") else "time_limit")
    gap = None
    if objective_s is not None and bound_s is not None and objective_s > 0:
        gap = max(0.0, (objective_s - bound_s) / objective_s)
        if optimal:
            gap = 0.0 if gap < 1e-6 else gap
    return MipResult(choices, status, objective_s, bound_s, gap, solver, built - t0,
                     solved - built, note=result)


class MipPlanner:
    """Min-max MIP over TW/CW/RW/DP/TWRW options (see the module docstring).

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
        notes: list[str] = []
        start = None
        gnotes: list[str] = []
        if self.warm_start:
            greedy, gnotes = greedy_choices(cat, parts=self.parts)
            if all(c is not None for c in greedy) and self._representable(cat, greedy, types,
                                                                          self.parts):
                start, info = improve_choices(cat, greedy, seed=seed,
                                              time_limit_s=max(0.0, 0.2 * limit
                                                               - (time.perf_counter() - t0)))
                if not self._fits(cat, start) or not self._representable(cat, start, types,
                                                                          self.parts):
                    start = None
        warm_s = time.perf_counter() - t0
        parts = self._parts_for_budget(cat, types, limit - warm_s, notes)
        warm = start if start is not None and self._representable(cat, start, types,
                                                                   parts) else None
        res = solve_mip(cat, time_limit_s=limit, seed=seed, start=warm, parts=parts,
                        types=types, solver=self.solver, t_start=t0)
        choices = res.choices
        status = res.status
        if status == "optimal" and parts != self.parts:
            status = "optimal_reduced"       # proved over the options that fitted the budget
        notes = list(gnotes if self.warm_start else ()) + notes
        worse = choices is not None and start is not None and \
            self._max(cat, start) < self._max(cat, choices)
        if choices is None or worse:
            if start is None:
                raise SpecError(f"the MIP found no plan within {limit:g} s "
                                f"({res.note or res.status})", source="--planner mip",
                                fix="raise --time-limit or use --planner greedy")
            notes.append(f"MIP returned no better plan ({res.status}); kept the warm start")
            choices = start
            status = "fallback"
        if res.note:
            notes.append(f"{res.solver}: {res.note}")
        objective = self._max(cat, choices)
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

    #: seconds PuLP takes per model term (measured: ~13 µs on a 2-core CI machine)
    BUILD_S_PER_TERM = 15e-6

    def _parts_for_budget(self, cat: Catalog, types, remaining_s: float, notes: list) -> tuple:
        """Drop the finest column splits while the model would take over 40% of the time left
        to build (model build cannot be interrupted, and the limit covers it)."""
        n = cat.n
        parts = list(self.parts)
        while True:
            terms = 0
            for t in range(cat.model.num_tables):
                terms += 9 * n                                      # table-wise
                terms += sum(2 * 9 * n + 3 * n for _ in cat.cw_parts(t, tuple(parts)))
                terms += 9 * n * sum(cat.can(t, s) for s in (_RW, _DP))
                if cat.can(t, _TWRW):
                    terms += 9 * n * len(cat.problem.hosts)
            if terms * self.BUILD_S_PER_TERM <= 0.4 * remaining_s or not parts:
                break
            notes.append(f"{parts[-1]} column parts left out: the model would not build in time")
            parts.pop()
        return tuple(parts)

    @staticmethod
    def _max(cat: Catalog, choices) -> float:
        return float(cat.cost.rank_costs(cat.features(choices)).max())

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
