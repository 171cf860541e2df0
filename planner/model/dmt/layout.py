"""Tower layouts: which features form each tower, which host serves it, and each host's
sharding plan of its tables (what the SPTT step is built from and what export writes)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from simulator.errors import SpecError

from planner.model.dmt.module import TowerModuleSpec
from planner.model.tables.plan import Plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import Problem, ShardingTask

__all__ = ["Tower", "TowerLayout", "host_groups", "make_layout", "HostPlan", "with_module",
           "INTRA_HOST_TYPES"]


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


def with_module(layout: TowerLayout, module: TowerModuleSpec) -> TowerLayout:
    """The same towers with another module (output widths recomputed)."""
    for tw in layout.towers:
        module.check(tw.dims, tower=f"tower {tw.index}")
    towers = tuple(replace(tw, out_width=module.out_width(tw.dims)) for tw in layout.towers)
    return replace(layout, towers=towers, module=module)
