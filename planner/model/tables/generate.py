"""Seeded synthetic tables and benchmark tasks calibrated to dlrm_datasets.

The per-table traces of dlrm_datasets are not public in usable form; its aggregate locality
statistics are (packaged in ``data/``). :func:`synthesize_tables` draws tables whose aggregates
match one file set's:

1. **Pooling factors** ``L_t``: log-normal with log-sd ``pooling_sigma`` (a heavy tail: with the
   default 1.0 about 5% of tables exceed 3.5× the mean), rescaled so their mean equals the file
   set's lookups / (tables × batch) exactly (15.8 for 2021).
2. **Reuse**: an access-weighted histogram per table from a Dirichlet centred on the file set's
   aggregate (concentration ``concentration``), converted to the row-weighted bins the spec
   stores (:mod:`.access`). Sampling the access view keeps the lookup-weighted aggregate
   unbiased, and to first order the row-weighted one and the accesses per distinct row.
3. **Rows**: distinct rows touched per batch ``U_t = batch · L_t / accesses_per_row_t`` times a
   hash-space overhang ``exp(|N(0, row_sigma)|)`` ≥ 1, floored at 100 (NeuroShard's floor), so a
   table never has fewer rows than one batch touches.

Task generators reproduce the shapes of the two benchmark families (validation-data.md §5.4):
:func:`neuroshard_tasks` (T ~ U{10..59}, tables drawn with replacement from an 856-table pool,
dims from {4, …, 128}, rejected until the FP32 size ≤ 15 GiB, 4 devices × 4 GiB) and
:func:`dreamshard_tasks` (a 428/428 train/test split of the pool, T tables without replacement,
dim 16, FP16, integer pooling factors, 4 devices × 5 GiB). Everything derives from one seed
through ``numpy.random.SeedSequence``; the same seed gives the same tables on every platform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from planner.model.tables.access import (
    BIN_MEAN_COUNT,
    access_hist,
    accesses_per_row,
    load_locality_stats,
    row_hist,
)
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask

__all__ = ["synthesize_tables", "pool_statistics", "BenchmarkTask", "neuroshard_tasks",
           "dreamshard_tasks", "NEUROSHARD_DIMS"]

GiB = 1024 ** 3
NEUROSHARD_DIMS = (4, 8, 16, 32, 64, 128)


def synthesize_tables(n: int, *, seed: int = 0, file_set: str = "2021", dim: int = 16,
                      concentration: float = 20.0, pooling_sigma: float = 1.0,
                      row_sigma: float = 1.0, prefix: str = "t") -> tuple[TableSpec, ...]:
    """``n`` synthetic tables calibrated to a dlrm_datasets file set (see the module docstring).

    All tables get ``embedding_dim = dim``; task generators replace it.
    """
    stats = load_locality_stats(file_set)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x5EED]))
    batch = stats.batch_size
    mean_pf = stats.mean_pooling_factor
    mu = -0.5 * pooling_sigma ** 2
    pf = rng.lognormal(mu, pooling_sigma, size=n)
    pf = pf * (mean_pf / pf.mean())
    centre = np.maximum(stats.access_hist, 1e-4)
    centre = centre / centre.sum()
    acc = rng.dirichlet(concentration * centre, size=n)
    overhang = np.exp(np.abs(rng.normal(0.0, row_sigma, size=n)))
    width = max(1, len(str(n - 1)))
    tables = []
    for i in range(n):
        f = row_hist(acc[i])
        apr = 1.0 / float((acc[i] / BIN_MEAN_COUNT).sum())
        unique = batch * pf[i] / apr
        rows = max(100, int(math.ceil(unique * overhang[i])))
        tables.append(TableSpec(name=f"{prefix}{i:0{width}d}", num_embeddings=rows,
                                embedding_dim=dim, pooling_factor=round(float(pf[i]), 6),
                                reuse_bins=tuple(round(float(x), 9) for x in f)))
    return tuple(tables)


def pool_statistics(tables: Sequence[TableSpec], batch_size: int) -> dict:
    """Aggregate locality statistics of a set of tables, as dlrm_datasets reports them.

    Returns ``lookups``, ``unique_rows``, ``accesses_per_row``, ``mean_pooling_factor``,
    ``row_hist`` and ``access_hist`` (17 bins each, numpy arrays).
    """
    lookups = np.array([batch_size * t.pooling_factor for t in tables])
    f = np.array([t.reuse_bins for t in tables], dtype=float)
    apr = np.array([accesses_per_row(x) for x in f])
    unique = lookups / apr
    rows_w = (f * unique[:, None]).sum(axis=0)
    acc_w = np.array([access_hist(x) for x in f]) * lookups[:, None]
    return {"lookups": float(lookups.sum()), "unique_rows": float(unique.sum()),
            "accesses_per_row": float(lookups.sum() / unique.sum()),
            "mean_pooling_factor": float(np.mean([t.pooling_factor for t in tables])),
            "row_hist": rows_w / rows_w.sum(), "access_hist": acc_w.sum(axis=0) / acc_w.sum()}


@dataclass(frozen=True, slots=True)
class BenchmarkTask:
    """A generated task with the device count and per-device memory of its benchmark."""

    model: ModelSpec
    devices: int
    memory_bytes: int
    sharding_types: tuple[ShardingType, ...]

    def task(self, **kw):
        """The :class:`~planner.model.tables.task.ShardingTask` (extra fields as keywords)."""
        args = {"model": self.model, "memory_bytes": self.memory_bytes,
                "sharding_types": self.sharding_types}
        args.update(kw)
        return ShardingTask(**args)


def neuroshard_tasks(seed: int, n: int, *, devices: int = 4, memory_bytes: int = 4 * GiB,
                     pool_size: int = 856, file_set: str = "2021",
                     table_range: tuple[int, int] = (10, 59)) -> list[BenchmarkTask]:
    """NeuroShard-shaped tasks (``tools/gen_tasks.py``'s recipe on a synthetic pool).

    Per task: T ~ U{table_range}, T tables drawn with replacement from the pool, each with a
    dim drawn from {4, 8, 16, 32, 64, 128}; redrawn until the FP32 size ≤
    ``devices × memory_bytes − 1 GiB``. Batch 65,536, SGD, FP32; TW and CW allowed (NeuroShard's
    action space).
    """
    root = np.random.SeedSequence([int(seed), 0x4E53])
    pool_seed, task_seed = root.spawn(2)
    pool = synthesize_tables(pool_size, seed=int(pool_seed.generate_state(1)[0]),
                             file_set=file_set, prefix="p")
    rng = np.random.default_rng(task_seed)
    budget = devices * memory_bytes - GiB
    out = []
    for i in range(n):
        while True:
            t = int(rng.integers(table_range[0], table_range[1] + 1))
            ids = rng.integers(0, pool_size, size=t)
            dims = rng.choice(np.array(NEUROSHARD_DIMS), size=t)
            size = sum(pool[j].num_embeddings * int(d) * 4 for j, d in zip(ids, dims))
            if size <= budget:
                break
        tables = tuple(replace(pool[j], name=f"t{k:02d}_{pool[j].name}", embedding_dim=int(d))
                       for k, (j, d) in enumerate(zip(ids, dims)))
        model = ModelSpec(name=f"neuroshard-s{seed}-{i}", tables=tables, batch_size=65536,
                          optimizer="sgd", source=f"neuroshard_tasks(seed={seed})")
        out.append(BenchmarkTask(model, devices, memory_bytes,
                                 (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE)))
    return out


def dreamshard_tasks(seed: int, n: int, *, num_tables: int = 80, split: str = "test",
                     devices: int = 4, memory_bytes: int = 5 * GiB, pool_size: int = 856,
                     file_set: str = "2021") -> list[BenchmarkTask]:
    """DreamShard-shaped tasks ("DLRM-T (D)"): a shuffled pool split in half, T tables per task
    drawn without replacement from the ``train`` or ``test`` half, dim 16, FP16, pooling factors
    truncated to integers, placement only (table-wise)."""
    if split not in ("train", "test"):
        raise ValueError("split must be 'train' or 'test'")
    root = np.random.SeedSequence([int(seed), 0x4453])
    pool_seed, split_seed, task_seed = root.spawn(3)
    pool = synthesize_tables(pool_size, seed=int(pool_seed.generate_state(1)[0]),
                             file_set=file_set, prefix="p")
    perm = np.random.default_rng(split_seed).permutation(pool_size)
    half = pool_size // 2
    ids_split = perm[:half] if split == "train" else perm[half:]
    if num_tables > len(ids_split):
        raise ValueError(f"num_tables {num_tables} exceeds the {len(ids_split)} tables of a split")
    rng = np.random.default_rng(task_seed)
    out = []
    for i in range(n):
        ids = rng.choice(ids_split, size=num_tables, replace=False)
        tables = tuple(replace(pool[j], name=f"t{k:02d}_{pool[j].name}", embedding_dim=16,
                               precision="fp16",
                               pooling_factor=float(math.floor(pool[j].pooling_factor)))
                       for k, j in enumerate(ids))
        model = ModelSpec(name=f"dreamshard-{split}-s{seed}-{i}", tables=tables,
                          batch_size=65536, optimizer="sgd",
                          source=f"dreamshard_tasks(seed={seed}, split={split})")
        out.append(BenchmarkTask(model, devices, memory_bytes, (ShardingType.TABLE_WISE,)))
    return out
