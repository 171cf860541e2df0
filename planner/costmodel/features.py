"""Per-table feature vectors shared by data collection, training and the planner.

A table on one device is described by its rows, dim, pooling factor and the 17 row-weighted
reuse bins (NeuroShard's 20 raw features). The networks see a transformed vector
(:data:`FEATURE_NAMES`): the bins as they are, log2 of rows / dim / pooling / weight bytes and
log2 of the lookups per batch times the dim (the gathered elements), which turns the
multiplicative structure of lookup time into sums the MLP learns easily.
"""

from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np

from planner.model.tables.access import NUM_BINS, accesses_per_row

__all__ = ["FEATURE_NAMES", "NUM_FEATURES", "table_vector", "table_matrix", "aggregate_vector",
           "AGG_NAMES", "parse_table_records"]

FEATURE_NAMES = tuple([f"bin_{k}" for k in range(NUM_BINS)]
                      + ["log2_rows", "log2_dim", "log2_pooling", "log2_bytes",
                         "log2_gathered", "log2_distinct_bytes"])
NUM_FEATURES = len(FEATURE_NAMES)


def table_vector(rows: float, dim: float, pooling: float, bins: Sequence[float], *,
                 batch: int, bytes_per_element: int = 4) -> np.ndarray:
    """Feature vector (:data:`FEATURE_NAMES`) of one table (or column shard) at ``batch``."""
    b = np.asarray(bins, dtype=float)
    lookups = max(batch * float(pooling), 1e-3)
    distinct = min(float(rows), lookups / max(1.0, accesses_per_row(b)))
    tail = [math.log2(max(rows, 1)), math.log2(max(dim, 1)), math.log2(max(pooling, 1e-3)),
            math.log2(max(rows * dim * bytes_per_element, 1)),
            math.log2(lookups * dim), math.log2(max(distinct * dim * bytes_per_element, 1.0))]
    return np.concatenate([b, np.array(tail)])


def table_matrix(records: Sequence[Sequence[float]], *, batch: int) -> np.ndarray:
    """(tables, NUM_FEATURES) for records ``[rows, dim, pooling, bin_0 … bin_16]``."""
    return np.stack([table_vector(r[0], r[1], r[2], r[3:3 + NUM_BINS], batch=batch)
                     for r in records]) if len(records) else np.zeros((0, NUM_FEATURES))


AGG_NAMES = ("n_tables", "sum_dim", "sum_rows_dim", "sum_gathered", "sum_distinct_bytes",
             "max_gathered", "max_bytes", "mean_log2_rows", "sum_pooling", "sum_dim_pooling",
             "log2_sum_gathered", "log2_sum_distinct_bytes") + tuple(
                 f"gbin_{k}" for k in range(NUM_BINS))


def aggregate_vector(records: Sequence[Sequence[float]], *, batch: int) -> np.ndarray:
    """A fixed-length summary of a table multiset, for the gradient-boosting baseline."""
    rows = np.array([r[0] for r in records], dtype=float)
    dim = np.array([r[1] for r in records], dtype=float)
    pool = np.array([r[2] for r in records], dtype=float)
    bins = np.array([r[3:3 + NUM_BINS] for r in records], dtype=float)
    gathered = batch * pool * dim
    apr = np.array([max(1.0, accesses_per_row(b)) for b in bins])
    distinct_bytes = np.minimum(rows, batch * pool / apr) * dim * 4
    w = gathered / max(gathered.sum(), 1e-9)
    return np.concatenate([[len(records), dim.sum(), (rows * dim).sum(), gathered.sum(),
                            distinct_bytes.sum(), gathered.max(), (rows * dim * 4).max(),
                            np.log2(rows).mean(), pool.sum(), (dim * pool).sum(),
                            np.log2(gathered.sum() + 1), np.log2(distinct_bytes.sum() + 1)],
                           (bins * w[:, None]).sum(axis=0)])


def parse_table_records(text: str) -> list[list[float]]:
    """The ``tables`` column of a data file: JSON ``[[pool, rows, dim, pooling, bins…], …]``
    → records without the pool index."""
    return [list(map(float, r[1:])) for r in json.loads(text)]
