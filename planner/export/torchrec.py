"""A clusterplan sharding plan as TorchRec's plan, in a versioned JSON file (no torch needed).

``clusterplan plan TABLES --devices N --out plan.json`` writes a ``clusterplan.sharding-plan``;
:func:`export_torchrec_plan` turns it (or the :class:`~planner.model.tables.plan.Plan` a planner
returns) into a ``clusterplan.torchrec-plan`` document (formats.md §2.3)::

    {"format": "clusterplan.torchrec-plan", "schema_version": 1, "torchrec_version": "1.8.0",
     "world_size": 4, "local_world_size": 2, "device": "cpu",
     "context": {"tables": {"t0": [rows, dim], ...}, "batch_size": 4096,
                 "topology": "...", "model_sha256": "...", "sha256": "..."},
     "source": {"format": "clusterplan.sharding-plan", "planner": "mip", "task": "...",
                "valid": true, "max_cost_s": 0.0012},
     "plan": {"": {"t0": {"sharding_type": "row_wise", "compute_kernel": "fused",
                          "ranks": [0, 1, 2, 3],
                          "shards": [{"shard_offsets": [0, 0], "shard_sizes": [3, 16],
                                      "placement": "rank:0/cpu"}, ...]},
                   "t1": {"sharding_type": "data_parallel", "compute_kernel": "dense",
                          "ranks": [0, 1, 2, 3]}}}}

``plan`` has exactly the shape of TorchRec's ``ShardingPlan._serialize()["plan"]``: module FQN
(``""`` when the ``EmbeddingBagCollection`` itself is what ``DistributedModelParallel`` wraps,
else e.g. ``"sparse.ebc"``) → table name → sharding type, kernel, one rank per shard in shard
order, and the shards. Offsets and sizes are ``[row, column]`` in rows and columns (elements,
not bytes). Placements are ``rank:R/cpu`` or ``rank:R/cuda:(R mod local_world_size)``. A
data-parallel table has no ``shards`` (TorchRec's ``sharding_spec`` is ``None``) and the kernel
``dense``; every other table the kernel ``fused`` (FBGEMM's table-batched kernel with the
optimizer fused into backward).

``context.sha256`` hashes what the plan was made for (table shapes, world size, local world
size, batch size, topology); a loader recomputes it to detect a context edited by hand and
compares the tables and world size with the model it is given
(:func:`planner.export.torchrec_load.load_sharding_plan`). :func:`check_torchrec_plan`
re-parses a document the way the loader does: shards must tile each table exactly, row-wise
blocks must be TorchRec's even blocks (uneven ones run but give wrong results, formats.md
§2.10), table-row-wise shards must cover one host's ranks.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.model.tables.shards import (
    Shard,
    ShardingType,
    TableSharding,
    row_blocks,
    validate_sharding,
)

__all__ = ["FORMAT", "SCHEMA_VERSION", "TORCHREC_VERSION", "SHARDING_PLAN_FORMAT",
           "SUPPORTED_TYPES", "KERNELS", "export_torchrec_plan", "check_torchrec_plan",
           "context_sha256", "placement", "parse_placement", "table_shapes",
           "torchrec_plan_json", "is_sharding_plan", "empty_row_shards", "empty_shard_error"]

FORMAT = "clusterplan.torchrec-plan"
SCHEMA_VERSION = 1
#: the TorchRec release the format was checked against (formats.md §2.9)
TORCHREC_VERSION = "1.8.0"
SHARDING_PLAN_FORMAT = "clusterplan.sharding-plan"
_SHARDING_PLAN_VERSION = 1

#: sharding types the loader accepts (TorchRec's strings); grid_shard is not produced here
SUPPORTED_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise",
                   "table_row_wise", "data_parallel")
#: TorchRec's ``compute_kernel`` values (formats.md §2.1)
KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "quant", "quant_uvm",
           "quant_uvm_caching", "key_value", "customized_kernel", "ssd_virtual_table",
           "dram_virtual_table")
_DEVICES = ("cpu", "cuda")
_PLACEMENT = re.compile(r"^rank:(\d+)/(cpu|cuda(?::(\d+))?)$")
_FIX_EXPORT = "export it again with `clusterplan export PLAN.json --to torchrec`"
#: the most ranks a plan may have (the largest topology clusterplan builds)
MAX_WORLD = 262_144


def _err(msg: str, field: str, fix: str, source: str | None = None) -> SpecError:
    return SpecError(msg, source=source, field=field, fix=fix)


def is_sharding_plan(doc: Any) -> bool:
    """Whether ``doc`` is a clusterplan embedding sharding plan (not an LLM plan)."""
    return isinstance(doc, Mapping) and doc.get("format") == SHARDING_PLAN_FORMAT


def placement(rank: int, device: str, local_world_size: int) -> str:
    """TorchRec's remote-device string for ``rank``.

    >>> placement(3, "cpu", 2), placement(3, "cuda", 2)
    ('rank:3/cpu', 'rank:3/cuda:1')
    """
    if device == "cpu":
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/cuda:{rank % local_world_size}"


def parse_placement(text: Any) -> tuple[int, str] | None:
    """``"rank:3/cuda:1"`` → ``(3, "cuda")``; None when it is not a placement string."""
    m = _PLACEMENT.match(text) if isinstance(text, str) else None
    return (int(m.group(1)), m.group(2).split(":")[0]) if m else None


def context_sha256(tables: Mapping[str, Any], world_size: int, local_world_size: int,
                   batch_size: Any = None, topology: Any = None) -> str:
    """SHA-256 of the inputs a plan was made for (table shapes in name order, world size,
    local world size, batch size, topology), over canonical JSON."""
    canon = {"tables": {str(k): [int(v[0]), int(v[1])] for k, v in sorted(tables.items())},
             "world_size": int(world_size), "local_world_size": int(local_world_size),
             "batch_size": batch_size, "topology": topology}
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# clusterplan sharding plan → TorchRec plan

def _int(v: Any, field: str, source: str | None, *, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _err(f"{v!r} is not an integer ≥ {minimum}", field,
                   "regenerate the plan with `clusterplan plan TABLES --devices N --out "
                   "plan.json`", source)
    return v


def _read_layouts(doc: Mapping[str, Any], source: str | None) -> list[TableSharding]:
    """The layouts of a sharding-plan document, with every field checked."""
    entries = doc.get("shards")
    fix = "regenerate the plan with `clusterplan plan TABLES --devices N --out plan.json`"
    if not isinstance(entries, list) or not entries:
        raise _err("missing or empty (no tables)", "shards", fix, source)
    out, seen = [], set()
    for i, e in enumerate(entries):
        where = f"shards[{i}]"
        if not isinstance(e, Mapping):
            raise _err("not an object", where, fix, source)
        name = e.get("table")
        if not isinstance(name, str) or not name:
            raise _err(f"table name {name!r} is not a non-empty string", f"{where}.table", fix,
                       source)
        if name in seen:
            raise _err(f"table {name!r} appears twice", f"{where}.table",
                       "keep one layout per table", source)
        seen.add(name)
        try:
            st = ShardingType(e.get("sharding_type"))
        except ValueError:
            raise _err(f"unknown sharding type {e.get('sharding_type')!r}",
                       f"{where}.sharding_type",
                       "use " + ", ".join(t.value for t in ShardingType), source) from None
        raw = e.get("shards")
        if not isinstance(raw, list) or not raw:
            raise _err("missing or empty", f"{where}.shards", fix, source)
        shards = []
        for k, s in enumerate(raw):
            f = f"{where}.shards[{k}]"
            if not isinstance(s, Mapping):
                raise _err("not an object", f, fix, source)
            offs, sizes = s.get("offsets"), s.get("sizes")
            if not (isinstance(offs, list) and len(offs) == 2 and isinstance(sizes, list)
                    and len(sizes) == 2):
                raise _err("offsets and sizes must be [row, column] pairs", f, fix, source)
            shards.append(Shard(_int(s.get("rank"), f"{f}.rank", source),
                                _int(offs[0], f"{f}.offsets[0]", source),
                                _int(offs[1], f"{f}.offsets[1]", source),
                                _int(sizes[0], f"{f}.sizes[0]", source),
                                _int(sizes[1], f"{f}.sizes[1]", source)))
        host = e.get("host", -1)
        out.append(TableSharding(i, name, st, tuple(shards),
                                 host=host if isinstance(host, int) else -1))
    return out


def _shape(ts: TableSharding) -> tuple[int, int]:
    """A table's ``(rows, dim)`` from its shards' extent."""
    return (max(s.row_offset + s.rows for s in ts.shards),
            max(s.col_offset + s.cols for s in ts.shards))


def _local_world_size(doc: Mapping[str, Any], world: int, given: int | None,
                      layouts: list[TableSharding], source: str | None) -> int:
    """Ranks per host: given, else from the plan's topology (ranks 0..N-1), else from its
    table-row-wise layouts, else the world size (one host)."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1 or world % given:
            raise _err(f"local world size {given!r} does not divide the world size {world}",
                       "--local-world-size", "pass the number of ranks per host", source)
        return given
    topo = doc.get("topology")
    if isinstance(topo, str) and topo:
        try:
            t = load_topology(topo)
            per: dict[int, int] = {}
            for r in range(min(world, t.num_gpus)):
                per[t.node_of(r)] = per.get(t.node_of(r), 0) + 1
            sizes = set(per.values())
            if t.num_gpus >= world and len(sizes) == 1 and world % sizes.pop() == 0:
                return world // len(per)
        except Exception:                    # an unknown or custom topology: fall through
            pass
    twrw = {len(ts.shards) for ts in layouts if ts.sharding_type == ShardingType.TABLE_ROW_WISE}
    if len(twrw) == 1 and world % next(iter(twrw)) == 0:
        return next(iter(twrw))
    return world


