"""MIP planner: minimise the maximum per-rank cost under memory caps (PuLP; CBC bundled).

Variables per table ``t`` (only the options its allowed types permit):

- ``x[t,d]`` ∈ {0,1}: table-wise on rank d;
- for ``k`` ∈ {2, 4, 8} equal column parts (width a multiple of 4): ``u[t,k]`` ∈ {0,1} (this
  split is used), ``m[t,k,d]`` ∈ {0..k} parts on rank d, ``y[t,k,d]`` ∈ {0,1} rank d holds a
  part, with ``Σ_d m = k·u``, ``y ≤ m ≤ k·y`` and ``Σ_d y ≥ 2u`` (parts on one rank merge into
  one shard, so any widths that are multiples of dim/k; all on one rank is table-wise);
- ``v[t]`` row-wise, ``w[t]`` data-parallel, ``z[t,h]`` table-row-wise on host h ∈ {0,1};
- exactly one option per table.

Per-rank features are linear in these (column blocks cost ``base·y + part·m``), and so is every
term of :class:`~planner.sharding.cost.CostModel` except three kinds, which are exact in the
model too: the all-to-all maxima (one continuous variable per rank, link class and exchange,
bounded below by the send and the receive side), and the fixed latency of the row-wise,
table-row-wise and data-parallel collectives (an indicator per group that is 1 when any table
uses it). So the MIP's objective equals the analytic maximum per-rank cost of its plan. The
objective is ``max_r cost_r + 1e-6 · Σ_r cost_r`` (µs), the second term preferring less total
work among equally balanced plans; the bound reported is converted back to the maximum alone.

Solving: CBC with ``threads=1``, a seed, a warm start from the ``local_search`` plan (so the
result is never worse than it), ``timeMode elapsed`` and a time left after the model is built;
a watchdog stops CBC at 107% of the limit and falls back to the warm start, so the whole call
stays within 110% of ``time_limit_s``. HiGHS is used instead with ``solver="highs"`` when
``highspy`` is installed. A run that stops at its time limit returns its incumbent and the gap
to CBC's best bound; such a run depends on machine speed, one that proves optimality does not.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pulp

from ..cost import F_BWD, F_DP, F_FWD, F_HRS, F_IDS, F_MEM, F_OUT, F_RW
from ..memory import check_feasible
from ..plan import Plan, PlannerStats, make_plan
from ..shards import ShardingType
from ..task import ShardingTask, prepare
from .common import CW_PARTS, Catalog, catalog
from .local_search import improve_choices
from .greedy import greedy_choices

__all__ = ["MipPlanner", "MipResult", "solve_mip"]

_TW, _CW, _RW, _DP, _TWRW = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                             ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL,
                             ShardingType.TABLE_ROW_WISE)
US = 1e6          # the model works in microseconds
EPS = 1e-6        # weight of the total-cost tie-breaker


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


def _new(lp: pulp.LpProblem, name: str, low=None, up=None, cat: str = "Continuous"):
    """A variable of ``lp`` (PuLP ≥ 3.3 attaches it to the problem; older PuLP does not need to)."""
    if hasattr(lp, "add_variable"):
        return lp.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)


def _cbc() -> pulp.LpSolver:
    """PuLP's bundled CBC (or a ``cbc`` on PATH when the bundled one is gone, PuLP ≥ 4)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            solver = pulp.PULP_CBC_CMD(msg=False)
            if solver.available():
                return solver
        except Exception:  # noqa: BLE001
            pass
        return pulp.COIN_CMD(msg=False)


def _lin(pairs) -> pulp.LpAffineExpression:
    """A linear expression from ``(variable, coefficient)`` pairs, summing repeated variables."""
    acc: dict = {}
    for v, c in pairs:
        if c != 0.0:
            acc[v] = acc.get(v, 0.0) + float(c)
    return pulp.LpAffineExpression([(v, c) for v, c in acc.items() if c != 0.0])


