"""Fixtures for the sharding tests: small synthetic tasks and a CLI runner."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


def small_task(n_tables: int, *, seed: int = 0, dims=(8, 16, 32, 64), memory_fraction=None,
               devices: int = 2, types=None, optimizer: str = "sgd"):
    """A task of ``n_tables`` synthetic tables (rows capped to keep sizes small)."""
    from planner.model.tables.generate import synthesize_tables
    from planner.model.tables.spec import ModelSpec
    from planner.model.tables.task import ShardingTask
    base = synthesize_tables(n_tables, seed=seed)
    tables = tuple(replace(t, num_embeddings=min(t.num_embeddings, 400_000),
                           embedding_dim=dims[i % len(dims)]) for i, t in enumerate(base))
    model = ModelSpec(name=f"small-{n_tables}-s{seed}", tables=tables, batch_size=65536,
                      optimizer=optimizer, source="test")
    memory = None
    if memory_fraction is not None:
        from planner.model.tables.memory import table_bytes
        total = sum(table_bytes(t, optimizer) for t in tables)
        memory = int(total * memory_fraction)
    return ShardingTask(model=model, memory_bytes=memory, sharding_types=types)


@pytest.fixture
def make_task():
    return small_task


@pytest.fixture
def cli():
    """Run ``planner.cli.tables.run`` with an argparse parser built here; returns the code."""
    from planner.cli import tables as mod

    def call(*argv: str) -> int:
        p = argparse.ArgumentParser(prog="clusterplan plan")
        mod.add_arguments(p)
        return mod.run(p.parse_args(list(argv)))
    return call


@pytest.fixture
def tables_csv(tmp_path):
    """Write a small tables CSV (``n`` tables, rows 3,000·(i+1), dims cycling ``dims``, pooling
    1 + i mod ``pool``) and return its path."""
    def write(n: int = 12, dims=(8, 16, 64), pool: int = 7) -> Path:
        path = tmp_path / "t.csv"
        path.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                        + "".join(f"t{i},{3000 * (i + 1)},{dims[i % len(dims)]},{1 + i % pool}\n"
                                  for i in range(n)))
        return path
    return write
