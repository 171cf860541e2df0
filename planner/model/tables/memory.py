"""Memory per shard and per device, and a readable report when tables cannot fit.

Bytes of one shard of ``rows × cols`` (weights at the table's precision ``p`` bytes):

- weights ``rows · cols · p``;
- optimizer state: SGD 0; Adam 2× the weights (two moments); Adagrad 1×; row-wise Adagrad
  ``rows · 4`` (one fp32 accumulator per row) — TorchRec's storage multipliers;
- data-parallel tables are full replicas on every rank, updated by a dense kernel, so they also
  hold a dense fp32 gradient of the whole table (``rows · dim · 4``).

A device's capacity for embeddings is its HBM less a reserve: ``reserve_fraction`` (15%, as
TorchRec's heuristic reservation) of HBM plus the dense model's parameters, gradients and optimizer
state (fp32, 16 bytes per parameter with Adam-like state), unless the task gives
``memory_bytes`` explicitly.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from simulator.errors import SpecError
from simulator.units import format_bytes

from planner.model.tables.shards import ShardingType, row_blocks
from planner.model.tables.spec import ModelSpec, TableSpec

if TYPE_CHECKING:
    from planner.model.tables.task import Problem

__all__ = ["optimizer_state_bytes", "shard_memory_bytes", "device_capacity_bytes",
           "min_device_bytes", "InfeasibleError", "check_feasible", "table_bytes"]

_TYPE_WORDS = {ShardingType.TABLE_WISE: "table-wise", ShardingType.COLUMN_WISE: "column-wise",
               ShardingType.ROW_WISE: "row-wise", ShardingType.TABLE_ROW_WISE: "table-row-wise",
               ShardingType.DATA_PARALLEL: "data-parallel"}


def optimizer_state_bytes(rows: int, cols: int, weight_bytes: int, optimizer: str) -> int:
    """Optimizer state of a ``rows × cols`` block whose weights take ``weight_bytes``."""
    if optimizer == "sgd":
        return 0
    if optimizer == "adam":
        return 2 * weight_bytes
    if optimizer == "adagrad":
        return weight_bytes
    if optimizer == "rowwise_adagrad":
        return rows * 4
    raise ValueError(f"unknown optimizer {optimizer!r}")


def shard_memory_bytes(table: TableSpec, rows: int, cols: int, sharding_type: ShardingType,
                       optimizer: str) -> int:
    """Bytes one shard of ``rows × cols`` of ``table`` takes on its rank."""
    w = rows * cols * table.bytes_per_element
    total = w + optimizer_state_bytes(rows, cols, w, optimizer)
    if sharding_type == ShardingType.DATA_PARALLEL:
        total += rows * cols * 4
    return total


def table_bytes(table: TableSpec, optimizer: str) -> int:
    """The whole table with its optimizer state (its table-wise footprint)."""
    return shard_memory_bytes(table, table.num_embeddings, table.embedding_dim,
                              ShardingType.TABLE_WISE, optimizer)


def device_capacity_bytes(hbm_bytes: int, model: ModelSpec, *, reserve_fraction: float = 0.15
                          ) -> int:
    """HBM available to embedding shards: HBM × (1 − reserve) − the dense model's state."""
    dense = 0
    if model.dense is not None:
        dims = [t.embedding_dim for t in model.tables]
        dense = model.dense.param_count(dims) * 16
    return max(0, int(hbm_bytes * (1.0 - reserve_fraction)) - dense)


def min_device_bytes(table: TableSpec, t: ShardingType, optimizer: str, world: int,
                     host_size: int) -> int | None:
    """The smallest per-device footprint of ``table`` under type ``t`` (None: not possible).

    Column-wise spreads blocks of 4 columns as evenly as possible over all ``world`` ranks;
    row-wise and table-row-wise use TorchRec's even blocks over ``world`` / ``host_size`` ranks.
    """
    rows, dim = table.num_embeddings, table.embedding_dim
    if t == ShardingType.TABLE_WISE:
        return shard_memory_bytes(table, rows, dim, t, optimizer)
    if t == ShardingType.COLUMN_WISE:
        if dim % 4 or dim < 8 or world < 2:
            return None
        units = dim // 4
        cols = 4 * math.ceil(units / min(world, units))
        return shard_memory_bytes(table, rows, cols, t, optimizer)
    if t == ShardingType.ROW_WISE:
        return shard_memory_bytes(table, row_blocks(rows, world)[0], dim, t, optimizer)
    if t == ShardingType.TABLE_ROW_WISE:
        if host_size < 2:
            return None
        return shard_memory_bytes(table, row_blocks(rows, host_size)[0], dim, t, optimizer)
    return shard_memory_bytes(table, rows, dim, t, optimizer)


class InfeasibleError(SpecError):
    """Some tables fit on no device with the allowed sharding types, or all do not fit together.

    ``tables`` lists ``(index, name, bytes)`` of each table that fits nowhere.
    """

    def __init__(self, message: str, *, source: str | None, field: str | None, fix: str,
                 tables: Sequence[tuple[int, str, int]] = ()) -> None:
        super().__init__(message, source=source, field=field, fix=fix)
        self.tables = tuple(tables)


def check_feasible(problem: "Problem", types: Sequence[ShardingType]) -> None:
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
        # what would help: a type the user ruled out, or one this planner does not use
        help_ = []
        words = {ShardingType.ROW_WISE: "row-wise", ShardingType.COLUMN_WISE: "column-wise",
                 ShardingType.TABLE_ROW_WISE: "table-row-wise"}
        for s, word in words.items():
            if s in sizes:
                continue
            v = min_device_bytes(t, s, opt, n, host)
            if v is None or v > cap:
                continue
            if s in types:
                help_.append(f"allow {word} for {t.name!r} ({format_bytes(v)} per device on "
                             f"{n} devices; --sharding-types or the table's sharding_types)")
            else:
                help_.append(f"use a planner with {word} sharding for {t.name!r} "
                             f"({format_bytes(v)} per device; --planner greedy or mip)")
            break
        if not help_:
            # row-wise over more devices: the smallest footprint scales with 1/N
            per_row = shard_memory_bytes(t, 1, t.embedding_dim, ShardingType.ROW_WISE, opt)
            need = math.ceil(t.num_embeddings * per_row / cap) if cap > 0 else 0
            if cap <= 0:
                help_.append("give the devices memory (--memory) or use a GPU with more HBM")
            else:
                rw = "" if ShardingType.ROW_WISE in sizes else "allow row-wise and "
                help_.append(f"{rw}use ≥ {need} devices, fp16 weights, or an optimizer with "
                             f"less state for {t.name!r}")
        fixes.append(help_[0])
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

