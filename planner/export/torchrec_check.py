"""Checks of a ``clusterplan.torchrec-plan`` document, shared by the exporter (its own output)
and the loader: every failure a :class:`SpecError` naming the field and the fix; shards must
tile each table exactly in TorchRec's layouts (formats.md §2.2, §2.10)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from simulator.errors import SpecError

from planner.export.torchrec_format import (
    FIX_EXPORT,
    FORMAT,
    KERNELS,
    MAX_WORLD,
    SCHEMA_VERSION,
    SHARDING_PLAN_FORMAT,
    SUPPORTED_TYPES,
    context_sha256,
    parse_placement,
    table_shapes,
)
from planner.export.torchrec_format import spec_error as _err
from planner.model.tables.shards import row_blocks

__all__ = ["check_torchrec_plan", "empty_row_shards", "empty_shard_error"]


def check_torchrec_plan(doc: Any, source: str | None = None) -> dict[str, Any]:
    """Check a ``clusterplan.torchrec-plan`` document; return it. Every failure is a
    :class:`SpecError` naming the field (``plan."".t3.shards[1].shard_sizes``) and the fix."""
    if not isinstance(doc, Mapping):
        raise _err(f"expected a JSON object, got {type(doc).__name__}", "(top level)",
                   FIX_EXPORT, source)
    if doc.get("format") != FORMAT:
        raise _err(f"format is {doc.get('format')!r}, not {FORMAT!r}", "format",
                   FIX_EXPORT + " (a clusterplan.sharding-plan must be exported first)"
                   if doc.get("format") == SHARDING_PLAN_FORMAT else FIX_EXPORT, source)
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise _err(f"schema_version {doc.get('schema_version')!r} is not supported (this "
                   f"loader reads {SCHEMA_VERSION})", "schema_version",
                   "export it again with this version of clusterplan", source)
    world = doc.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise _err(f"{world!r} is not an integer in 1..{MAX_WORLD:,}", "world_size",
                   FIX_EXPORT, source)
    lws = doc.get("local_world_size")
    if isinstance(lws, bool) or not isinstance(lws, int) or lws < 1 or world % lws:
        raise _err(f"{lws!r} does not divide world_size {world}", "local_world_size",
                   FIX_EXPORT, source)
    ctx = doc.get("context")
    if not isinstance(ctx, Mapping) or not isinstance(ctx.get("tables"), Mapping):
        raise _err("missing or not an object with a tables map", "context", FIX_EXPORT,
                   source)
    for name, shp in ctx["tables"].items():
        if not (isinstance(shp, list) and len(shp) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in shp)):
            raise _err(f"{shp!r} is not [rows, dim] with both ≥ 1", f"context.tables.{name}",
                       FIX_EXPORT, source)
    want = context_sha256(ctx["tables"], world, lws, ctx.get("batch_size"), ctx.get("topology"))
    if ctx.get("sha256") != want:
        raise _err("does not match the tables, world size, batch size and topology of the "
                   "file (edited by hand?)", "context.sha256", FIX_EXPORT, source)
    plan = doc.get("plan")
    if not isinstance(plan, Mapping) or not plan:
        raise _err("missing or empty", "plan", FIX_EXPORT, source)
    shapes = table_shapes(doc)
    seen: set[str] = set()
    for fqn, tables in plan.items():
        where = f"plan.{json.dumps(fqn)}" if fqn == "" else f"plan.{fqn}"
        if not isinstance(tables, Mapping) or not tables:
            raise _err("missing or empty table map", where, FIX_EXPORT, source)
        for name, p in tables.items():
            f = f"{where}.{name}"
            if name not in shapes:
                raise _err(f"table {name!r} is not in context.tables", f, FIX_EXPORT, source)
            if name in seen:
                raise _err(f"table {name!r} is planned twice", f, "keep one entry per table",
                           source)
            seen.add(name)
            _check_entry(p, f, shapes[name], world, lws, source)
    missing = sorted(set(shapes) - seen)
    if missing:
        raise _err(f"tables {missing} are in context.tables but not planned", "plan",
                   FIX_EXPORT, source)
    return dict(doc)


def _check_entry(p: Any, f: str, shape: tuple[int, int], world: int, lws: int,
                 source: str | None) -> None:
    if not isinstance(p, Mapping):
        raise _err("not an object", f, FIX_EXPORT, source)
    st, kernel = p.get("sharding_type"), p.get("compute_kernel")
    if st not in SUPPORTED_TYPES:
        raise _err(f"sharding type {st!r} is not supported", f"{f}.sharding_type",
                   "use " + ", ".join(SUPPORTED_TYPES), source)
    if kernel not in KERNELS:
        raise _err(f"compute kernel {kernel!r} is not a TorchRec kernel", f"{f}.compute_kernel",
                   "use fused (dense for data_parallel)", source)
    if (st == "data_parallel") != (kernel == "dense"):
        raise _err(f"{st} with kernel {kernel!r}: TorchRec's sharder runs data_parallel only "
                   "with dense and the other types with fused (or its UVM / key-value kernels)",
                   f"{f}.compute_kernel", "use dense for data_parallel, fused otherwise", source)
    ranks = p.get("ranks")
    if not isinstance(ranks, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) and 0 <= r < world for r in ranks):
        raise _err(f"{ranks!r} is not a list of ranks in 0..{world - 1}", f"{f}.ranks",
                   FIX_EXPORT, source)
    rows, dim = shape
    if st == "data_parallel":
        if p.get("shards") is not None:
            raise _err("data_parallel has no shards (a full replica on every rank)",
                       f"{f}.shards", "drop the shards member", source)
        if ranks != list(range(world)):
            raise _err(f"data_parallel ranks {ranks} are not 0..{world - 1}", f"{f}.ranks",
                       FIX_EXPORT, source)
        return
    shards = p.get("shards")
    if not isinstance(shards, list) or not shards:
        raise _err("missing or empty", f"{f}.shards", FIX_EXPORT, source)
    if len(ranks) != len(shards):
        raise _err(f"{len(ranks)} ranks for {len(shards)} shards (one rank per shard, in shard "
                   "order)", f"{f}.ranks", FIX_EXPORT, source)
    boxes = []
    for k, s in enumerate(shards):
        g = f"{f}.shards[{k}]"
        if not isinstance(s, Mapping):
            raise _err("not an object", g, FIX_EXPORT, source)
        for key in ("shard_offsets", "shard_sizes"):
            v = s.get(key)
            if not (isinstance(v, list) and len(v) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
                raise _err(f"{v!r} is not [row, column] with both ≥ 0", f"{g}.{key}",
                           FIX_EXPORT, source)
        pl = parse_placement(s.get("placement"))
        if pl is None or pl[0] != ranks[k]:
            raise _err(f"placement {s.get('placement')!r} is not rank:{ranks[k]}/cpu or "
                       f"rank:{ranks[k]}/cuda:N (ranks[{k}] is {ranks[k]})", f"{g}.placement",
                       FIX_EXPORT, source)
        (r0, c0), (nr, nc) = s["shard_offsets"], s["shard_sizes"]
        if r0 + nr > rows or c0 + nc > dim:
            raise _err(f"shard [{r0}:{r0 + nr}, {c0}:{c0 + nc}] lies outside the table "
                       f"[{rows}, {dim}]", f"{g}.shard_sizes", FIX_EXPORT, source)
        boxes.append((r0, c0, nr, nc, ranks[k]))
    problem = _layout_problem(st, boxes, rows, dim, world, lws)
    if problem:
        raise _err(f"{st}: {problem}", f"{f}.shards",
                   "use TorchRec's layout (formats.md §2.2); " + FIX_EXPORT, source)
    problem = _tiling_problem(boxes, rows, dim, by_rows=st in ("row_wise", "table_row_wise"))
    if problem:
        raise _err(problem, f"{f}.shards", FIX_EXPORT, source)


def _tiling_problem(boxes: list[tuple[int, int, int, int, int]], rows: int, dim: int, *,
                    by_rows: bool) -> str | None:
    """None when the shards cover ``rows × dim`` exactly once. Called after
    :func:`_layout_problem`, so every shard spans all columns (``by_rows``) or all rows: the
    check is one of intervals along the other axis."""
    spans = sorted((b[0], b[2]) if by_rows else (b[1], b[3]) for b in boxes)
    end, covered = 0, 0
    for start, size in spans:
        if size and start < end:
            return f"shards at {'row' if by_rows else 'column'} {start} overlap"
        end, covered = max(end, start + size), covered + size
    full = rows if by_rows else dim
    if covered != full:
        what = "rows" if by_rows else "columns"
        return f"shards cover {covered:,} of the table's {full:,} {what}"
    return None


def _layout_problem(st: str, boxes, rows: int, dim: int, world: int, lws: int) -> str | None:
    ranks = [b[4] for b in boxes]
    if st == "table_wise":
        if len(boxes) != 1:
            return f"{len(boxes)} shards, table_wise has one"
        if boxes[0][:4] != (0, 0, rows, dim):
            return f"the shard must be the whole table [{rows}, {dim}] at [0, 0]"
        return None
    if st in ("column_wise", "table_column_wise"):
        if any(b[0] != 0 or b[2] != rows for b in boxes):
            return "column blocks must span all rows"
        if any(b[3] == 0 for b in boxes):
            return "column blocks must not be empty"
        if st == "table_column_wise" and len({r // lws for r in ranks}) != 1:
            return f"shards on ranks {ranks} are not on one host (local world size {lws})"
        return None
    if any(b[1] != 0 or b[3] != dim for b in boxes):
        return "row blocks must span all columns"
    offs = [b[0] for b in boxes]
    if offs != sorted(offs):
        return "row blocks must be in row order"
    if st == "row_wise":
        want_ranks, n = list(range(world)), world
    else:
        host = ranks[0] // lws
        want_ranks, n = list(range(host * lws, host * lws + lws)), lws
    if ranks != want_ranks:
        return f"shards on ranks {ranks}, expected {want_ranks}"
    if tuple(b[2] for b in boxes) != row_blocks(rows, n):
        return (f"row blocks {[b[2] for b in boxes]} are not TorchRec's even blocks "
                f"{list(row_blocks(rows, n))} (uneven blocks run but give wrong results)")
    return None


def empty_row_shards(doc: Mapping[str, Any]) -> list[tuple[str, str, int, int]]:
    """``(module fqn, table, shard index, rank)`` of every row-wise or table-row-wise shard
    with no rows in a checked document (TorchRec's even blocks leave trailing ranks empty when
    a table has few rows: 5 rows on 4 ranks → 2, 2, 1, 0).

    FBGEMM 1.8.0's CPU table-batched kernel mishandles a 0-row table: alone in a kernel its
    forward raises ("must be a GPU or MTIA tensor"); followed by another table, that table's
    fused optimizer update is wrong (tests/sharding/test_torchrec_dmp.py shows both). The
    loader therefore refuses such plans for CPU placements.
    """
    out = []
    for fqn, tables in doc["plan"].items():
        for name, p in tables.items():
            if p["sharding_type"] in ("row_wise", "table_row_wise"):
                for k, s in enumerate(p["shards"]):
                    if s["shard_sizes"][0] == 0:
                        out.append((fqn, name, k, p["ranks"][k]))
    return out


def empty_shard_error(name: str, rank: int, *, source: str | None, field: str) -> SpecError:
    """The refusal of a CPU plan with an empty row shard (see :func:`empty_row_shards`)."""
    return SpecError(f"table {name!r} has an empty row shard on rank {rank}; FBGEMM 1.8.0's "
                     "CPU kernel fails or trains the next table wrongly with one",
                     source=source, field=field,
                     fix="give the table table_wise, column_wise or data_parallel, or plan on "
                         "fewer devices")