def export_torchrec_plan(plan: Any, *, module_fqn: str = "", device: str | None = None,
                         local_world_size: int | None = None, source: str | None = None
                         ) -> dict[str, Any]:
    """A ``clusterplan.torchrec-plan`` document (see the module docstring) for ``plan``.

    Parameters
    ----------
    plan : Plan or dict
        A :class:`~planner.model.tables.plan.Plan` or the JSON ``clusterplan plan --out`` writes.
    module_fqn : str
        Where the ``EmbeddingBagCollection`` sits inside the module ``DistributedModelParallel``
        wraps (``""``: it is that module).
    device : {"cpu", "cuda"} or None
        Placement device; None: ``cpu`` for a plan made for a CPU topology, else ``cuda``.
    local_world_size : int or None
        Ranks per host; None: from the plan's topology.
    source : str or None
        The file the plan came from (named in errors).

    Raises :class:`SpecError` (field and fix named) when the plan is not a sharding plan of
    format version 1 or a layout is not one TorchRec can run.
    """
    doc = plan.to_dict(stable=True) if hasattr(plan, "to_dict") else plan
    if not isinstance(doc, Mapping):
        raise _err(f"expected a JSON object, got {type(doc).__name__}", "(top level)",
                   "pass the file written by `clusterplan plan TABLES --devices N --out "
                   "plan.json`", source)
    if doc.get("format") != SHARDING_PLAN_FORMAT:
        what = "an LLM plan" if doc.get("kind") == "llm-plan" else repr(doc.get("format"))
        raise _err(f"format is {what}, not an embedding sharding plan ({SHARDING_PLAN_FORMAT})",
                   "format", "export a plan written by `clusterplan plan TABLES --devices N "
                   "--out plan.json` (LLM plans go --to torchtitan, megatron or deepspeed)",
                   source)
    if doc.get("format_version") != _SHARDING_PLAN_VERSION:
        raise _err(f"format_version {doc.get('format_version')!r} is not supported (this "
                   f"exporter reads {_SHARDING_PLAN_VERSION})", "format_version",
                   "regenerate the plan with this version of clusterplan", source)
    if doc.get("valid") is False:
        problems = "; ".join(str(x) for x in (doc.get("problems") or [])[:3])
        raise _err(f"the plan is not valid ({problems or 'see its problems'}): a trainer "
                   "cannot run it", "valid", "re-plan with more devices, --memory or other "
                   "sharding types", source)
    world = _int(doc.get("devices"), "devices", source, minimum=1)
    if world > MAX_WORLD:
        raise _err(f"{world} devices, above {MAX_WORLD:,}", "devices",
                   "regenerate the plan with `clusterplan plan`", source)
    if not isinstance(module_fqn, str) or (module_fqn and not all(
            part.isidentifier() for part in module_fqn.split("."))):
        raise _err(f"module path {module_fqn!r} is not a dotted attribute path",
                   "--module-fqn", "pass e.g. sparse.ebc, or nothing when the "
                   "EmbeddingBagCollection is the wrapped module", source)
    layouts = _read_layouts(doc, source)
    lws = _local_world_size(doc, world, local_world_size, layouts, source)
    if device is None:
        device = "cpu" if doc.get("gpu") == "cpu" else "cuda"
    if device not in _DEVICES:
        raise _err(f"device {device!r} is not cpu or cuda", "--device", "use cpu or cuda",
                   source)
    task = doc.get("task") if isinstance(doc.get("task"), Mapping) else {}
    tables: dict[str, list[int]] = {}
    entries: dict[str, Any] = {}
    for i, ts in enumerate(layouts):
        rows, dim = _shape(ts)
        field = f"shards[{i}]"
        problems = validate_sharding(ts, rows, dim, world)
        if ts.sharding_type == ShardingType.TABLE_ROW_WISE:
            problems += _twrw_problems(ts, rows, lws)
        if problems:
            raise _err(f"table {ts.name!r} ({ts.sharding_type.value}): {problems[0]}", field,
                       "re-plan it; TorchRec runs only its own layouts (formats.md §2.2)",
                       source)
        tables[ts.name] = [rows, dim]
        entries[ts.name] = _entry(ts, device, lws, world)
    context = {"tables": tables, "batch_size": task.get("batch_size"),
               "topology": doc.get("topology"), "model_sha256": task.get("sha256")}
    context["sha256"] = context_sha256(tables, world, lws, context["batch_size"],
                                       context["topology"])
    out = {"format": FORMAT, "schema_version": SCHEMA_VERSION,
           "torchrec_version": TORCHREC_VERSION, "world_size": world,
           "local_world_size": lws, "device": device, "context": context,
           "source": {"format": SHARDING_PLAN_FORMAT, "planner": doc.get("planner"),
                      "task": task.get("name"), "valid": doc.get("valid"),
                      "max_cost_s": doc.get("max_cost_s")},
           "plan": {module_fqn: entries}}
    check_torchrec_plan(out, source=source)        # re-parse our own output, as the loader will
    return out


