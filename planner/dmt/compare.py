"""The flat step and the DMT (SPTT) step of one task, planned and simulated side by side.

>>> from planner.model.tables.spec import ModelSpec, TableSpec
>>> from planner.model.tables.task import ShardingTask
>>> tabs = tuple(TableSpec(name=f"t{i}", num_embeddings=10000, embedding_dim=64) for i in range(8))
>>> task = ShardingTask(model=ModelSpec(name="m", tables=tabs, batch_size=4096),
...                     topology="dgx-h100:nodes=2")
>>> cmp = compare_flat_dmt(task, 16, towers=2, module=TowerModuleSpec())
>>> cmp.flat.step_time_s > 0 and cmp.dmt.step_time_s > 0
True
"""

from __future__ import annotations

from planner.dmt.partition import partition_layout
from planner.dmt.towers import shard_hosts
from planner.model.dmt.layout import TowerLayout, host_groups
from planner.model.dmt.module import TowerModuleSpec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.planners import get_planner
from planner.workloads.dlrm.step import build_step_workload, simulate_step
from planner.workloads.dmt.step import Comparison, cross_host_bytes, simulate_sptt

__all__ = ["compare_flat_dmt"]



def compare_flat_dmt(task: ShardingTask, devices: int, *, towers: int | str = "auto",
                     module=None, layout: TowerLayout | None = None, planner: str = "greedy",
                     partitioner: str = "affinity", seed: int = 0, flat_plan=None,
                     mode: str | None = None, coaccess=None,
                     time_limit_s: float | None = None) -> Comparison:
    """Plan and simulate the flat step and the SPTT step of ``task`` on ``devices`` GPUs.

    The flat plan comes from ``planner`` over all ranks (types: the task's, default the tower
    types plus table-row-wise); the towers from :func:`planner.dmt.partition.partition_towers`
    unless ``layout`` is given; each host's tables from the same planner inside the host
    (``time_limit_s`` per host for ``mip`` and ``local_search``).
    """
    problem = prepare(task, devices)
    host_groups(problem)                      # uneven hosts: a SpecError before any planning
    if mode is None:
        mode = "symmetric" if devices > 64 else "explicit"
    if flat_plan is None:
        flat_plan = get_planner(planner).plan(task, devices, seed=seed)
    flat = simulate_step(problem, flat_plan.shardings, mode=mode)
    _, mats = build_step_workload(problem, flat_plan.shardings)
    if layout is None:
        layout = partition_layout(task, devices, towers=towers,
                                  module=module or TowerModuleSpec(), method=partitioner,
                                  seed=seed, coaccess=coaccess).layout
    hps = shard_hosts(task, layout, planner=planner, seed=seed, time_limit_s=time_limit_s)
    dmt = simulate_sptt(task, devices, layout, hps, mode=mode)
    return Comparison(flat=flat, dmt=dmt, layout=layout, host_plans=hps, flat_plan=flat_plan,
                      flat_cross_host_bytes=cross_host_bytes(problem, mats))
