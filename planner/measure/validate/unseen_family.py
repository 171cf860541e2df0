"""The seeded family of ``clusterplan validate unseen``: random table sets nothing was fitted
to, each with several sharding plans.

:func:`unseen_cases` draws ``sets`` table sets, each with several plans:

- ranks 2 or 4; 4-40 tables; dims from {16, 32, 64, 128, 256}; pooling factors log-uniform in
  [1, 60]; rows log-uniform in [10³, 10⁷]; batch log-uniform in [1,024, 65,536] (a multiple
  of 4 × ranks); Zipf exponents uniform in [0, 1.2]; half the sets with a DCNv2 dense part;
- so that a run fits this machine, a table over :data:`MAX_TABLE_BYTES` keeps the rows that
  fit, a set over :data:`MAX_SET_BYTES` has its rows shrunk in proportion, and one whose
  lookups per step exceed :data:`MAX_LOOKUPS` its batch halved until it fits (all recorded in
  the set's name);
- plans: the greedy planner (every type allowed), the seeded random table-wise placement, every
  table column-wise in equal blocks over the ranks, and row-wise tables with the smallest ones
  data-parallel (up to 1 MiB in all); a plan whose export would give a row shard no rows
  (which FBGEMM's CPU kernel cannot run) or repeats another plan is left out.

Seeds: the family is drawn from ``SeedSequence([seed, 0x0E5EE7])``; the CPU profile's kernel
sweep uses ``0xCA1B`` and the gloo calibration fixed probe tables, so no set here was ever
fitted to. :func:`write_case` writes a case as the table spec and plan JSON a user would give
``clusterplan validate``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import yaml

from simulator.errors import SpecError

import planner.model.tables.shards as sh
from planner.model.tables.plan import (PlannerStats, make_plan, read_shard_entries,
                                       shard_entries)
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import DenseSpec, ModelSpec, TableSpec
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.planners import get_planner

__all__ = ["UnseenCase", "unseen_cases", "write_case", "layout_record", "with_layout",
           "MAX_TABLE_BYTES", "MAX_SET_BYTES", "MAX_LOOKUPS", "DIMS", "PLAN_KINDS", "DP_BYTES"]

#: weights of one table (bytes) and of one set, so 4 ranks fit in this machine's memory
MAX_TABLE_BYTES = 256 * 2 ** 20
MAX_SET_BYTES = 2 ** 30
#: ids looked up per step over all tables, so one step stays under a few seconds on one core
MAX_LOOKUPS = 6_000_000
DIMS = (16, 32, 64, 128, 256)
PLAN_KINDS = ("greedy", "random", "column_wise", "row_wise+dp")
#: data-parallel tables of a row_wise+dp plan in all (DDP keeps them in one 1 MiB bucket)
DP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class UnseenCase:
    """One plan of one table set: ``set_name``, ``plan_kind``, the model and the plan's
    layouts on ``ranks`` ranks."""

    set_name: str
    plan_kind: str
    model: ModelSpec
    ranks: int
    shardings: tuple


def _table_set(rng: np.random.Generator, k: int, max_lookups: int = MAX_LOOKUPS,
               max_bytes: int = MAX_SET_BYTES) -> tuple[ModelSpec, int]:
    ranks = int(rng.choice((2, 4)))
    T = int(rng.integers(4, 41))
    tables, capped = [], 0
    for i in range(T):
        rows = int(round(10 ** rng.uniform(3.0, 7.0)))
        dim = int(rng.choice(DIMS))
        if rows * dim * 4 > MAX_TABLE_BYTES:
            rows, capped = MAX_TABLE_BYTES // (dim * 4), capped + 1
        tables.append(TableSpec(name=f"u{k}t{i}", num_embeddings=rows, embedding_dim=dim,
                                pooling_factor=round(float(10 ** rng.uniform(0, math.log10(60))), 3),
                                zipf_exponent=round(float(rng.uniform(0.0, 1.2)), 3)))
    batch = int(round(10 ** rng.uniform(math.log10(1024), math.log10(65536))))
    step = 4 * ranks
    batch = max(step, batch - batch % step)
    notes = [f"{capped} tables capped"] if capped else []
    size = sum(t.weight_bytes for t in tables)
    if size > max_bytes:
        f = max_bytes / size
        tables = [replace(t, num_embeddings=max(1000, int(t.num_embeddings * f))) for t in tables]
        notes.append(f"rows×{f:.2g}")
    while batch * sum(t.pooling_factor for t in tables) > max_lookups and batch // 2 >= 1024:
        batch = max(step, (batch // 2) - (batch // 2) % step)
        notes.append("batch/2")
    dense = None
    if rng.random() < 0.5:
        dense = DenseSpec(bottom_mlp=(64, 32), top_mlp=(64, 1), interaction="dcnv2",
                          dcn_layers=1, dcn_projection=32)
    name = f"unseen-{k}" + (f" ({', '.join(notes)})" if notes else "")
    return ModelSpec(name=f"unseen-{k}", tables=tuple(tables), dense=dense, batch_size=batch,
                     optimizer="sgd", description=name), ranks


def _hand_plan(model: ModelSpec, ranks: int, kind: str) -> tuple:
    """Column-wise: every table in ``ranks`` equal column blocks, rotated over the ranks;
    row-wise+dp: data-parallel for the smallest tables up to :data:`DP_BYTES` in all (so DDP
    keeps one bucket), row-wise for the rest."""
    out, dp_left = [], DP_BYTES
    for i, t in enumerate(model.tables):
        rows, dim = t.num_embeddings, t.embedding_dim
        if kind == "column_wise":
            parts = min(ranks, dim // 4)
            out.append(sh.column_wise(i, t.name, rows, dim,
                                      [(i + j) % ranks for j in range(parts)],
                                      sh.column_widths(dim, parts)))
        elif t.weight_bytes <= dp_left and t.weight_bytes <= DP_BYTES // 4:
            dp_left -= t.weight_bytes
            out.append(sh.data_parallel(i, t.name, rows, dim, ranks))
        else:
            out.append(sh.row_wise(i, t.name, rows, dim, ranks))
    return tuple(out)


def _plans(model: ModelSpec, ranks: int, seed: int) -> list[tuple[str, tuple]]:
    topo = f"localhost-gloo:node.gpus={ranks}"
    out, seen = [], set()
    for kind in PLAN_KINDS:
        if kind in ("greedy", "random"):
            task = ShardingTask(model=model, topology=topo)
            try:
                shardings = get_planner(kind).plan(task, ranks, seed=seed).shardings
            except SpecError:
                continue
        else:
            shardings = _hand_plan(model, ranks, kind)
        key = tuple((ts.sharding_type, tuple((s.rank, s.rows, s.cols) for s in ts.shards))
                    for ts in shardings)
        if key in seen or _empty_row_shard(shardings):
            continue
        seen.add(key)
        out.append((kind, tuple(shardings)))
    return out


def _empty_row_shard(shardings) -> bool:
    return any(s.rows == 0 for ts in shardings for s in ts.shards
               if ts.sharding_type in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE))


def unseen_cases(sets: int, *, seed: int = 0, max_lookups: int = MAX_LOOKUPS,
                 max_bytes: int = MAX_SET_BYTES, only=None) -> list[UnseenCase]:
    """The family's cases (see the module docstring), same seed same cases; ``max_lookups``
    and ``max_bytes`` lower the caps on ids per step and weights per set (shorter runs: the
    tests' reduced set); ``only`` (set indices from 0) keeps those sets' cases, each the same
    as in the whole family (every set is still drawn, in order)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x0E5EE7]))
    out = []
    for k in range(sets):
        model, ranks = _table_set(rng, k, max_lookups, max_bytes)
        if only is not None and k not in only:
            continue
        for kind, shardings in _plans(model, ranks, seed):
            out.append(UnseenCase(model.description, kind, model, ranks, shardings))
    return out


