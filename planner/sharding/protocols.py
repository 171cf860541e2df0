"""The interfaces between the pipeline's stages (``typing.Protocol``; structural, so any object
with these methods plugs in — e.g. a real per-table statistics file instead of the generator).

=====================  ===================================================  =====================
stage                  protocol                                             shipped
=====================  ===================================================  =====================
spec loading           :class:`SpecLoader` ``(ref) -> ModelSpec``           ``load_model_spec``
table synthesis        :class:`TableSource` ``(n, *, seed) -> tables``      ``synthesize_tables``
cost estimation        :class:`ShardEstimator`                              ``CostModel``
feasibility            :class:`FeasibilityCheck` ``(problem, types)``       ``check_feasible``
planning               :class:`Planner` ``plan(task, devices, ...) -> Plan``  ``get_planner(name)``
step simulation        :class:`StepSimulator` ``(problem, shardings)``      ``simulate_step``
=====================  ===================================================  =====================
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from planner.model.tables.plan import Plan
from planner.model.tables.shards import Shard, ShardingType, TableSharding
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask

__all__ = ["SpecLoader", "TableSource", "ShardEstimator", "FeasibilityCheck", "Planner",
           "StepSimulator"]


@runtime_checkable
class SpecLoader(Protocol):
    def __call__(self, ref: str) -> ModelSpec: ...


@runtime_checkable
class TableSource(Protocol):
    def __call__(self, n: int, *, seed: int = 0) -> Sequence[TableSpec]: ...


@runtime_checkable
class ShardEstimator(Protocol):
    """Per-shard additive features and per-rank costs (seconds) of a feature matrix."""

    def shard_features(self, ti: int, shard: Shard, st: ShardingType) -> np.ndarray: ...

    def sharding_features(self, ts: TableSharding) -> np.ndarray: ...

    def rank_costs(self, F: np.ndarray) -> np.ndarray: ...

    def components(self, F: np.ndarray) -> dict: ...


@runtime_checkable
class FeasibilityCheck(Protocol):
    def __call__(self, problem, types: Sequence[ShardingType]) -> None: ...


@runtime_checkable
class Planner(Protocol):
    """One planning strategy."""

    name: str

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        """A plan for ``task`` on ``devices`` ranks; same inputs and seed → same plan."""
        ...


@runtime_checkable
class StepSimulator(Protocol):
    def __call__(self, problem, shardings: Sequence[TableSharding]): ...
