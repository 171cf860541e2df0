"""Seconds of one embedding shard's lookups on its rank, forward and backward.

Notation as in :mod:`.cost`: ``B`` global batch, ``b = B / n`` local batch, a table with ``R``
rows, pooling factor ``L`` (ids per sample), weight precision ``p`` bytes, pooled-output
precision ``o`` bytes, lookup bandwidth ``H`` (HBM × ``hbm_efficiency``, or the CPU profile's).

**Ids and outputs** (:func:`shard_traffic`). A table-wise or column-wise shard of ``c`` columns
serves all ``B·L`` ids of the global batch; a row-wise block of ``r`` rows serves ``B·L·r/R`` of
them (ids spread over rows in proportion to the block, i.e. hashing spreads hot rows evenly);
a data-parallel replica serves its local ``b·L``. ``outputs`` is ``B`` pooled rows (``b`` for
data-parallel).

**Forward** (:func:`shard_lookup_s`) ::

    ids · (miss · c·p  +  overhead  +  id_bytes)  +  outputs · (c·o  +  bag)
    ------------------------------------------------------------------------  +  shard_overhead_s
                                       H

``overhead`` (64 B) is a per-lookup cost TorchRec omits (index load, offset arithmetic, one
memory transaction of latency), so a lookup into a 4-wide table is not 32× cheaper than one
into a 128-wide table; ``bag`` (``bag_bytes``, 0 but on a CPU profile) is a per-output cost,
which a pooling-1 table pays on every id.
**Cache-hit discount** (:func:`miss_ratio`): the table's access distribution gives ``u`` =
distinct rows / lookups (``1 / accesses_per_row``, from its 17 reuse bins or its Zipf
exponent, and never fewer than ``lookups / R``: :func:`table_accesses_per_row`); a first touch
always reads HBM, a repeat hits L2 with probability ``repeat_hit_ratio`` ``h`` (0.8), so
``miss = u + (1 − u)(1 − h)``. A first touch can also pay address translation:
``row_walk_bytes · log2(shard bytes / page_reach_bytes)`` per distinct row (0 on GPUs; fitted
for CPUs, where a page walk per distinct row of a large table is measurable).

**Backward** = ``backward_multiplier`` (2, TorchRec's) × the forward lookup time, unless the
device has measured backward terms (the CPU profile; a GPU's fused-lookup file,
:mod:`.gpu_lookup`): then its own terms, per id (the sort), per id and column (the gradient
gather), per distinct row and column (the update), per distinct row's page walk, per output
and column (each bag's gradient row read once) (:class:`.cpu_profile.BackwardTerms`)
+ the optimizer's state traffic (read and write the state of each distinct row touched:
:func:`state_bytes_per_row`) + ``shard_overhead_s``. A data-parallel table instead gets a
dense gradient and updates the whole table (weights, gradient and state streamed once).

**Sparse gradients** (the trainer's ``embedding_update: sparse_grad`` or ``scatter_add``,
:class:`SparseGradPath`: the framework's own embedding backward, as DeepLearningExamples'
PyTorch and TensorFlow 2 DLRMs run it). The lookup writes its rows in the weights' precision
``p``, and a narrower embedding output is a cast kernel of its own (``outputs · c · (p + o)``
streamed, forward, and the same for its gradient's cast back). The backward builds a gradient
with one row per id (PyTorch's ``embedding_sparse_backward`` COO tensor, TensorFlow's
``IndexedSlices``; neither merges repeated ids; with pooling above 1 each bag's gradient row is
copied to its ids, ``(ids + outputs) · c · p``, except under ``scatter_add``, where
distributed-embeddings' variable-hotness gradient op merges them into one row per distinct id
as below). A scaling pass rewrites its values
(``2 · ids · c · p``): an fp16 loss scale's unscale (PyTorch's GradScaler, Keras'
LossScaleOptimizer), and under ``scatter_add`` also TensorFlow's SGD, which scatters ``−lr · g``
(the unscale and that product one XLA fusion). An optimizer with state first merges repeated
ids (PyTorch's ``coalesce``, TensorFlow's ``_deduplicate_indexed_slices``): the ids sorted,
``ids · s`` with ``s`` the byte-equivalents per int64 index of PyTorch's sort-based
``index_put_`` measured on an H200 (:data:`.dense.INDEX_PUT_BYTES`), and each id's gradient
row summed into its distinct row, ``(ids + unique) · c · p``, streamed; SGD adds the unmerged gradient as it is
(``index_add_``, ``resource_scatter_add``). The add streams the values once and reads and
writes back the rows it updates, at the lookup bandwidth: every id's row read as the forward
reads it and each distinct row written, or with merged ids each distinct row read from memory
and written. Streamed passes run at ``stream_Bps``, the device's memory bandwidth for large
elementwise ops.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.model.tables.access import accesses_per_row, default_reuse_bins, zipf_reuse
from planner.model.tables.cost_config import CostConfig
from planner.model.tables.dense import INDEX_PUT_BYTES
from planner.model.tables.shards import ROW_SPLIT_TYPES, ShardingType
from planner.model.tables.spec import TableSpec

__all__ = ["table_accesses_per_row", "miss_ratio", "shard_traffic", "shard_lookup_s",
           "state_bytes_per_row", "SparseGradPath"]


@dataclass(frozen=True, slots=True)
class SparseGradPath:
    """A framework's sparse-gradient embedding path (module docstring): ``stream_Bps`` the
    device's bandwidth for large streamed elementwise passes, bytes/s; ``scale_pass`` whether
    a pass rewrites the gradient's values before the optimizer (a loss scale's unscale, or
    TensorFlow's ``−lr · g``); ``dedup`` whether the optimizer merges repeated ids first (an
    optimizer with state); ``merged_bags`` whether a multi-hot table's backward writes one
    row per distinct id (distributed-embeddings' variable-hotness gradient op under
    TensorFlow) rather than one per id."""

    stream_Bps: float
    scale_pass: bool
    dedup: bool = False
    merged_bags: bool = False


def table_accesses_per_row(t: TableSpec, batch: float) -> float:
    """Accesses per distinct row of ``t`` in one global batch of ``batch`` samples
    (≥ lookups / rows, ≥ 1)."""
    lookups = batch * t.pooling_factor
    if lookups <= 0:
        return 1.0
    if t.zipf_exponent is not None:
        apr = zipf_reuse(float(t.zipf_exponent), t.num_embeddings, float(lookups))[1]
    else:
        apr = accesses_per_row(t.reuse_bins if t.reuse_bins is not None
                               else default_reuse_bins())
    return max(1.0, apr, lookups / t.num_embeddings)


def miss_ratio(apr: float, repeat_hit_ratio: float) -> float:
    """Share of lookups that read memory: every first touch (``1 / apr``) and the repeats
    that miss the cache."""
    u = 1.0 / apr
    return u + (1.0 - u) * (1.0 - repeat_hit_ratio)


def shard_traffic(t: TableSpec, rows: int, st: ShardingType, batch: float,
                  local_batch: float) -> tuple[float, float]:
    """(ids looked up, pooled outputs) of one shard of ``rows`` rows per step."""
    if st == ShardingType.DATA_PARALLEL:
        return local_batch * t.pooling_factor, local_batch
    if st in ROW_SPLIT_TYPES:
        return batch * t.pooling_factor * rows / t.num_embeddings, batch
    return batch * t.pooling_factor, batch


def state_bytes_per_row(optimizer: str, t: TableSpec, cols: int) -> float:
    """Optimizer state of one row's ``cols`` columns, bytes: Adam 2·c·p, Adagrad c·p,
    row-wise Adagrad 4 (one fp32), SGD none."""
    if optimizer == "adam":
        return 2.0 * cols * t.bytes_per_element
    if optimizer == "adagrad":
        return 1.0 * cols * t.bytes_per_element
    if optimizer == "rowwise_adagrad":
        return 4.0
    return 0.0


def shard_lookup_s(t: TableSpec, rows: int, cols: int, st: ShardingType, *, ids: float,
                   outputs: float, apr: float, cfg: CostConfig, Bps: float, out_bytes: float,
                   element_bytes: float, optimizer: str,
                   sparse: SparseGradPath | None = None) -> tuple[float, float]:
    """(forward, backward) seconds of one shard's lookups on its rank (module docstring):
    ``apr`` its table's accesses per distinct row, ``Bps`` the lookup bandwidth (bytes/s),
    ``out_bytes`` the pooled-output precision and ``element_bytes`` a weight element's cost
    in the lookup terms (bytes); ``sparse``: the trainer's sparse-gradient path (a
    data-parallel replica keeps its dense gradient)."""
    p = t.bytes_per_element
    unique = min(ids / apr, rows)
    walk = math.log2(max(1.0, rows * cols * p / cfg.page_reach_bytes)) if rows else 0.0
    gather = ids * (miss_ratio(apr, cfg.repeat_hit_ratio) * cols * element_bytes
                    + cfg.lookup_overhead_bytes + cfg.id_bytes)
    if cfg.row_walk_bytes > 0 and rows > 0:
        gather += unique * cfg.row_walk_bytes * walk
    fwd = (gather + outputs * (cols * out_bytes + cfg.bag_bytes)) / Bps + cfg.shard_overhead_s
    if cfg.backward is not None:
        bwd = cfg.backward.variable_bytes(ids, unique, cols, t.precision != "fp32", walk,
                                          outputs) / Bps + cfg.backward.shard_s
    else:
        bwd = cfg.backward_multiplier * (fwd - cfg.shard_overhead_s) + cfg.shard_overhead_s
    state = state_bytes_per_row(optimizer, t, cols)
    if sparse is not None and st != ShardingType.DATA_PARALLEL:
        fwd, bwd = _sparse_grad_s(t, cols, ids=ids, outputs=outputs, unique=unique,
                                  gather=gather, cfg=cfg, Bps=Bps, out_bytes=out_bytes,
                                  path=sparse)
    if st == ShardingType.DATA_PARALLEL:
        bwd += (rows * cols * (2 * p + 2 * 4) + 2 * state * rows) / Bps
    else:
        bwd += 2 * unique * state / Bps
    return fwd, bwd


def _sparse_grad_s(t: TableSpec, cols: int, *, ids: float, outputs: float, unique: float,
                   gather: float, cfg: CostConfig, Bps: float, out_bytes: float,
                   path: SparseGradPath) -> tuple[float, float]:
    """(forward, backward) seconds of one shard on PyTorch's sparse-gradient path, before the
    optimizer state's traffic (module docstring); ``gather`` the bytes of reading every id's
    row as the forward does."""
    p = t.bytes_per_element
    S = path.stream_Bps
    cast = outputs * cols * (p + out_bytes) / S if out_bytes < p else 0.0
    fwd = (gather + outputs * (cols * p + cfg.bag_bytes)) / Bps + cast + cfg.shard_overhead_s
    sort = INDEX_PUT_BYTES[0]
    n, expand = ids, 0.0                          # gradient rows after the backward
    if ids > outputs and path.merged_bags:
        n, expand = unique, (ids * sort + (ids + unique) * cols * p) / S
    elif ids > outputs:
        expand = (ids + outputs) * cols * p / S
    scale = 2 * n * cols * p / S if path.scale_pass else 0.0
    merge = (n * sort + (n + unique) * cols * p) / S if path.dedup else 0.0
    if path.dedup or n < ids:                     # one row per distinct id: read, written
        add = unique * cols * p / S + unique * (2 * cols * p + cfg.lookup_overhead_bytes
                                                + cfg.id_bytes) / Bps
    else:
        add = ids * cols * p / S + (gather + unique * cols * p) / Bps
    return fwd, cast + expand + scale + merge + add + cfg.shard_overhead_s
