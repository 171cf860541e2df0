"""Small seeded DMT tasks."""

from __future__ import annotations

from dataclasses import replace

import pytest


def dmt_task(n_tables: int = 32, *, seed: int = 0, dim: int = 32,
             topology: str = "dgx-h100:nodes=2", batch: int = 8192, dense: bool = True,
             sigma: float = 1.0):
    from planner.model.tables.generate import synthesize_tables
    from planner.model.tables.spec import DenseSpec, ModelSpec
    from planner.model.tables.task import ShardingTask
    base = synthesize_tables(n_tables, seed=seed, dim=dim, pooling_sigma=sigma)
    tables = tuple(replace(t, num_embeddings=min(t.num_embeddings, 200_000)) for t in base)
    model = ModelSpec(name=f"dmt-{n_tables}-s{seed}", tables=tables, batch_size=batch,
                      dense=DenseSpec(bottom_mlp=(64, dim), top_mlp=(256, 64, 1))
                      if dense else None, source="test")
    return ShardingTask(model=model, topology=topology)


@pytest.fixture
def task16():
    return dmt_task()


@pytest.fixture
def make_task():
    """The factory :func:`dmt_task` (seeded synthetic tables, small rows)."""
    return dmt_task
