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

from dataclasses import dataclass, replace
from typing import Sequence

from simulator.errors import SpecError

from planner.model.tables.plan import Plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import Problem, ShardingTask
from planner.model.dmt import TowerModuleSpec

__all__ = ["Tower", "TowerLayout", "host_groups", "make_layout", "shard_hosts", "HostPlan",
           "with_module", "INTRA_HOST_TYPES"]

#: types a table may use inside its host (TorchRec's tower sharder offers table-row-wise and
#: table-column-wise, rewritten to row-wise and column-wise over the host; table-wise is the
#: one-shard case of column-wise)
INTRA_HOST_TYPES = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tower:
    """One tower: table indices (into the model spec), its host, the tables' embedding dims,
    pooled widths in (``Σ dims``) and out (after the module)."""

    index: int
    tables: tuple[int, ...]
    host: int
    dims: tuple[int, ...]
    in_width: int
    out_width: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TowerLayout:
    """Towers over ``hosts`` hosts of ``gpus_per_host`` GPUs, with one module spec for all."""

    towers: tuple[Tower, ...]
    hosts: int
    gpus_per_host: int
    module: TowerModuleSpec

    def host_tables(self, h: int) -> tuple[int, ...]:
        return tuple(sorted(t for tw in self.towers if tw.host == h for t in tw.tables))

    def host_towers(self, h: int) -> tuple[Tower, ...]:
        return tuple(tw for tw in self.towers if tw.host == h)

    def tower_of_table(self) -> dict[int, int]:
        return {t: tw.index for tw in self.towers for t in tw.tables}

    def to_dict(self, model: ModelSpec) -> dict:
        return {"num_towers": len(self.towers), "hosts": self.hosts,
                "gpus_per_host": self.gpus_per_host, "module": self.module.to_dict(),
                "towers": [{"tower": tw.index, "host": tw.host,
                            "tables": [model.tables[t].name for t in tw.tables],
                            "in_width": tw.in_width, "module_width": tw.out_width}
                           for tw in self.towers]}


def host_groups(problem: Problem) -> tuple[tuple[int, ...], ...]:
    """The problem's ranks per host; all hosts must have the same number of GPUs."""
    hosts = problem.hosts
    sizes = {len(h) for h in hosts}
    if len(sizes) != 1:
        raise SpecError(f"DMT needs the same number of GPUs on every host, got "
                        f"{sorted(len(h) for h in hosts)}", source="--devices",
                        fix=f"use a multiple of {max(sizes)} devices")
    return hosts


def make_layout(model: ModelSpec, groups: Sequence[Sequence[int]], tower_hosts: Sequence[int],
                *, hosts: int, gpus_per_host: int, module: TowerModuleSpec) -> TowerLayout:
    """A layout from feature groups (table indices) and the host of each group."""
    seen: set[int] = set()
    towers = []
    for k, (g, h) in enumerate(zip(groups, tower_hosts)):
        g = tuple(sorted(int(t) for t in g))
        if not g:
            raise SpecError(f"tower {k} has no tables", source="towers",
                            fix="use fewer towers than tables")
        if seen & set(g):
            raise SpecError(f"tower {k} repeats a table of another tower", source="towers",
                            fix="give every table to exactly one tower")
        seen |= set(g)
        if not 0 <= h < hosts:
            raise SpecError(f"tower {k} on host {h}, outside 0..{hosts - 1}", source="towers",
                            fix="place towers on existing hosts")
        dims = tuple(model.tables[t].embedding_dim for t in g)
        module.check(dims, tower=f"tower {k}")
        towers.append(Tower(index=k, tables=g, host=int(h), dims=dims, in_width=sum(dims),
                            out_width=module.out_width(dims)))
    if len(seen) != model.num_tables:
        missing = sorted(set(range(model.num_tables)) - seen)[:5]
        raise SpecError(f"tables {missing} are in no tower", source="towers",
                        fix="give every table to exactly one tower")
    return TowerLayout(towers=tuple(towers), hosts=hosts, gpus_per_host=gpus_per_host,
                       module=module)


@dataclass(frozen=True, slots=True)
class HostPlan:
    """One host's tables sharded over its GPUs: the sub-plan (local ranks ``0..G-1``, table
    indices of the sub-model) and the map back to the full model's table indices."""

    host: int
    tables: tuple[int, ...]
    plan: Plan | None
    task: ShardingTask | None


def shard_hosts(task: ShardingTask, layout: TowerLayout, *, planner: str = "greedy",
                seed: int = 0, time_limit_s: float | None = None) -> tuple[HostPlan, ...]:
    """Shard each host's tables over its ``G`` GPUs (table-, column- or row-wise inside it).

    The sub-task keeps the model's batch, optimizer and precision, has no dense part, and uses
    the task's topology (ranks ``0..G-1`` are host 0's, the same hardware as every host).
    """
    from planner.sharding.planners import get_planner
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


def with_module(layout: TowerLayout, module: TowerModuleSpec) -> TowerLayout:
    """The same towers with another module (output widths recomputed)."""
    for tw in layout.towers:
        module.check(tw.dims, tower=f"tower {tw.index}")
    towers = tuple(replace(tw, out_width=module.out_width(tw.dims)) for tw in layout.towers)
    return replace(layout, towers=towers, module=module)
