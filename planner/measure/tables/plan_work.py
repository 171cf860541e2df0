"""What each rank of a sharding plan runs, from one global batch of ids per table: its shards as
fused-kernel tables (:func:`rank_work`: table- and column-wise shards serve the global batch, a
row-wise block the ids that fall in it, a data-parallel replica the rank's local batch), and
the plan's collectives with exact byte counts (:func:`comm_ops`: 8-byte ids and a 4-byte
length per bag into the shards' ranks, pooled embeddings out and their gradients back,
row-wise partial sums, data-parallel gradients). :mod:`planner.measure.tables.plans` times
them; the validation probes reuse :func:`rank_work`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from planner.measure.tables.tbe import KernelTable
from planner.model.tables.ids import TableIds, local_batches
from planner.model.tables.shards import (HOST_REDUCED_TYPES, ROW_SPLIT_TYPES, ShardingType,
                                          TableSharding)
from planner.model.tables.spec import PRECISION_BYTES, ModelSpec

__all__ = ["rank_work", "comm_ops", "ID_BYTES", "LENGTH_BYTES"]

ID_BYTES = 8
LENGTH_BYTES = 4


def _slice_bags(ids: TableIds, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    o = ids.offsets
    return ids.indices[o[lo]:o[hi]], o[lo:hi + 1] - o[lo]


def _row_block(ids: TableIds, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray]:
    """The ids of every bag that fall in rows ``[r0, r1)``, shifted to the block."""
    keep = (ids.indices >= r0) & (ids.indices < r1)
    per_bag = np.add.reduceat(keep.astype(np.int64), ids.offsets[:-1]) if ids.indices.size \
        else np.zeros(ids.batch, dtype=np.int64)
    per_bag = np.where(np.diff(ids.offsets) > 0, per_bag, 0)
    offsets = np.concatenate([[0], np.cumsum(per_bag)]).astype(np.int64)
    return ids.indices[keep] - r0, offsets


def rank_work(model: ModelSpec, shardings: Sequence[TableSharding], ids: Sequence[TableIds],
              devices: int) -> list[list]:
    """Per rank, the :class:`~planner.measure.tables.tbe.KernelTable` list of its shards."""
    bounds = local_batches(model.batch_size, devices)
    out: list[list] = [[] for _ in range(devices)]
    for ts in shardings:
        t = model.tables[ts.table]
        tid = ids[ts.table]
        st = ts.sharding_type
        for s in ts.shards:
            if st == ShardingType.DATA_PARALLEL:
                idx, off = _slice_bags(tid, int(bounds[s.rank]), int(bounds[s.rank + 1]))
                out[s.rank].append(KernelTable(s.rows, s.cols, t.precision, idx, off, dense=True,
                                               name=t.name))
            elif st in ROW_SPLIT_TYPES:
                idx, off = _row_block(tid, s.row_offset, s.row_offset + s.rows)
                out[s.rank].append(KernelTable(s.rows, s.cols, t.precision, idx, off,
                                               name=t.name))
            else:
                out[s.rank].append(KernelTable(s.rows, s.cols, t.precision, tid.indices,
                                               tid.offsets, name=t.name))
    return out


def comm_ops(model: ModelSpec, shardings: Sequence[TableSharding], ids: Sequence[TableIds],
             devices: int, hosts: Sequence[Sequence[int]] | None = None) -> list[tuple]:
    """The collectives the plan implies, with exact byte counts: ``(kind, name, bytes)``, an
    all-to-all's bytes as the matrix ``[i][j]`` of bytes rank ``i`` sends rank ``j`` (see
    :mod:`planner.measure.tables.comm`)."""
    n = devices
    bounds = local_batches(model.batch_size, n)
    b = np.diff(bounds)
    o = PRECISION_BYTES[model.comm_precision]
    ids_m = np.zeros((n, n))
    out_cols = np.zeros(n)
    rw_bytes = 0.0
    twrw_bytes = 0.0
    dp_bytes = 0.0
    for ts in shardings:
        t = model.tables[ts.table]
        tid = ids[ts.table]
        st = ts.sharding_type
        if st == ShardingType.DATA_PARALLEL:
            dp_bytes += t.num_embeddings * t.embedding_dim * 4.0
            continue
        for s in ts.shards:
            if st in ROW_SPLIT_TYPES:
                if s.rows == 0:
                    continue
                keep = (tid.indices >= s.row_offset) & (tid.indices < s.row_offset + s.rows)
                cum = np.concatenate([[0], np.cumsum(keep)])
                per_src = cum[tid.offsets[bounds[1:]]] - cum[tid.offsets[bounds[:-1]]]
                if st == ShardingType.SUBSET_ROW_WISE:      # partial sums, as table-wise
                    out_cols[s.rank] += s.cols
            else:
                per_src = tid.offsets[bounds[1:]] - tid.offsets[bounds[:-1]]
                out_cols[s.rank] += s.cols
            ids_m[:, s.rank] += per_src * ID_BYTES + b * LENGTH_BYTES
        if st == ShardingType.ROW_WISE:
            rw_bytes += model.batch_size * t.embedding_dim * o
        elif st in HOST_REDUCED_TYPES:         # one host here: reduce-scattered over it
            twrw_bytes += model.batch_size * t.embedding_dim * o
    ops: list[tuple] = []
    if n < 2:
        return ops
    out_m = np.outer(out_cols * o, b).astype(float)          # j → i: j's pooled rows for i
    if ids_m.sum() > 0:
        ops.append(("a2a", "input_a2a_s", ids_m.tolist()))
    if out_m.sum() > 0:
        ops.append(("a2a", "output_a2a_fwd_s", out_m.tolist()))
        ops.append(("a2a", "output_a2a_bwd_s", out_m.T.tolist()))
    if rw_bytes > 0:
        ops.append(("reducescatter", "rw_reducescatter", rw_bytes))
        ops.append(("allgather", "rw_allgather", rw_bytes))
    if twrw_bytes > 0:
        ops.append(("reducescatter", "twrw_reducescatter", twrw_bytes))
        ops.append(("allgather", "twrw_allgather", twrw_bytes))
    if dp_bytes > 0:
        ops.append(("allreduce", "data_parallel_allreduce_s", dp_bytes))
    return ops
