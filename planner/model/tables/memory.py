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

from planner.model.tables.shards import HUGECTR_TYPES, ShardingType, row_blocks
from planner.model.tables.spec import ModelSpec, TableSpec

__all__ = ["optimizer_state_bytes", "shard_memory_bytes", "device_capacity_bytes",
           "min_device_bytes", "table_bytes"]



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
    row-wise and table-row-wise use TorchRec's even blocks over ``world`` / ``host_size`` ranks,
    HugeCTR's subset- and hierarchical-row-wise their widest subset, all ``world`` ranks.
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
    if t in (ShardingType.ROW_WISE,) + HUGECTR_TYPES:
        return shard_memory_bytes(table, row_blocks(rows, world)[0], dim, t, optimizer)
    if t == ShardingType.TABLE_ROW_WISE:
        if host_size < 2:
            return None
        return shard_memory_bytes(table, row_blocks(rows, host_size)[0], dim, t, optimizer)
    return shard_memory_bytes(table, rows, dim, t, optimizer)