def _twrw_problems(ts: TableSharding, rows: int, lws: int) -> list[str]:
    ranks = [s.rank for s in ts.shards]
    host = ranks[0] // lws
    want = list(range(host * lws, host * lws + lws))
    if ranks != want:
        return [f"table_row_wise shards on ranks {ranks}, not one host's ranks {want} "
                f"(local world size {lws})"]
    if tuple(s.rows for s in ts.shards) != row_blocks(rows, lws):
        return [f"row blocks are not TorchRec's even blocks over {lws} ranks"]
    return []


def _entry(ts: TableSharding, device: str, lws: int, world: int) -> dict[str, Any]:
    if ts.sharding_type == ShardingType.DATA_PARALLEL:
        return {"sharding_type": "data_parallel", "compute_kernel": "dense",
                "ranks": list(range(world))}
    return {"sharding_type": ts.sharding_type.value, "compute_kernel": "fused",
            "ranks": [s.rank for s in ts.shards],
            "shards": [{"shard_offsets": [s.row_offset, s.col_offset],
                        "shard_sizes": [s.rows, s.cols],
                        "placement": placement(s.rank, device, lws)} for s in ts.shards]}


_NUMBER_LIST = re.compile(r"\[([-\d,\s]+)\]")
_SMALL_OBJECT = re.compile(r"\{\n\s*([^{}]*?)\n\s*\}")


