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
(:func:`planner.export.torchrec_load.load_sharding_plan`).
:func:`~planner.export.torchrec_check.check_torchrec_plan` re-parses a document the way the
loader does: shards must tile each table exactly, row-wise
blocks must be TorchRec's even blocks (uneven ones run but give wrong results, formats.md
§2.10), table-row-wise shards must cover one host's ranks.
"""

from __future__ import annotations

from typing import Any, Mapping

from simulator.topology import load_topology

from planner.export.torchrec_check import check_torchrec_plan
from planner.export.torchrec_format import (
    FORMAT,
    MAX_WORLD,
    SCHEMA_VERSION,
    SHARDING_PLAN_FORMAT,
    TORCHREC_VERSION,
    context_sha256,
    placement,
)
from planner.export.torchrec_format import spec_error as _err
from planner.model.tables.shards import (
    ALL_SHARDING_TYPES,
    HUGECTR_TYPES,
    Shard,
    ShardingType,
    TableSharding,
    row_blocks,
    validate_sharding,
)

__all__ = ["export_torchrec_plan"]

_SHARDING_PLAN_VERSION = 1
_DEVICES = ("cpu", "cuda")


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
                       "use " + ", ".join(t.value for t in ALL_SHARDING_TYPES),
                       source) from None
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
    _check_document(doc, source)
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
    tables, entries = _entries(layouts, device, lws, world, source)
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


def _check_document(doc, source: str | None) -> None:
    """A sharding plan of this exporter's format version that its planner found valid."""
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


def _entries(layouts: list[TableSharding], device: str, lws: int, world: int,
             source: str | None) -> tuple[dict[str, list[int]], dict[str, Any]]:
    """Each table's ``[rows, dim]`` and its ``ParameterSharding`` entry; a layout TorchRec
    cannot run is an error naming it."""
    tables: dict[str, list[int]] = {}
    entries: dict[str, Any] = {}
    for i, ts in enumerate(layouts):
        rows, dim = _shape(ts)
        field = f"shards[{i}]"
        if ts.sharding_type in HUGECTR_TYPES:
            raise _err(f"table {ts.name!r} is {ts.sharding_type.value}, HugeCTR's layout, which "
                       "TorchRec has no sharding type for", field,
                       "export it with --to hugectr, or re-plan with a TorchRec planner "
                       "(greedy, mip, torchrec)", source)
        problems = validate_sharding(ts, rows, dim, world)
        if ts.sharding_type == ShardingType.TABLE_ROW_WISE:
            problems += _twrw_problems(ts, rows, lws)
        if problems:
            raise _err(f"table {ts.name!r} ({ts.sharding_type.value}): {problems[0]}", field,
                       "re-plan it; TorchRec runs only its own layouts (formats.md §2.2)",
                       source)
        tables[ts.name] = [rows, dim]
        entries[ts.name] = _entry(ts, device, lws, world)
    return tables, entries


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


