"""The MIP of the sharding problem: its PuLP variables, constraints and objective, and the
mapping between its variables and planner choices (solved in :mod:`.mip`).


Variables per table ``t`` (only the options its allowed types permit):

- ``x[t,d]`` ∈ {0,1}: table-wise on rank d;
- for ``k`` ∈ {2, 4, 8} equal column parts (width a multiple of 4): ``u[t,k]`` ∈ {0,1} (this
  split is used), ``m[t,k,d]`` ∈ {0..k} parts on rank d, ``y[t,k,d]`` ∈ {0,1} rank d holds a
  part, with ``Σ_d m = k·u``, ``y ≤ m ≤ k·y`` and ``Σ_d y ≥ 2u`` (parts on one rank merge into
  one shard, so any widths that are multiples of dim/k; all on one rank is table-wise);
- ``v[t]`` row-wise, ``w[t]`` data-parallel, ``z[t,h]`` table-row-wise on host h ∈ {0,1};
- exactly one option per table.

Per-rank features are linear in these (column blocks cost ``base·y + part·m``), and so is every
term of :class:`~planner.model.tables.cost.CostModel` except three kinds, which are exact in the
model too: the all-to-all maxima (one continuous variable per rank, link class and exchange,
bounded below by the send and the receive side), the fixed latency of the row-wise,
table-row-wise and data-parallel collectives (an indicator per group that is 1 when any table
uses it), and the fixed cost of a rank's fused lookup calls (an indicator per rank and lookup
group, 1 when the rank holds a shard of it: ``shards ≤ tables · indicator``). Each phase's
slowest rank has a variable ``M_p`` bounded below by every rank's cost in it (lookups forward,
lookups backward, the ids all-to-all, the pooled all-to-all forward and backward, the
row-wise, table-row-wise and data-parallel collectives), so ``Σ_p M_p`` equals the analytic
step cost of its plan (``CostModel.step_cost``). The objective is ``Σ_p M_p + 1e-6 · Σ_r
cost_r`` (µs), the second term preferring less total work among plans of equal step cost; the
bound reported is converted back to the step cost alone.
"""

from __future__ import annotations

import math
import time

import pulp

from simulator.errors import SpecError

from planner.lp import variable
from planner.model.tables.features import (F_BWD, F_DP, F_FWD, F_HRS, F_IDS, F_MEM, F_OUT,
                                           F_RW, FEATURES)
from planner.model.tables.shards import ShardingType
from planner.sharding.common import CW_PARTS, Catalog

__all__ = ["EPS", "US", "MipModel", "BuildTimeout"]

_TW, _CW, _RW, _DP, _TWRW = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE,
                             ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL,
                             ShardingType.TABLE_ROW_WISE)
US = 1e6          # the model works in microseconds
EPS = 1e-6        # weight of the total-cost tie-breaker


#: the model's phases and the cost model's components each one's variable M_p stands for
PHASE_KEYS = {"fwd": ("lookup_fwd_s",), "bwd": ("lookup_bwd_s",), "ids": ("input_a2a_s",),
              "out": ("output_a2a_fwd_s", "output_a2a_bwd_s"),
              "groups": ("row_wise_comm_s", "table_row_wise_comm_s",
                         "data_parallel_allreduce_s")}


class BuildTimeout(Exception):
    """The model was not built by its deadline (PuLP builds cannot be interrupted otherwise)."""


def _lin(pairs) -> pulp.LpAffineExpression:
    """A linear expression from ``(variable, coefficient)`` pairs, summing repeated variables."""
    acc: dict = {}
    for v, c in pairs:
        if c != 0.0:
            acc[v] = acc.get(v, 0.0) + float(c)
    return pulp.LpAffineExpression([(v, c) for v, c in acc.items() if c != 0.0])


