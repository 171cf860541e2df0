"""Synthetic ids of one global batch per table, drawn from the table's access distribution.

Its 17 reuse bins (the default dlrm_datasets histogram when it has none) give the number of
distinct rows (lookups / accesses per row, as the cost model assumes) and how often each is hit;
a Zipf exponent draws Zipf ids instead. Distinct rows are spread over the table at random
(hashing), bag lengths average the pooling factor. Same seed, same ids, whatever the plan: every
planner's plan of a task is measured (:mod:`planner.measure.tables.plans`) and run
(``planner/measure/validate``) on the same data."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from planner.model.tables.access import NUM_BINS, accesses_per_row, default_reuse_bins
from planner.model.tables.spec import ModelSpec, TableSpec

__all__ = ["TableIds", "table_ids", "model_ids", "local_batches"]


@dataclass(frozen=True)
class TableIds:
    """One global batch of one table: row ids (int64) and bag offsets (``batch + 1``)."""

    indices: np.ndarray
    offsets: np.ndarray

    @property
    def batch(self) -> int:
        return len(self.offsets) - 1

    @property
    def distinct(self) -> int:
        return int(np.unique(self.indices).size)


def _bag_lengths(batch: int, pooling: float, rng: np.random.Generator) -> np.ndarray:
    total = int(round(batch * max(0.0, pooling)))
    base, extra = divmod(total, batch) if batch > 0 else (0, 0)
    lengths = np.full(batch, base, dtype=np.int64)
    if extra:
        lengths[rng.choice(batch, size=extra, replace=False)] += 1
    return lengths


def _counts_from_bins(bins: Sequence[float], distinct: int, total: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Access counts of ``distinct`` rows, binned as ``bins`` says, summing to ``total``."""
    f = np.asarray(bins, dtype=float)
    f = f / f.sum() if f.sum() > 0 else np.eye(NUM_BINS)[0]
    k = rng.choice(NUM_BINS, size=distinct, p=f)
    lo = np.where(k >= 1, 2.0 ** np.maximum(k - 1, 0), 1.0)
    width = np.where(k >= 2, lo, 0.0)
    # (2^(k-1), 2^k]: mean 1.6 · 2^(k-1) as in access.BIN_MEAN_COUNT (Beta(1.5, 1) has mean 0.6)
    c = np.where(k == 0, 1.0, np.where(k == 1, 2.0, lo + np.ceil(width * rng.beta(1.5, 1.0,
                                                                                  distinct))))
    scaled = np.maximum(1, np.round(c * (total / c.sum()))).astype(np.int64)
    diff = int(total - scaled.sum())
    if diff > 0:
        add = rng.choice(distinct, size=diff, p=scaled / scaled.sum())
        np.add.at(scaled, add, 1)
    elif diff < 0:
        order = np.argsort(-scaled, kind="stable")
        left = -diff
        i = 0
        while left > 0:
            j = order[i % distinct]
            if scaled[j] > 1:
                take = min(left, int(scaled[j] - 1), max(1, left // distinct + 1))
                scaled[j] -= take
                left -= take
            i += 1
    return scaled


def table_ids(table: TableSpec, batch: int, *, seed: int = 0, index: int = 0) -> TableIds:
    """One global batch of ids for ``table`` (see the module docstring), seeded per table."""
    key = zlib.crc32(table.name.encode())
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(index), key, 0x1D5]))
    lengths = _bag_lengths(batch, table.pooling_factor, rng)
    total = int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    rows = int(table.num_embeddings)
    if total == 0:
        return TableIds(np.zeros(0, dtype=np.int64), offsets)
    if table.zipf_exponent is not None:
        s = float(table.zipf_exponent)
        w = np.arange(1, rows + 1, dtype=float) ** -s
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
        rank = np.minimum(np.searchsorted(cdf, rng.random(total), side="right"), rows - 1)
        perm = rng.permutation(rows)
        ids = perm[rank].astype(np.int64)
    else:
        bins = table.reuse_bins if table.reuse_bins is not None else default_reuse_bins()
        apr = max(1.0, accesses_per_row(bins))
        distinct = int(min(rows, total, max(1, round(total / apr))))
        counts = _counts_from_bins(bins, distinct, total, rng)
        chosen = rng.choice(rows, size=distinct, replace=False).astype(np.int64)
        ids = np.repeat(chosen, counts)
        rng.shuffle(ids)
    return TableIds(ids, offsets)


def model_ids(model: ModelSpec, *, seed: int = 0) -> list[TableIds]:
    """:func:`table_ids` for every table of ``model`` at its global batch."""
    return [table_ids(t, model.batch_size, seed=seed, index=i) for i, t in enumerate(model.tables)]


def local_batches(batch: int, devices: int) -> np.ndarray:
    """Sample boundaries of each rank's local batch (``devices + 1`` values)."""
    sizes = [len(a) for a in np.array_split(np.arange(batch), devices)]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