def _spec_yaml(m: ModelSpec) -> str:
    doc = m.canonical()
    for t in doc["tables"]:
        for key in ("reuse_bins", "sharding_types"):
            t.pop(key, None)
    if doc["dense"] is None:
        doc.pop("dense")
    return yaml.safe_dump(doc, sort_keys=False)


def write_case(case: UnseenCase, folder: Path) -> Path:
    """Write the case's table spec and plan JSON into ``folder``; the plan's path."""
    stem = f"{case.model.name}-{case.plan_kind}"
    spec = folder / f"{case.model.name}.yaml"
    spec.write_text(_spec_yaml(case.model))
    model = load_model_spec(str(spec))
    problem = prepare(ShardingTask(model=model, topology=f"localhost-gloo:node.gpus="
                                                        f"{case.ranks}"), case.ranks)
    plan = make_plan(problem, case.shardings, case.plan_kind, PlannerStats())
    out = folder / f"{stem}.json"
    out.write_text(json.dumps(plan.to_dict(stable=True)))
    return out


def layout_record(shardings) -> list:
    """The plan's layouts as a plan JSON's ``shards`` section
    (:func:`~planner.model.tables.plan.shard_entries`). A run records it beside each row,
    because the family's greedy plan is made with the CPU profile of the day: a later
    re-prediction must take the plan that was measured, not the one the seed makes now."""
    return shard_entries(shardings)


def with_layout(case: UnseenCase, record, *, source: str, field: str) -> UnseenCase:
    """``case`` with the plan of ``record`` (:func:`layout_record`); a record that does not
    describe a plan of the case's tables raises :class:`SpecError` naming ``source`` and
    ``field``."""
    fix = "re-predict a file written by `validate unseen --out` of this version"
    try:
        out = read_shard_entries(record, case.model)
    except SpecError as e:
        raise SpecError(e.message, source=source, field=f"{field}.{e.field}", fix=fix) from None
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise SpecError(f"not a recorded plan of {case.model.name!r} ({e!r})", source=source,
                        field=field, fix=fix) from None
    if sorted(ts.table for ts in out) != list(range(len(case.model.tables))):
        raise SpecError(f"the recorded plan does not lay out each of the {len(case.model.tables)}"
                        " tables once", source=source, field=field, fix=fix)
    return replace(case, shardings=out)
