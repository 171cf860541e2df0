"""Access statistics of embedding tables: reuse bins, Zipf distributions, accesses per row.

The 17 reuse bins of dlrm_datasets split the distinct rows one batch touches by how often each
was accessed: (0,1], (1,2], (2,4], …, (2^14, 2^15], (2^15, ∞). Two views of one histogram:

- *row-weighted* ``f_k``: fraction of distinct rows in bin k (the per-table features of
  NeuroShard and the ``frac_unique_rows_reuse`` columns);
- *access-weighted* ``a_k``: fraction of all lookups that hit rows of bin k
  (``frac_accesses_reuse``).

With ``c_k`` the mean access count of the rows in bin k, ``a_k ∝ f_k · c_k`` and the accesses per
distinct row are ``Σ f_k c_k = 1 / Σ a_k / c_k``. ``c_0 = 1``, ``c_1 = 2`` exactly; for the
wider bins (2^(k−1), 2^k] the mean of a decreasing, heavy-tailed density sits at
``1.6 · 2^(k−1)``: fitted to the three dlrm_datasets file sets, this reproduces their accesses
per distinct row within 1.5% (6.94 vs 6.9, 7.64 vs 7.6, 12.9 vs 12.7) and their row-weighted
histograms from the access-weighted ones within an L1 distance of 0.045.

>>> round(accesses_per_row([1.0] + [0.0] * 16), 3)
1.0
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from simulator.errors import SpecError

__all__ = ["NUM_BINS", "BIN_MEAN_COUNT", "BIN_LABELS", "accesses_per_row", "access_hist",
           "row_hist", "zipf_reuse", "LocalityStats", "load_locality_stats",
           "default_reuse_bins", "locality_csv_path"]

NUM_BINS = 17
#: mean access count of the rows in each bin (see the module docstring)
BIN_MEAN_COUNT = np.array([1.0, 2.0] + [1.6 * 2.0 ** (k - 1) for k in range(2, NUM_BINS)])
BIN_LABELS = tuple(["(0,1]", "(1,2]"] + [f"({2 ** (k - 1)},{2 ** k}]" for k in range(2, 16)]
                   + ["(32768,inf)"])


def accesses_per_row(row_bins: Sequence[float]) -> float:
    """Mean lookups per distinct row from a row-weighted histogram (1.0 for all zeros)."""
    f = np.asarray(row_bins, dtype=float)
    s = f.sum()
    return float((f * BIN_MEAN_COUNT).sum() / s) if s > 0 else 1.0


def access_hist(row_bins: Sequence[float]) -> np.ndarray:
    """Row-weighted → access-weighted histogram."""
    w = np.asarray(row_bins, dtype=float) * BIN_MEAN_COUNT
    s = w.sum()
    return w / s if s > 0 else w


def row_hist(access_bins: Sequence[float]) -> np.ndarray:
    """Access-weighted → row-weighted histogram."""
    w = np.asarray(access_bins, dtype=float) / BIN_MEAN_COUNT
    s = w.sum()
    return w / s if s > 0 else w


def _bin_of(counts: np.ndarray) -> np.ndarray:
    """Bin index of access counts ≥ 1: 0 for 1, 1 for 2, k for (2^(k−1), 2^k], 16 above 2^15."""
    c = np.maximum(np.asarray(counts, dtype=float), 1.0)
    k = np.ceil(np.log2(c) - 1e-12).astype(int)
    return np.clip(k, 0, NUM_BINS - 1)


@functools.lru_cache(maxsize=4096)
def zipf_reuse(exponent: float, rows: int, accesses: float) -> tuple[tuple[float, ...], float]:
    """Row-weighted reuse bins and accesses per distinct row for Zipf-distributed lookups.

    ``accesses`` draws from rows ``1..rows`` with probability ∝ ``i ** -exponent``. Row ``i``'s
    count is Poisson with mean ``λ_i = accesses · p_i``: it appears with probability
    ``1 − e^{−λ_i}``, and its count, given that it appears, is binned exactly (Poisson pmf) for
    ``λ_i < 30`` and at its mean above. Rows past 2,000 are integrated on a log grid.

    Returns ``(bins, accesses_per_distinct_row)``.
    """
    rows = int(rows)
    if rows <= 0 or accesses <= 0:
        return tuple([1.0] + [0.0] * (NUM_BINS - 1)), 1.0
    exact = min(rows, 2000)
    idx = [np.arange(1, exact + 1, dtype=float)]
    wts = [np.ones(exact)]
    if rows > exact:
        edges = np.unique(np.round(np.geomspace(exact + 0.5, rows + 0.5, 1500)))
        lo, hi = edges[:-1], edges[1:]
        idx.append(np.sqrt(lo * hi))
        wts.append(hi - lo)
    i = np.concatenate(idx)
    w = np.concatenate(wts)
    p = i ** -float(exponent)
    p = p / (p * w).sum()
    lam = accesses * p
    appear = -np.expm1(-lam)                       # P(count ≥ 1)
    unique = float((w * appear).sum())
    bins = np.zeros(NUM_BINS)
    small = lam < 30.0
    if small.any():
        ks = np.arange(1, 121, dtype=float)
        lam_s = lam[small][:, None]
        logpmf = ks * np.log(np.maximum(lam_s, 1e-300)) - lam_s - np.array(
            [math.lgamma(k + 1) for k in ks])
        pmf = np.exp(logpmf) * w[small][:, None]
        np.add.at(bins, _bin_of(ks), pmf.sum(axis=0))
    big = ~small
    if big.any():
        np.add.at(bins, _bin_of(lam[big]), (w * appear)[big])
    bins = bins / bins.sum() if bins.sum() > 0 else bins
    return tuple(float(x) for x in bins), float(accesses / unique) if unique > 0 else 1.0


# ---------------------------------------------------------------------------------------------
# dlrm_datasets aggregates

def locality_csv_path() -> Path:
    """The packaged copy of dlrm_datasets' locality statistics (MIT, Facebook; see LICENSE)."""
    return Path(__file__).resolve().parent / "data" / "dlrm_datasets_locality_stats.csv"


