"""A sharding plan: layouts, per-rank cost and memory, validity, planner statistics; versioned JSON.

JSON (``format_version`` 1)::

    {"format": "clusterplan.sharding-plan", "format_version": 1,
     "planner": "mip", "devices": 8, "topology": "dgx-a100:nodes=1", "gpu": "a100-80gb",
     "task": {"name", "source", "sha256", "num_tables", "batch_size", "optimizer", ...},
     "valid": true, "problems": [],
     "step_cost_s": 0.0013, "max_cost_s": 0.0012, "per_rank_cost_s": [...], "imbalance": 1.03,
     "per_rank_breakdown_s": {"lookup_fwd_s": [...], ...}, "dense_s": {...},
     "memory_per_rank_bytes": [...], "memory_capacity_bytes": [...],
     "shards": [{"table": "t0", "sharding_type": "column_wise", "ranks": [0, 3],
                 "shards": [{"rank": 0, "offsets": [0, 0], "sizes": [1000, 64]}, ...]}, ...],
     "planner_stats": {"wall_s", "status", "gap", "objective_s", "bound_s", "seed",
                       "time_limit_s", "solver", "iterations", "notes", "timings_s"}}

``step_cost_s`` is what the planners minimise: the embedding part of one step, each phase's
slowest rank summed (:meth:`~planner.model.tables.cost.CostModel.step_cost`); ``max_cost_s`` is
the slowest rank's own sum of phases (≤ ``step_cost_s``; equal when one rank is the slowest in
every phase). Offsets and sizes are ``[row, column]``. Shards keep TorchRec's order
(``ranks`` has one entry per shard). ``planner_stats.wall_s`` and ``planner_stats.timings_s``
are the only values that change between identical runs; ``to_json(stable=True)`` leaves them
out, so the same inputs and seed give the same bytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import atomic_write_text, dumps_json

from planner.model.tables.features import BREAKDOWN_KEYS, F_MEM, step_cost_of
from planner.model.tables.shards import (ALL_SHARDING_TYPES, Shard, ShardingType, TableSharding,
                                          validate_sharding)
from planner.model.tables.spec import ModelSpec
from planner.model.tables.spec_file import builtin_spec_names, load_model_spec
from planner.model.tables.task import Problem

__all__ = ["PlannerStats", "Plan", "make_plan", "evaluate_shardings", "read_plan_json",
           "shard_entries", "read_shard_entries", "plan_model", "FORMAT_VERSION"]

FORMAT_VERSION = 1
FORMAT = "clusterplan.sharding-plan"


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerStats:
    """How a planner got its plan.

    ``status``: ``heuristic`` (a constructive or local-search planner), ``optimal`` (a MIP
    proved it), ``time_limit`` (a MIP's incumbent when time ran out; ``gap`` says how far from
    the best bound), ``optimal_reduced`` (proved optimal over the options that could be built
    within the limit; notes say which were left out), ``fallback`` (the MIP produced nothing
    better than its warm start in time).
    ``gap`` = (objective − bound) / objective, None where no bound exists.
    """

    wall_s: float = 0.0
    status: str = "heuristic"
    gap: float | None = None
    objective_s: float | None = None
    bound_s: float | None = None
    seed: int = 0
    time_limit_s: float | None = None
    solver: str = ""
    iterations: int = 0
    notes: tuple[str, ...] = ()
    timings_s: tuple[tuple[str, float], ...] = ()

    def to_dict(self, *, stable: bool = False) -> dict:
        d = {"wall_s": self.wall_s, "status": self.status, "gap": self.gap,
             "objective_s": self.objective_s, "bound_s": self.bound_s, "seed": self.seed,
             "time_limit_s": self.time_limit_s, "solver": self.solver,
             "iterations": self.iterations, "notes": list(self.notes),
             "timings_s": dict(self.timings_s)}
        if stable:
            del d["wall_s"], d["timings_s"]
        return d


@dataclass(frozen=True)
class Evaluation:
    """Cost and memory of a set of layouts (no planner attached)."""

    features: np.ndarray
    per_rank_cost_s: np.ndarray
    breakdown_s: Mapping[str, np.ndarray]
    memory_per_rank_bytes: np.ndarray
    valid: bool
    problems: tuple[str, ...]

    @property
    def max_cost_s(self) -> float:
        return float(self.per_rank_cost_s.max())

    @property
    def step_cost_s(self) -> float:
        return step_cost_of(self.breakdown_s)


def evaluate_shardings(problem: Problem, shardings: Sequence[TableSharding]) -> Evaluation:
    """Features, per-rank costs, memory and validity of ``shardings`` (one per table)."""
    cm = problem.cost
    F = cm.plan_features(shardings)
    comp = cm.components(F)
    costs = cm.rank_costs(F)
    mem = F[:, F_MEM]
    problems: list[str] = []
    seen = [0] * problem.num_tables
    for ts in shardings:
        t = problem.model.tables[ts.table]
        seen[ts.table] += 1
        for p in validate_sharding(ts, t.num_embeddings, t.embedding_dim, problem.devices,
                                   problem.hosts):
            problems.append(f"table {t.name!r}: {p}")
        if not problem.allowed(ts.table, ts.sharding_type):
            problems.append(f"table {t.name!r}: sharding type {ts.sharding_type.value} is not "
                            "allowed")
    for i, k in enumerate(seen):
        if k != 1:
            problems.append(f"table {problem.model.tables[i].name!r} has {k} layouts, not 1")
    for r in range(problem.devices):
        if mem[r] > problem.capacity_bytes[r]:
            problems.append(f"rank {r} needs {int(mem[r]):,} bytes, above its capacity "
                            f"{problem.capacity_bytes[r]:,}")
    return Evaluation(features=F, per_rank_cost_s=costs, breakdown_s=comp,
                      memory_per_rank_bytes=mem, valid=not problems, problems=tuple(problems))


@dataclass(frozen=True)
class Plan:
    """A complete plan for one task on ``devices`` ranks (see the module docstring)."""

    planner: str
    devices: int
    topology: str
    gpu: str
    task: Mapping[str, Any]
    shardings: tuple[TableSharding, ...]
    per_rank_cost_s: tuple[float, ...]
    breakdown_s: Mapping[str, tuple[float, ...]]
    dense_s: Mapping[str, float]
    memory_per_rank_bytes: tuple[int, ...]
    memory_capacity_bytes: tuple[int, ...]
    valid: bool
    problems: tuple[str, ...] = ()
    stats: PlannerStats = field(default_factory=PlannerStats)
    #: where the lookup model was used outside its measured ranges (or has no measurement)
    extrapolated: tuple[str, ...] = ()

    @property
    def max_cost_s(self) -> float:
        """The slowest rank's embedding cost (its sum of phases), seconds."""
        return max(self.per_rank_cost_s)

    @property
    def step_cost_s(self) -> float:
        """The embedding part of one step, seconds: each phase's slowest rank, summed (what
        the planners minimise; see the module docstring)."""
        return step_cost_of(self.breakdown_s)

    @property
    def imbalance(self) -> float:
        """max / mean per-rank cost (1 = perfectly balanced)."""
        mean = sum(self.per_rank_cost_s) / len(self.per_rank_cost_s)
        return self.max_cost_s / mean if mean > 0 else 1.0

    def type_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ts in self.shardings:
            out[ts.sharding_type.value] = out.get(ts.sharding_type.value, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self, *, stable: bool = False) -> dict:
        shards = shard_entries(self.shardings)
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "planner": self.planner, "devices": self.devices, "topology": self.topology,
            "gpu": self.gpu, "task": dict(self.task), "valid": self.valid,
            "problems": list(self.problems), "step_cost_s": self.step_cost_s,
            "max_cost_s": self.max_cost_s,
            "per_rank_cost_s": list(self.per_rank_cost_s), "imbalance": self.imbalance,
            "per_rank_breakdown_s": {k: list(v) for k, v in self.breakdown_s.items()},
            "dense_s": dict(self.dense_s),
            "extrapolated": list(self.extrapolated),
            "memory_per_rank_bytes": list(self.memory_per_rank_bytes),
            "memory_capacity_bytes": list(self.memory_capacity_bytes),
            "sharding_type_counts": self.type_counts(),
            "shards": shards,
            "planner_stats": self.stats.to_dict(stable=stable),
        }

    def to_json(self, *, stable: bool = False) -> str:
        """The plan as JSON text (``stable``: without wall-clock time, byte-reproducible)."""
        return dumps_json(self.to_dict(stable=stable), indent=2, ensure_ascii=False) + "\n"

    def write(self, path: str | os.PathLike, *, stable: bool = False) -> None:
        """Write the JSON atomically (a temporary file in the same folder, then a rename)."""
        atomic_write_text(path, self.to_json(stable=stable))


