"""Synthetic tables reproduce dlrm_datasets' aggregates; task generators have the right shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from planner.model.tables.access import (
    BIN_MEAN_COUNT,
    accesses_per_row,
    load_locality_stats,
    locality_csv_path,
    zipf_reuse,
)
from planner.model.tables.generate import (
    dreamshard_tasks,
    neuroshard_tasks,
    pool_statistics,
    synthesize_tables,
)

# Stated tolerances of the generator against the CSV (856-table pools, any seed):
APR_TOL = 0.06          # accesses per distinct row, relative
ACCESS_L1 = 0.06        # lookup-weighted 17-bin histogram, L1 distance
ROW_L1 = 0.09           # row-weighted histogram (includes the ≤ 0.045 bin-mean model error)


@pytest.mark.parametrize("file_set,seed", [("2021", 0), ("2021", 1), ("2021", 2), ("2021", 3),
                                           ("2021-parts", 0), ("2022", 0)])
def test_pool_reproduces_csv_locality(file_set, seed):
    s = load_locality_stats(file_set)
    tabs = synthesize_tables(s.num_tables, seed=seed, file_set=file_set)
    st = pool_statistics(tabs, s.batch_size)
    assert abs(st["accesses_per_row"] / s.accesses_per_row - 1) < APR_TOL
    assert np.abs(st["access_hist"] - s.access_hist).sum() < ACCESS_L1
    assert np.abs(st["row_hist"] - s.row_hist).sum() < ROW_L1
    assert st["mean_pooling_factor"] == pytest.approx(s.mean_pooling_factor, rel=1e-4)
    rows = np.array([t.num_embeddings for t in tabs])
    assert rows.min() >= 100
    # no table has fewer rows than one batch touches
    unique = np.array([s.batch_size * t.pooling_factor / accesses_per_row(t.reuse_bins)
                       for t in tabs])
    assert (rows >= np.floor(unique)).all()
    # heavy tail of pooling factors
    pf = np.array([t.pooling_factor for t in tabs])
    assert pf.max() > 5 * pf.mean() and np.median(pf) < pf.mean()


def test_bin_means_reproduce_the_csv():
    for fs in ("2021", "2021-parts", "2022"):
        s = load_locality_stats(fs)
        apr = 1.0 / (s.access_hist / BIN_MEAN_COUNT).sum()
        assert abs(apr / s.accesses_per_row - 1) < 0.015
        assert np.abs(s.derived_row_hist() - s.row_hist).sum() < 0.045


def test_packaged_csv_matches_shared_copy():
    shared = (Path(__file__).resolve().parents[3] / "shared" / "data" / "dlrm_datasets"
              / "dlrm_datasets_locality_stats.csv")
    if not shared.exists():
        pytest.skip("shared/ not beside the repository")
    assert shared.read_bytes() == locality_csv_path().read_bytes()


def test_zipf_reuse():
    bins, apr = zipf_reuse(0.0, 10**8, 1e5)
    assert apr == pytest.approx(1.0, abs=0.01) and bins[0] > 0.99
    _, apr_hot = zipf_reuse(1.2, 10**7, 1e6)
    _, apr_mild = zipf_reuse(0.8, 10**7, 1e6)
    assert apr_hot > apr_mild > 1.0
    bins, apr = zipf_reuse(1.0, 100, 1e6)
    assert apr == pytest.approx(1e4, rel=1e-3) and abs(sum(bins) - 1) < 1e-9


def test_same_seed_same_tables():
    assert synthesize_tables(50, seed=7) == synthesize_tables(50, seed=7)
    assert synthesize_tables(50, seed=7) != synthesize_tables(50, seed=8)


def test_neuroshard_task_shapes():
    tasks = neuroshard_tasks(0, 20)
    assert [t.model for t in tasks] == [t.model for t in neuroshard_tasks(0, 20)]
    for bt in tasks:
        m = bt.model
        assert 10 <= m.num_tables <= 59 and bt.devices == 4 and bt.memory_bytes == 4 * 2**30
        assert {t.embedding_dim for t in m.tables} <= {4, 8, 16, 32, 64, 128}
        assert sum(t.num_embeddings * t.embedding_dim * 4 for t in m.tables) <= 15 * 2**30
        assert len({t.name for t in m.tables}) == m.num_tables
        assert m.batch_size == 65536 and all(t.precision == "fp32" for t in m.tables)
    sizes = [bt.model.num_tables for bt in tasks]
    assert min(sizes) < 25 and max(sizes) > 40


def test_dreamshard_task_shapes():
    train = dreamshard_tasks(0, 3, num_tables=50, split="train")
    test = dreamshard_tasks(0, 3, num_tables=50, split="test")
    for bt in train + test:
        m = bt.model
        assert m.num_tables == 50
        assert all(t.embedding_dim == 16 and t.precision == "fp16" for t in m.tables)
        assert all(float(t.pooling_factor).is_integer() for t in m.tables)
        pool_ids = [t.name.split("_", 1)[1] for t in m.tables]
        assert len(set(pool_ids)) == 50                       # without replacement
    tr = {t.name.split("_", 1)[1] for bt in train for t in bt.model.tables}
    te = {t.name.split("_", 1)[1] for bt in test for t in bt.model.tables}
    assert not tr & te                                        # disjoint halves