class _Model:
    """The PuLP model of one problem and its variable ↔ choice mapping."""

    def __init__(self, cat: Catalog, parts=CW_PARTS, types=None) -> None:
        self.cat = cat
        cm = cat.cost
        n = cat.n
        T = cat.model.num_tables
        types = set(types or (_TW, _CW, _RW, _DP, _TWRW))
        hosts = cat.problem.hosts
        self.lp = lp = pulp.LpProblem("sharding", pulp.LpMinimize)
        self.x: dict[tuple[int, int], pulp.LpVariable] = {}
        self.u: dict[tuple[int, int], pulp.LpVariable] = {}
        self.m: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self.y: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self.v: dict[int, pulp.LpVariable] = {}
        self.w: dict[int, pulp.LpVariable] = {}
        self.z: dict[tuple[int, int], pulp.LpVariable] = {}
        # per-rank feature terms: feats[r][f] = list of (var, coef)
        feats = [[[] for _ in range(8)] for _ in range(n)]
        for t in range(T):
            one = []
            if _TW in types and cat.problem.allowed(t, _TW):
                f = cat.tw(t)
                for d in range(n):
                    var = self.x[t, d] = _new(lp, f"x_{t}_{d}", cat="Binary")
                    one.append(var)
                    for k in range(8):
                        feats[d][k].append((var, f[k]))
            if _CW in types:
                for k in cat.cw_parts(t, parts):
                    base, part = cat.cw(t, k)
                    uu = self.u[t, k] = _new(lp, f"u_{t}_{k}", cat="Binary")
                    one.append(uu)
                    ms, ys = [], []
                    for d in range(n):
                        mm = self.m[t, k, d] = _new(lp, f"m_{t}_{k}_{d}", 0, k,
                                                               cat="Integer")
                        yy = self.y[t, k, d] = _new(lp, f"y_{t}_{k}_{d}", cat="Binary")
                        ms.append(mm)
                        ys.append(yy)
                        lp += mm - k * yy <= 0
                        lp += yy - mm <= 0
                        for q in range(8):
                            feats[d][q].append((yy, base[q]))
                            feats[d][q].append((mm, part[q]))
                    lp += _lin([(mm, 1) for mm in ms] + [(uu, -k)]) == 0
                    lp += _lin([(yy, 1) for yy in ys] + [(uu, -2)]) >= 0
            for kind, store, st in (("rw", self.v, _RW), ("dp", self.w, _DP)):
                if st in types and cat.can(t, st):
                    var = store[t] = _new(lp, f"{kind}_{t}", cat="Binary")
                    one.append(var)
                    G = cat.uniform(t, kind)
                    for d in range(n):
                        for q in range(8):
                            feats[d][q].append((var, G[d, q]))
            if _TWRW in types and cat.can(t, _TWRW):
                for h in range(len(hosts)):
                    var = self.z[t, h] = _new(lp, f"twrw_{t}_{h}", cat="Binary")
                    one.append(var)
                    G = cat.uniform(t, "twrw", h)
                    for d in range(n):
                        for q in range(8):
                            feats[d][q].append((var, G[d, q]))
            if not one:
                from simulator.errors import SpecError
                have = ", ".join(sorted(x.value for x in cat.problem.allowed_types(t)))
                raise SpecError(f"table {cat.problem.model.tables[t].name!r} has no placement "
                                f"the MIP can use on {n} device(s) (allowed: {have or 'none'}; "
                                "table-row-wise needs more than one host)",
                                field="--sharding-types",
                                fix="allow another sharding type for it")
            lp += _lin([(o, 1) for o in one]) == 1
        # memory
        for d in range(n):
            lp += _lin(feats[d][F_MEM]) <= float(cat.cap[d])
        # communication
        comm = cm.comm
        b = cm.local_batch
        node_of = comm.node_of
        g = comm.node_size
        multi = n > g.min()
        a2a_terms: list[list[tuple]] = [[] for _ in range(n)]
        const = [0.0] * n
        launch = 3 * cm.launch_s * US
        if n > 1:
            for f_idx, mult, name in ((F_IDS, 1.0, "ids"), (F_OUT, 2.0, "out")):
                P = [_new(lp, f"P{name}_{d}") for d in range(n)]
                for d in range(n):
                    lp += _lin(feats[d][f_idx] + [(P[d], -1.0)]) == 0
                scale_i = b * US / comm.intra_Bps
                for r in range(n):
                    I = _new(lp, f"I{name}_{r}", 0)
                    same = [q for q in range(n) if node_of[q] == node_of[r] and q != r]
                    lp += _lin([(I, 1.0), (P[r], -scale_i * (g[r] - 1))]) >= 0
                    if same:
                        lp += _lin([(I, 1.0)] + [(P[q], -scale_i) for q in same]) >= 0
                    a2a_terms[r].append((I, mult))
                    const[r] += mult * comm.a2a_alpha_s * US
                    if multi:
                        scale_e = b * US / comm.inter_Bps
                        other = [q for q in range(n) if node_of[q] != node_of[r]]
                        E = _new(lp, f"E{name}_{r}", 0)
                        lp += _lin([(E, 1.0), (P[r], -scale_e * (n - g[r]))]) >= 0
                        lp += _lin([(E, 1.0)] + [(P[q], -scale_e) for q in other]) >= 0
                        a2a_terms[r].append((E, mult))
        # grouped collectives: indicator × alpha + bytes / bandwidth
        group_terms: list[list[tuple]] = [[] for _ in range(n)]

        def group(kind_pairs, members, store, label):
            if not store:
                return
            ind = _new(lp, f"g_{label}", cat="Binary")
            for var in store:
                lp.addConstraint(ind - var >= 0)
            alpha = sum(comm.fits.get(k, (0.0, math.inf))[0] for k in kind_pairs) * US
            inv_bw = sum(1.0 / comm.fits.get(k, (0.0, math.inf))[1] for k in kind_pairs) * US
            for r in members:
                group_terms[r].append((ind, alpha))
                yield r, inv_bw

        fidx = {"rw": F_RW, "dp": F_DP, "twrw": F_HRS}
        for r, inv_bw in group(("reducescatter", "allgather"), range(n), list(self.v.values()),
                               "rw"):
            group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_RW]]
        for r, inv_bw in group(("allreduce",), range(n), list(self.w.values()), "dp"):
            group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_DP]]
        for h, members in enumerate(hosts):
            store = [self.z[t, hh] for (t, hh) in self.z if hh == h]
            for r, inv_bw in group(("host_reducescatter", "host_allgather"), members, store,
                                   f"twrw{h}"):
                group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_HRS]]
        del fidx
        self.zmax = zmax = _new(lp, "zmax", 0)
        self.C = []
        for r in range(n):
            C = _new(lp, f"C_{r}", 0)
            self.C.append(C)
            terms = ([(v_, c * US) for v_, c in feats[r][F_FWD]]
                     + [(v_, c * US) for v_, c in feats[r][F_BWD]]
                     + a2a_terms[r] + group_terms[r] + [(C, -1.0)])
            lp += _lin(terms) == -(const[r] + launch)
            lp += zmax - C >= 0
        lp += _lin([(zmax, 1.0)] + [(C, EPS) for C in self.C])

    # -- choices ↔ variables ------------------------------------------------------------------
    def set_start(self, choices) -> None:
        for var in self.lp.variables():
            var.setInitialValue(0)
        n = self.cat.n
        for t, ch in enumerate(choices):
            kind = ch[0]
            if kind == "tw":
                self.x[t, ch[1]].setInitialValue(1)
            elif kind == "cw":
                k = ch[1]
                self.u[t, k].setInitialValue(1)
                for d in range(n):
                    self.m[t, k, d].setInitialValue(int(ch[2][d]))
                    self.y[t, k, d].setInitialValue(1 if ch[2][d] > 0 else 0)
            elif kind == "rw":
                self.v[t].setInitialValue(1)
            elif kind == "dp":
                self.w[t].setInitialValue(1)
            elif kind == "twrw":
                self.z[t, ch[1]].setInitialValue(1)
        # continuous variables and indicators from the analytic model
        F = self.cat.features(choices)
        cm = self.cat.cost
        costs = cm.rank_costs(F) * US
        for r, C in enumerate(self.C):
            C.setInitialValue(float(costs[r]))
        self.zmax.setInitialValue(float(costs.max()))
        b = cm.local_batch
        comm = cm.comm
        for var in self.lp.variables():
            name = var.name
            if name.startswith(("Pids_", "Pout_")):
                f = F_IDS if name.startswith("Pids") else F_OUT
                var.setInitialValue(float(F[int(name.split("_")[1]), f]))
            elif name.startswith(("Iids_", "Iout_", "Eids_", "Eout_")):
                f = F_IDS if "ids" in name else F_OUT
                r = int(name.split("_")[1])
                y_ = b * F[:, f]
                nodes = comm.node_of
                node_sum = y_[nodes == nodes[r]].sum()
                if name[0] == "I":
                    val = max(y_[r] * (comm.node_size[r] - 1), node_sum - y_[r]) / comm.intra_Bps
                else:
                    val = max(y_[r] * (comm.n - comm.node_size[r]), y_.sum() - node_sum) \
                        / comm.inter_Bps
                var.setInitialValue(float(val * US))
            elif name == "g_rw":
                var.setInitialValue(1 if any(c[0] == "rw" for c in choices) else 0)
            elif name == "g_dp":
                var.setInitialValue(1 if any(c[0] == "dp" for c in choices) else 0)
            elif name.startswith("g_twrw"):
                h = int(name[6:])
                var.setInitialValue(1 if any(c[0] == "twrw" and c[1] == h for c in choices) else 0)

    def choices(self) -> list | None:
        n = self.cat.n
        T = self.cat.model.num_tables
        out: list = [None] * T
        val = lambda v: v.varValue if v.varValue is not None else 0.0  # noqa: E731
        for (t, d), v in self.x.items():
            if val(v) > 0.5:
                out[t] = ("tw", d)
        for (t, k), v in self.u.items():
            if val(v) > 0.5:
                counts = tuple(int(round(val(self.m[t, k, d]))) for d in range(n))
                out[t] = self.cat.normalise(("cw", k, counts))
        for t, v in self.v.items():
            if val(v) > 0.5:
                out[t] = ("rw",)
        for t, v in self.w.items():
            if val(v) > 0.5:
                out[t] = ("dp",)
        for (t, h), v in self.z.items():
            if val(v) > 0.5:
                out[t] = ("twrw", h)
        if any(c is None for c in out):
            return None
        return out


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


def _solve_cbc(model: _Model, *, seconds: float, hard_deadline: float, seed: int,
               warm: bool) -> tuple[list | None, dict]:
    solver = _cbc()
    path = solver.path
    if not path or not solver.available():
        from simulator.errors import SpecError
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


def _solve_highs(model: _Model, *, seconds: float, seed: int) -> tuple[list | None, dict]:
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
    model = _Model(cat, parts=parts, types=types)
    if start is not None:
        model.set_start(start)
    built = time.perf_counter()
    remaining = time_limit_s - (built - t0)
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
    del remaining
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
            from simulator.errors import SpecError
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
                from simulator.errors import SpecError
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