def make_plan(problem: Problem, shardings: Sequence[TableSharding], planner: str,
              stats: PlannerStats) -> Plan:
    """Evaluate ``shardings`` and wrap them as a :class:`Plan` (sorted by table index)."""
    shardings = tuple(sorted(shardings, key=lambda ts: ts.table))
    ev = evaluate_shardings(problem, shardings)
    m = problem.model
    task = {"name": m.name, "source": m.source, "sha256": m.sha256(),
            "num_tables": m.num_tables, "batch_size": m.batch_size, "optimizer": m.optimizer,
            "comm_precision": m.comm_precision, "total_weight_bytes": m.total_weight_bytes,
            "allowed_sharding_types": [s.value for s in (problem.task.sharding_types or
                                                         ALL_SHARDING_TYPES)]}
    dense = problem.cost.dense_costs()
    return Plan(planner=planner, devices=problem.devices, topology=problem.topology_ref,
                gpu=problem.topology.gpu.name, task=task, shardings=shardings,
                per_rank_cost_s=tuple(float(x) for x in ev.per_rank_cost_s),
                breakdown_s={k: tuple(float(x) for x in ev.breakdown_s[k]) for k in BREAKDOWN_KEYS},
                dense_s={k: float(v) for k, v in dense.items()},
                memory_per_rank_bytes=tuple(int(round(x)) for x in ev.memory_per_rank_bytes),
                memory_capacity_bytes=tuple(int(x) for x in problem.capacity_bytes),
                valid=ev.valid, problems=ev.problems, stats=stats,
                extrapolated=tuple(problem.cost.extrapolated()))