class LocalityStats:
    """Aggregate locality statistics of one dlrm_datasets file set.

    Attributes
    ----------
    file_set : str
        ``2021`` (the main 2021 file), ``2021-parts`` (mean of ``_0`` … ``_15``) or ``2022``.
    num_tables, batch_size : int
    lookups, unique_rows : float
        Per batch, over all tables.
    accesses_per_row : float
        As printed by the source (rounded to 0.1).
    row_hist, access_hist : numpy.ndarray
        The 17-bin histograms as printed (3 decimals).
    """

    def __init__(self, file_set: str, num_tables: int, batch_size: int, lookups: float,
                 unique_rows: float, accesses_per_row: float, row_hist: np.ndarray,
                 access_hist: np.ndarray) -> None:
        self.file_set = file_set
        self.num_tables = num_tables
        self.batch_size = batch_size
        self.lookups = lookups
        self.unique_rows = unique_rows
        self.accesses_per_row = accesses_per_row
        self.row_hist = row_hist
        self.access_hist = access_hist

    @property
    def mean_pooling_factor(self) -> float:
        """Mean ids per sample per table: lookups / (tables × batch)."""
        return self.lookups / (self.num_tables * self.batch_size)

    def derived_row_hist(self) -> np.ndarray:
        """Row-weighted histogram derived from the access-weighted one (no rounding to 0)."""
        return row_hist(self.access_hist)


FILE_SETS = ("2021", "2021-parts", "2022")


@functools.lru_cache(maxsize=8)
def load_locality_stats(file_set: str = "2021", path: str | None = None) -> LocalityStats:
    """Read one file set's aggregates from the dlrm_datasets CSV (packaged copy by default)."""
    if file_set not in FILE_SETS:
        raise SpecError(f"unknown dlrm_datasets file set {file_set!r}", field="file_set",
                        fix=f"use one of: {', '.join(FILE_SETS)}")
    import pandas as pd          # here: the plan command needs it only for synthetic tables

    df = pd.read_csv(path or locality_csv_path())
    rc = [c for c in df.columns if c.startswith("frac_unique_rows_reuse")]
    ac = [c for c in df.columns if c.startswith("frac_accesses_reuse")]
    if file_set == "2021":
        sel = df[(df.year == 2021) & (df.file == "fbgemm_t856_bs65536.pt")]
    elif file_set == "2021-parts":
        sel = df[(df.year == 2021) & (df.file != "fbgemm_t856_bs65536.pt")]
    else:
        sel = df[df.year == 2022]
    return LocalityStats(file_set, int(sel.num_tables.iloc[0]), int(sel.batch_size.iloc[0]),
                         float(sel.avg_num_indices.mean()), float(sel.avg_unique_rows.mean()),
                         float(sel.avg_accesses_per_unique_row.mean()),
                         sel[rc].mean().to_numpy(dtype=float),
                         sel[ac].mean().to_numpy(dtype=float))


@functools.lru_cache(maxsize=1)
def default_reuse_bins() -> tuple[float, ...]:
    """The prior for tables with no access distribution: dlrm_datasets 2021 (main file)."""
    return tuple(float(x) for x in load_locality_stats("2021").derived_row_hist())
