"""Towers: disjoint groups of features, each on one host, and their layout inside the host.

A :class:`TowerLayout` says which tables form each tower, which host holds it (several towers
may share a host; every table of a tower lives on its host, as TorchRec's
``ShardedEmbeddingTower`` requires) and the Tower Module after it. :func:`shard_hosts` then
shards each host's tables over that host's ``G`` GPUs with one of the sharding planners,
planning as if the host were the whole cluster: in SPTT every GPU of host ``t`` holds the
tower's ids for ``H·B`` samples (the cross-host peer exchange brought them), which is the
global batch over ``G`` ranks — exactly what the planner's cost model assumes for ``G``
devices and the global batch.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import SpecError

from planner.model.dmt.layout import INTRA_HOST_TYPES, HostPlan, TowerLayout
from planner.model.tables.task import ShardingTask
from planner.sharding.planners import get_planner

__all__ = ["shard_hosts"]


def shard_hosts(task: ShardingTask, layout: TowerLayout, *, planner: str = "greedy",
                seed: int = 0, time_limit_s: float | None = None) -> tuple[HostPlan, ...]:
    """Shard each host's tables over its ``G`` GPUs (table-, column- or row-wise inside it).

    The sub-task keeps the model's batch, optimizer and precision, has no dense part, and uses
    the task's topology (ranks ``0..G-1`` are host 0's, the same hardware as every host).
    """
    model = task.model
    allowed = tuple(t for t in (task.sharding_types or INTRA_HOST_TYPES) if t in INTRA_HOST_TYPES)
    if not allowed:
        raise SpecError("no sharding type usable inside a host", source="--sharding-types",
                        fix="allow table_wise, column_wise or row_wise")
    g = layout.gpus_per_host
    out = []
    for h in range(layout.hosts):
        idx = layout.host_tables(h)
        if not idx:
            out.append(HostPlan(h, (), None, None))
            continue
        sub = replace(model, name=f"{model.name}:host{h}", dense=None,
                      tables=tuple(model.tables[t] for t in idx))
        st = ShardingTask(model=sub, topology=task.topology, memory_bytes=task.memory_bytes,
                          sharding_types=allowed, cost=task.cost)
        plan = get_planner(planner).plan(st, g, seed=seed, time_limit_s=time_limit_s)
        out.append(HostPlan(h, idx, plan, st))
    return tuple(out)