class MipModel:
    """The PuLP model of one problem and its variable ↔ choice mapping."""

    def __init__(self, cat: Catalog, parts=CW_PARTS, types=None,
                 deadline: float = math.inf) -> None:
        """Build the model; :class:`BuildTimeout` once ``time.perf_counter()`` passes
        ``deadline`` (checked per table)."""
        self.cat = cat
        n = cat.n
        types = set(types or (_TW, _CW, _RW, _DP, _TWRW))
        self.lp = lp = pulp.LpProblem("sharding", pulp.LpMinimize)
        self.x: dict[tuple[int, int], pulp.LpVariable] = {}
        self.u: dict[tuple[int, int], pulp.LpVariable] = {}
        self.m: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self.y: dict[tuple[int, int, int], pulp.LpVariable] = {}
        self.v: dict[int, pulp.LpVariable] = {}
        self.w: dict[int, pulp.LpVariable] = {}
        self.z: dict[tuple[int, int], pulp.LpVariable] = {}
        # per-rank feature terms: feats[r][f] = list of (var, coef)
        feats = [[[] for _ in range(cat.cost.width)] for _ in range(n)]
        for t in range(cat.model.num_tables):
            if time.perf_counter() > deadline:
                raise BuildTimeout(f"model build passed its deadline at table {t}")
            self._add_table(t, types, parts, feats)
        # memory
        for d in range(n):
            lp += _lin(feats[d][F_MEM]) <= float(cat.cap[d])
        a2a = self._add_alltoalls(feats)
        group_terms = self._add_group_collectives(feats)
        calls = self._add_calls(feats)
        self._add_objective(feats, a2a, group_terms, calls)
        self.nonzeros = sum(len(c) for c in lp.constraints())

    # -- building the model -------------------------------------------------------------------
    def _add_table(self, t: int, types: set, parts, feats: list) -> None:
        """Add table ``t``'s option variables, their feature terms to ``feats``, and the
        constraint that exactly one option is chosen; an error when it has none."""
        cat, lp, n = self.cat, self.lp, self.cat.n
        one = []
        if _TW in types and cat.problem.allowed(t, _TW):
            f = cat.tw(t)
            for d in range(n):
                var = self.x[t, d] = variable(lp, f"x_{t}_{d}", cat="Binary")
                one.append(var)
                for k, fk in enumerate(f):
                    feats[d][k].append((var, fk))
        if _CW in types:
            for k in cat.cw_parts(t, parts):
                one.append(self._add_column_split(t, k, feats))
        for kind, store, st in (("rw", self.v, _RW), ("dp", self.w, _DP)):
            if st in types and cat.can(t, st):
                var = store[t] = variable(lp, f"{kind}_{t}", cat="Binary")
                one.append(var)
                self._add_uniform_terms(feats, var, cat.uniform(t, kind))
        if _TWRW in types and cat.can(t, _TWRW):
            for h in range(len(cat.problem.hosts)):
                var = self.z[t, h] = variable(lp, f"twrw_{t}_{h}", cat="Binary")
                one.append(var)
                self._add_uniform_terms(feats, var, cat.uniform(t, "twrw", h))
        if not one:
            have = ", ".join(sorted(x.value for x in cat.problem.allowed_types(t)))
            raise SpecError(f"table {cat.problem.model.tables[t].name!r} has no placement "
                            f"the MIP can use on {n} device(s) (allowed: {have or 'none'}; "
                            "table-row-wise needs more than one host)",
                            field="--sharding-types",
                            fix="allow another sharding type for it")
        lp += _lin([(o, 1) for o in one]) == 1

    def _add_column_split(self, t: int, k: int, feats: list) -> pulp.LpVariable:
        """Add table ``t``'s split into ``k`` column parts (``u``, ``m``, ``y`` and their
        constraints, see the module docstring) and its feature terms; the ``u`` variable."""
        cat, lp = self.cat, self.lp
        base, part = cat.cw(t, k)
        uu = self.u[t, k] = variable(lp, f"u_{t}_{k}", cat="Binary")
        ms, ys = [], []
        for d in range(cat.n):
            mm = self.m[t, k, d] = variable(lp, f"m_{t}_{k}_{d}", 0, k, cat="Integer")
            yy = self.y[t, k, d] = variable(lp, f"y_{t}_{k}_{d}", cat="Binary")
            ms.append(mm)
            ys.append(yy)
            lp += mm - k * yy <= 0
            lp += yy - mm <= 0
            for q in range(len(base)):
                feats[d][q].append((yy, base[q]))
                feats[d][q].append((mm, part[q]))
        lp += _lin([(mm, 1) for mm in ms] + [(uu, -k)]) == 0
        lp += _lin([(yy, 1) for yy in ys] + [(uu, -2)]) >= 0
        return uu

    def _add_uniform_terms(self, feats: list, var: pulp.LpVariable, G) -> None:
        """Add ``var`` × row ``d`` of the feature matrix ``G`` to every rank ``d``'s terms."""
        for d in range(self.cat.n):
            for q in range(G.shape[1]):
                feats[d][q].append((var, G[d, q]))

    def _add_alltoalls(self, feats: list) -> dict[str, tuple[list[list[tuple]], float]]:
        """The all-to-all maxima, per exchange (``ids``; ``out``: the pooled outputs forward
        and their gradients back): per rank the terms (variables in µs) and the constant
        latency (µs) they add to its cost."""
        cat, lp = self.cat, self.lp
        n, cm = cat.n, cat.cost
        comm = cm.comm
        b = cm.local_batch
        node_of = comm.node_of
        g = comm.node_size
        multi = n > g.min()
        out: dict[str, tuple[list[list[tuple]], float]] = {}
        if n > 1:
            # the pooled outputs cross twice: forward, and their gradients back (compressed or
            # not: CostModel.grad_scale)
            for f_idx, mult, name in ((F_IDS, 1.0, "ids"), (F_OUT, 1.0 + cm.grad_scale, "out")):
                a2a_terms: list[list[tuple]] = [[] for _ in range(n)]
                out[name] = (a2a_terms, mult * comm.a2a_alpha_s * US)
                P = [variable(lp, f"P{name}_{d}") for d in range(n)]
                for d in range(n):
                    lp += _lin(feats[d][f_idx] + [(P[d], -1.0)]) == 0
                scale_i = b * US / comm.intra_Bps
                for r in range(n):
                    I = variable(lp, f"I{name}_{r}", 0)
                    same = [q for q in range(n) if node_of[q] == node_of[r] and q != r]
                    lp += _lin([(I, 1.0), (P[r], -scale_i * (g[r] - 1))]) >= 0
                    if same:
                        lp += _lin([(I, 1.0)] + [(P[q], -scale_i) for q in same]) >= 0
                    a2a_terms[r].append((I, mult))
                    if multi:
                        scale_e = b * US / comm.inter_Bps
                        other = [q for q in range(n) if node_of[q] != node_of[r]]
                        E = variable(lp, f"E{name}_{r}", 0)
                        lp += _lin([(E, 1.0), (P[r], -scale_e * (n - g[r]))]) >= 0
                        lp += _lin([(E, 1.0)] + [(P[q], -scale_e) for q in other]) >= 0
                        a2a_terms[r].append((E, mult))
        return out

    def _add_group_collectives(self, feats: list) -> list[list[tuple]]:
        """Row-wise, data-parallel and table-row-wise collectives: per rank the terms (µs) of
        an indicator × alpha + bytes / bandwidth."""
        cat, lp, n = self.cat, self.lp, self.cat.n
        comm = cat.cost.comm
        group_terms: list[list[tuple]] = [[] for _ in range(n)]

        def group(kind_pairs, members, store, label):
            if not store:
                return
            ind = variable(lp, f"g_{label}", cat="Binary")
            for var in store:
                lp.addConstraint(ind - var >= 0)
            alpha = sum(comm.fits.get(k, (0.0, math.inf))[0] for k in kind_pairs) * US
            inv_bw = sum(1.0 / comm.fits.get(k, (0.0, math.inf))[1] for k in kind_pairs) * US
            for r in members:
                group_terms[r].append((ind, alpha))
                yield r, inv_bw

        for r, inv_bw in group(("reducescatter", "allgather"), range(n), list(self.v.values()),
                               "rw"):
            group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_RW]]
        for r, inv_bw in group(("allreduce",), range(n), list(self.w.values()), "dp"):
            group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_DP]]
        for h, members in enumerate(cat.problem.hosts):
            store = [self.z[t, hh] for (t, hh) in self.z if hh == h]
            for r, inv_bw in group(("host_reducescatter", "host_allgather"), members, store,
                                   f"twrw{h}"):
                group_terms[r] += [(v_, c * inv_bw) for v_, c in feats[r][F_HRS]]
        return group_terms

    def _add_calls(self, feats: list) -> list[list]:
        """Per rank, an indicator per lookup group (``CostModel.groups``) that is 1 when the
        rank holds a shard of it: ``count ≤ tables · indicator``, so each group present costs
        one fused call's fixed time (forward and backward)."""
        cm, lp = self.cat.cost, self.lp
        out: list[list] = [[] for _ in range(self.cat.n)]
        for r in range(self.cat.n):
            for i, col in enumerate(range(len(FEATURES), cm.width)):
                terms = [(v_, c) for v_, c in feats[r][col] if c != 0.0]
                if not terms:
                    continue
                ind = variable(lp, f"call_{r}_{i}", cat="Binary")
                bound = float(sum(c for _, c in terms))
                lp += _lin(terms + [(ind, -bound)]) <= 0
                out[r].append(ind)
        return out

    def _add_objective(self, feats: list, a2a: dict, group_terms: list, calls: list) -> None:
        """Each phase's slowest rank ``M_p`` (µs) ≥ every rank's cost in it, each rank's cost
        ``C_r`` (µs), and the objective ``Σ_p M_p + EPS · Σ_r C_r``."""
        lp, n, cm = self.lp, self.cat.n, self.cat.cost
        # phase -> (per-rank terms, constant µs); the constants are CostModel.components'
        phases = {"fwd": ([[(v_, c * US) for v_, c in feats[r][F_FWD]]
                           + [(g, cm.launch_s * US) for g in calls[r]] for r in range(n)],
                          cm.decompress_fwd_s * US),
                  "bwd": ([[(v_, c * US) for v_, c in feats[r][F_BWD]]
                           + [(g, cm.bwd_call_s * US) for g in calls[r]] for r in range(n)],
                          cm.compress_bwd_s * US),
                  **a2a, "groups": (group_terms, 0.0)}
        self.M = {p: variable(lp, f"M_{p}", 0) for p in phases}
        self.C = [variable(lp, f"C_{r}", 0) for r in range(n)]
        for p, (terms, const) in phases.items():
            for r in range(n):
                lp += _lin([(self.M[p], 1.0)] + [(v_, -c) for v_, c in terms[r]]) >= const
        for r, C in enumerate(self.C):
            terms = [tc for t, _ in phases.values() for tc in t[r]]
            lp += _lin(terms + [(C, -1.0)]) == -sum(const for _, const in phases.values())
        lp += _lin([(M, 1.0) for M in self.M.values()] + [(C, EPS) for C in self.C])

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
        comp = cm.components(F)
        for p, M in self.M.items():
            M.setInitialValue(float(sum(comp[k] for k in PHASE_KEYS[p]).max() * US))
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
            elif name.startswith("call_"):
                r, i = (int(x) for x in name.split("_")[1:])
                var.setInitialValue(1 if F[r, len(FEATURES) + i] > 0.5 else 0)

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
