"""Whether a table set can fit on the devices at all, and what to change when it cannot.

Planners call :func:`check_feasible` before searching, so an impossible task fails at once with
one message naming each table that fits nowhere, its size, the largest device and the fix.
"""

from __future__ import annotations

import math
from typing import Sequence

from simulator.errors import SpecError
from simulator.units import format_bytes

from planner.model.tables.memory import min_device_bytes, shard_memory_bytes, table_bytes
from planner.model.tables.shards import ShardingType
from planner.model.tables.task import Problem

__all__ = ["InfeasibleError", "check_feasible"]

_TYPE_WORDS = {ShardingType.TABLE_WISE: "table-wise", ShardingType.COLUMN_WISE: "column-wise",
               ShardingType.ROW_WISE: "row-wise", ShardingType.TABLE_ROW_WISE: "table-row-wise",
               ShardingType.DATA_PARALLEL: "data-parallel",
               ShardingType.SUBSET_ROW_WISE: "subset-row-wise",
               ShardingType.HIERARCHICAL_ROW_WISE: "hierarchical-row-wise"}


class InfeasibleError(SpecError):
    """Some tables fit on no device with the allowed sharding types, or all do not fit together.

    ``tables`` lists ``(index, name, bytes)`` of each table that fits nowhere.
    """

    def __init__(self, message: str, *, source: str | None, field: str | None, fix: str,
                 tables: Sequence[tuple[int, str, int]] = ()) -> None:
        super().__init__(message, source=source, field=field, fix=fix)
        self.tables = tuple(tables)


def check_feasible(problem: Problem, types: Sequence[ShardingType]) -> None:
    """Raise :class:`InfeasibleError` when the plan cannot fit, whatever the placement.

    ``types`` are the sharding types the planner will use (before each table's own allowed
    types are applied). Checks each table alone (its smallest footprint under its allowed
    types against the largest device), then the total (the sum of the smallest footprints
    against the sum of the capacities). The message names each table, its size, the largest
    device and the fix: the sharding type to allow, or how many devices would be needed.
    """
    model = problem.model
    n = problem.devices
    cap = max(problem.capacity_bytes)
    gpu = problem.topology.gpu.name
    opt = model.optimizer
    host = max(len(h) for h in problem.hosts)
    bad = []
    descs = []
    fixes = []
    smallest = []
    for i, t in enumerate(model.tables):
        usable = [s for s in types if problem.allowed(i, s)]
        sizes = {s: min_device_bytes(t, s, opt, n, host) for s in usable}
        sizes = {s: v for s, v in sizes.items() if v is not None}
        best = min(sizes.values()) if sizes else None
        if sizes and set(sizes) == {ShardingType.DATA_PARALLEL}:
            smallest.append(n * sizes[ShardingType.DATA_PARALLEL])
        else:
            smallest.append(table_bytes(t, opt))     # shards of one copy add up to the table
        if best is not None and best <= cap:
            continue
        full = table_bytes(t, opt)
        what = (f"table {t.name!r} ({t.num_embeddings:,} rows × {t.embedding_dim} × "
                f"{t.precision}, {opt} state: {format_bytes(full)}")
        if sizes:
            kinds = ", ".join(f"{_TYPE_WORDS[s]} {format_bytes(v)}" for s, v in sizes.items())
            what += f"; smallest per device: {kinds})"
        else:
            what += "; no allowed sharding type applies)"
        bad.append((i, t.name, full))
        descs.append(what)
        fixes.append(_fix_for(t, sizes, types, opt, n, host, cap))
    if bad:
        msg = (f"{len(bad)} table(s) fit on no device (largest device: {format_bytes(cap)} for "
               f"embeddings on {gpu}): " + "; ".join(descs[:4]))
        if len(bad) > 4:
            msg += f"; and {len(bad) - 4} more"
        raise InfeasibleError(msg, source=model.source or model.name,
                              field=f"tables[{bad[0][0]}]", fix="; ".join(dict.fromkeys(fixes)),
                              tables=bad)
    need_total = sum(smallest)
    have = sum(problem.capacity_bytes)
    if need_total > have:
        per = have / n
        more = math.ceil(need_total / per) if per > 0 else 0
        raise InfeasibleError(
            f"the {model.num_tables} tables need at least {format_bytes(need_total)} but "
            f"{n} devices hold {format_bytes(have)} for embeddings", source=model.source or
            model.name, field="tables",
            fix=f"use ≥ {more} devices, fp16 weights, or an optimizer with less state")


def _fix_for(t, sizes: dict, types: Sequence[ShardingType], opt: str, n: int, host: int,
             cap: float) -> str:
    """What would let table ``t`` fit a device of ``cap`` bytes: a type the user ruled out, or
    one this planner does not use; else row-wise over more devices, fp16 weights or less
    optimizer state."""
    words = {ShardingType.ROW_WISE: "row-wise", ShardingType.COLUMN_WISE: "column-wise",
             ShardingType.TABLE_ROW_WISE: "table-row-wise"}
    for s, word in words.items():
        if s in sizes:
            continue
        v = min_device_bytes(t, s, opt, n, host)
        if v is None or v > cap:
            continue
        if s in types:
            return (f"allow {word} for {t.name!r} ({format_bytes(v)} per device on "
                    f"{n} devices; --sharding-types or the table's sharding_types)")
        return (f"use a planner with {word} sharding for {t.name!r} "
                f"({format_bytes(v)} per device; --planner greedy or mip)")
    if cap <= 0:
        return "give the devices memory (--memory) or use a GPU with more HBM"
    # row-wise over more devices: the smallest footprint scales with 1/N
    per_row = shard_memory_bytes(t, 1, t.embedding_dim, ShardingType.ROW_WISE, opt)
    need = math.ceil(t.num_embeddings * per_row / cap)
    rw = "" if ShardingType.ROW_WISE in sizes else "allow row-wise and "
    return (f"{rw}use ≥ {need} devices, fp16 weights, or an optimizer with less state for "
            f"{t.name!r}")