def plan_model(doc: Mapping[str, Any], source: str, tables: str | None = None) -> ModelSpec:
    """The model a plan JSON was made for, with the plan's batch and optimizer: ``tables`` when
    given, else the plan's ``task.source`` (or, when that file is not here, the built-in spec of
    the plan's name), checked against the plan's hash."""
    info = doc.get("task") or {}
    ref = tables or str(info.get("source") or "")
    if not tables and not os.path.isfile(ref) and info.get("name") in builtin_spec_names():
        ref = str(info["name"])
    if not ref or not (os.path.exists(ref) or ref in builtin_spec_names()):
        raise SpecError(f"the plan's table spec {ref!r} is not a file here", source=source,
                        field="task.source", fix="pass the table spec with --tables TABLES, or "
                                                 "run from the folder the plan was made in")
    model = load_model_spec(ref).with_overrides(batch_size=info.get("batch_size"),
                                                optimizer=info.get("optimizer"))
    if info.get("sha256") and info["sha256"] != model.sha256():
        raise SpecError(f"the plan was made for another model ({info.get('name')!r}, "
                        f"{info.get('num_tables')} tables)", source=source, field="task.sha256",
                        fix=f"pass the table spec the plan was made from, or re-plan {ref}")
    return model


def shard_entries(shardings) -> list[dict]:
    """The ``shards`` section of a plan JSON: one entry per table layout."""
    out = []
    for ts in shardings:
        entry: dict[str, Any] = {"table": ts.name, "sharding_type": ts.sharding_type.value,
                                 "ranks": list(ts.ranks)}
        if ts.sharding_type == ShardingType.TABLE_ROW_WISE:
            entry["host"] = ts.host
        entry["shards"] = [{"rank": s.rank, "offsets": [s.row_offset, s.col_offset],
                            "sizes": [s.rows, s.cols]} for s in ts.shards]
        out.append(entry)
    return out


def read_plan_json(doc: Mapping[str, Any], problem: Problem) -> tuple[TableSharding, ...]:
    """Rebuild the layouts of a plan JSON for ``problem`` (table names must match)."""
    if doc.get("format_version") != FORMAT_VERSION:
        raise SpecError(f"plan format_version {doc.get('format_version')!r} is not "
                        f"{FORMAT_VERSION}", field="format_version",
                        fix="re-plan with this version of clusterplan")
    return read_shard_entries(doc.get("shards", []), problem.model)


def read_shard_entries(entries, model: ModelSpec) -> tuple[TableSharding, ...]:
    """The layouts of a plan JSON's ``shards`` section (:func:`shard_entries`) for ``model``'s
    tables (names must match)."""
    index = {t.name: i for i, t in enumerate(model.tables)}
    out = []
    for k, e in enumerate(entries):
        if e.get("table") not in index:
            raise SpecError(f"plan names table {e.get('table')!r}, not in the model",
                            field=f"shards[{k}].table", fix="plan and model must match")
        shards = tuple(Shard(int(s["rank"]), int(s["offsets"][0]), int(s["offsets"][1]),
                             int(s["sizes"][0]), int(s["sizes"][1])) for s in e["shards"])
        out.append(TableSharding(index[e["table"]], e["table"], ShardingType(e["sharding_type"]),
                                 shards, host=int(e.get("host", -1))))
    return tuple(out)