def torchrec_plan_json(doc: Mapping[str, Any]) -> str:
    """The document as JSON text: indented, lists of numbers on one line, a trailing newline."""
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(","))
                            + "]", text)
    text = _SMALL_OBJECT.sub(_one_line, text)
    return text + "\n"


def _one_line(m: re.Match) -> str:
    lines = [x.strip() for x in m.group(1).split("\n")]
    if len(lines) > 4 or any(x.endswith("[") for x in lines):
        return m.group(0)
    return "{" + " ".join(lines) + "}"


# ---------------------------------------------------------------------------------------------
# checks (shared with the loader)

def table_shapes(doc: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``{table: (rows, dim)}`` of a checked ``clusterplan.torchrec-plan`` document."""
    return {k: (int(v[0]), int(v[1])) for k, v in doc["context"]["tables"].items()}


def check_torchrec_plan(doc: Any, source: str | None = None) -> dict[str, Any]:
    """Check a ``clusterplan.torchrec-plan`` document; return it. Every failure is a
    :class:`SpecError` naming the field (``plan."".t3.shards[1].shard_sizes``) and the fix."""
    if not isinstance(doc, Mapping):
        raise _err(f"expected a JSON object, got {type(doc).__name__}", "(top level)",
                   _FIX_EXPORT, source)
    if doc.get("format") != FORMAT:
        raise _err(f"format is {doc.get('format')!r}, not {FORMAT!r}", "format",
                   _FIX_EXPORT + " (a clusterplan.sharding-plan must be exported first)"
                   if doc.get("format") == SHARDING_PLAN_FORMAT else _FIX_EXPORT, source)
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise _err(f"schema_version {doc.get('schema_version')!r} is not supported (this "
                   f"loader reads {SCHEMA_VERSION})", "schema_version",
                   "export it again with this version of clusterplan", source)
    world = doc.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or not 1 <= world <= MAX_WORLD:
        raise _err(f"{world!r} is not an integer in 1..{MAX_WORLD:,}", "world_size",
                   _FIX_EXPORT, source)
    lws = doc.get("local_world_size")
    if isinstance(lws, bool) or not isinstance(lws, int) or lws < 1 or world % lws:
        raise _err(f"{lws!r} does not divide world_size {world}", "local_world_size",
                   _FIX_EXPORT, source)
    ctx = doc.get("context")
    if not isinstance(ctx, Mapping) or not isinstance(ctx.get("tables"), Mapping):
        raise _err("missing or not an object with a tables map", "context", _FIX_EXPORT,
                   source)
    for name, shp in ctx["tables"].items():
        if not (isinstance(shp, list) and len(shp) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in shp)):
            raise _err(f"{shp!r} is not [rows, dim] with both ≥ 1", f"context.tables.{name}",
                       _FIX_EXPORT, source)
    want = context_sha256(ctx["tables"], world, lws, ctx.get("batch_size"), ctx.get("topology"))
    if ctx.get("sha256") != want:
        raise _err("does not match the tables, world size, batch size and topology of the "
                   "file (edited by hand?)", "context.sha256", _FIX_EXPORT, source)
    plan = doc.get("plan")
    if not isinstance(plan, Mapping) or not plan:
        raise _err("missing or empty", "plan", _FIX_EXPORT, source)
    shapes = table_shapes(doc)
    seen: set[str] = set()
    for fqn, tables in plan.items():
        where = f"plan.{json.dumps(fqn)}" if fqn == "" else f"plan.{fqn}"
        if not isinstance(tables, Mapping) or not tables:
            raise _err("missing or empty table map", where, _FIX_EXPORT, source)
        for name, p in tables.items():
            f = f"{where}.{name}"
            if name not in shapes:
                raise _err(f"table {name!r} is not in context.tables", f, _FIX_EXPORT, source)
            if name in seen:
                raise _err(f"table {name!r} is planned twice", f, "keep one entry per table",
                           source)
            seen.add(name)
            _check_entry(p, f, shapes[name], world, lws, source)
    missing = sorted(set(shapes) - seen)
    if missing:
        raise _err(f"tables {missing} are in context.tables but not planned", "plan",
                   _FIX_EXPORT, source)
    return dict(doc)


def _check_entry(p: Any, f: str, shape: tuple[int, int], world: int, lws: int,
                 source: str | None) -> None:
    if not isinstance(p, Mapping):
        raise _err("not an object", f, _FIX_EXPORT, source)
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
                   _FIX_EXPORT, source)
    rows, dim = shape
    if st == "data_parallel":
        if p.get("shards") is not None:
            raise _err("data_parallel has no shards (a full replica on every rank)",
                       f"{f}.shards", "drop the shards member", source)
        if ranks != list(range(world)):
            raise _err(f"data_parallel ranks {ranks} are not 0..{world - 1}", f"{f}.ranks",
                       _FIX_EXPORT, source)
        return
    shards = p.get("shards")
    if not isinstance(shards, list) or not shards:
        raise _err("missing or empty", f"{f}.shards", _FIX_EXPORT, source)
    if len(ranks) != len(shards):
        raise _err(f"{len(ranks)} ranks for {len(shards)} shards (one rank per shard, in shard "
                   "order)", f"{f}.ranks", _FIX_EXPORT, source)
    boxes = []
    for k, s in enumerate(shards):
        g = f"{f}.shards[{k}]"
        if not isinstance(s, Mapping):
            raise _err("not an object", g, _FIX_EXPORT, source)
        for key in ("shard_offsets", "shard_sizes"):
            v = s.get(key)
            if not (isinstance(v, list) and len(v) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
                raise _err(f"{v!r} is not [row, column] with both ≥ 0", f"{g}.{key}",
                           _FIX_EXPORT, source)
        pl = parse_placement(s.get("placement"))
        if pl is None or pl[0] != ranks[k]:
            raise _err(f"placement {s.get('placement')!r} is not rank:{ranks[k]}/cpu or "
                       f"rank:{ranks[k]}/cuda:N (ranks[{k}] is {ranks[k]})", f"{g}.placement",
                       _FIX_EXPORT, source)
        (r0, c0), (nr, nc) = s["shard_offsets"], s["shard_sizes"]
        if r0 + nr > rows or c0 + nc > dim:
            raise _err(f"shard [{r0}:{r0 + nr}, {c0}:{c0 + nc}] lies outside the table "
                       f"[{rows}, {dim}]", f"{g}.shard_sizes", _FIX_EXPORT, source)
        boxes.append((r0, c0, nr, nc, ranks[k]))
    problem = _layout_problem(st, boxes, rows, dim, world, lws)
    if problem:
        raise _err(f"{st}: {problem}", f"{f}.shards",
                   "use TorchRec's layout (formats.md §2.2); " + _FIX_EXPORT, source)
    problem = _tiling_problem(boxes, rows, dim, by_rows=st in ("row_wise", "table_row_wise"))
    if problem:
        raise _err(problem, f"{f}.shards", _FIX_EXPORT, source)


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
