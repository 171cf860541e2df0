"""Embedding-table sharding for recommendation models: the planners, and this package's public
API over the stages they use.

Pipeline (each stage a small module; specs, tasks, plans and costs in :mod:`planner.model.tables`,
the step's op graph in :mod:`planner.workloads.dlrm`)::

    spec.load_model_spec ─► task.ShardingTask ─► task.prepare(task, N) ─► planners.get_planner(name)
         (YAML / CSV /          (model, topology,     (topology, hosts,        .plan(task, N, seed=,
          built-in name)         memory, types)        capacity, cost model)         time_limit_s=)
                                                                                   │
    dlrm.step.simulate_step ◄── plan.Plan (per-rank cost, memory, layouts, JSON) ◄──┘

>>> from planner.sharding import ShardingTask, get_planner, load_model_spec
>>> task = ShardingTask(model=load_model_spec("criteo-dlrm"))
>>> plan = get_planner("greedy").plan(task, 8, seed=0)
>>> plan.valid, len(plan.shardings)
(True, 26)

``generate`` makes seeded synthetic tables and NeuroShard/DreamShard-shaped tasks calibrated to
the dlrm_datasets locality statistics; :mod:`planner.cli.tables` is ``clusterplan plan``. See
README.md here.
"""

from planner.model.tables.cost import CostModel
from planner.model.tables.cost_config import CostConfig
from planner.model.tables.feasible import InfeasibleError, check_feasible
from planner.model.tables.generate import dreamshard_tasks, neuroshard_tasks, synthesize_tables
from planner.model.tables.plan import Plan, PlannerStats
from planner.model.tables.shards import Shard, ShardingType, TableSharding
from planner.model.tables.spec import DenseSpec, ModelSpec, TableSpec
from planner.model.tables.spec_file import builtin_spec_names, load_model_spec
from planner.model.tables.task import Problem, ShardingTask, prepare
from planner.sharding.planners import PLANNER_NAMES, get_planner
from planner.sharding.protocols import Planner
from planner.workloads.dlrm.step import simulate_plan, simulate_step

__all__ = ["CostConfig", "CostModel", "dreamshard_tasks", "neuroshard_tasks",
           "synthesize_tables", "InfeasibleError", "check_feasible", "Plan", "PlannerStats",
           "PLANNER_NAMES", "Planner", "get_planner", "Shard", "ShardingType", "TableSharding",
           "simulate_plan", "simulate_step", "DenseSpec", "ModelSpec", "TableSpec",
           "builtin_spec_names", "load_model_spec", "Problem", "ShardingTask", "prepare"]
