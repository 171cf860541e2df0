"""A sharding task (model + hardware context) and the resolved problem planners work on."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.model.tables.comm_model import calibrate_cached
from planner.model.tables.cost import CostModel
from planner.model.tables.cost_config import CostConfig
from planner.model.tables.memory import device_capacity_bytes
from planner.model.tables.shards import ALL_SHARDING_TYPES, HUGECTR_TYPES, ShardingType
from planner.model.tables.spec import ModelSpec

__all__ = ["ShardingTask", "Problem", "prepare", "default_topology_ref"]


def default_topology_ref(devices: int) -> str:
    """``dgx-a100:nodes=ceil(N/8)``: N A100 80 GB GPUs in DGX boxes on a rail-optimised fabric."""
    return f"dgx-a100:nodes={max(1, math.ceil(devices / 8))}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardingTask:
    """What to shard and under which constraints.

    Attributes
    ----------
    model : ModelSpec
    topology : str or None
        Topology reference for :func:`simulator.topology.load_topology`; None:
        :func:`default_topology_ref`. Ranks ``0..N-1`` of it are used.
    memory_bytes : int or None
        Memory per device for embedding shards, bytes; None: HBM less the reserve
        (:func:`~planner.model.tables.memory.device_capacity_bytes`).
    sharding_types : tuple of ShardingType or None
        Types any table may use (None: all); each table's own ``sharding_types`` narrows it.
    cost : CostConfig
    """

    model: ModelSpec
    topology: str | None = None
    memory_bytes: int | None = None
    sharding_types: tuple[ShardingType, ...] | None = None
    cost: CostConfig = field(default_factory=CostConfig)


class Problem:
    """A task resolved for ``devices`` ranks: topology, hosts, capacities and the cost model.

    Build with :func:`prepare` (cached, so planners called on the same task share it).
    """

    def __init__(self, task: ShardingTask, devices: int) -> None:
        if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
            raise SpecError(f"--devices must be a whole number ≥ 1, got {devices!r}",
                            source="--devices", fix="pass the number of GPUs, e.g. --devices 8")
        devices = int(devices)
        self.task = task
        self.model = task.model
        self.devices = devices
        self.topology_ref = task.topology or default_topology_ref(devices)
        topo = load_topology(self.topology_ref)
        if topo.num_gpus < devices:
            raise SpecError(f"topology {self.topology_ref} has {topo.num_gpus} GPUs, fewer than "
                            f"--devices {devices}", source="--topology",
                            fix=f"use a topology with ≥ {devices} GPUs (e.g. NAME:nodes=K) or "
                                "fewer devices")
        self.topology = topo
        hosts: dict[int, list[int]] = {}
        for r in range(devices):
            hosts.setdefault(topo.node_of(r), []).append(r)
        self.hosts = tuple(tuple(hosts[k]) for k in sorted(hosts))
        if task.memory_bytes is not None:
            if task.memory_bytes <= 0:
                raise SpecError(f"memory per device must be positive, got {task.memory_bytes}",
                                source="--memory", fix="pass e.g. --memory 4GiB")
            cap = int(task.memory_bytes)
        else:
            cap = device_capacity_bytes(topo.gpu.hbm_bytes, self.model,
                                        reserve_fraction=task.cost.reserve_fraction)
        self.capacity_bytes = tuple(cap for _ in range(devices))
        comm = calibrate_cached(self.topology_ref, devices)
        self.cost = CostModel(self.model, topo, devices, comm, self.hosts, task.cost)
        allowed = set(task.sharding_types or ALL_SHARDING_TYPES)
        self._allowed = [frozenset(s for s in ALL_SHARDING_TYPES
                                   if s in allowed and t.allows(s)) for t in self.model.tables]

    @property
    def num_tables(self) -> int:
        return self.model.num_tables

    def allowed(self, table: int, t: ShardingType) -> bool:
        """Whether table ``table`` may use type ``t`` (task and table constraints). HugeCTR's
        layouts (``subset_row_wise``, ``hierarchical_row_wise``), which no TorchRec planner
        chooses, are allowed wherever the task leaves the types open and the table does not
        restrict them."""
        if t in HUGECTR_TYPES:
            return self.task.sharding_types is None and self.model.tables[table].allows(t)
        return t in self._allowed[table]

    def allowed_types(self, table: int) -> frozenset[ShardingType]:
        return self._allowed[table]


@functools.lru_cache(maxsize=16)
def prepare(task: ShardingTask, devices: int) -> Problem:
    """The :class:`Problem` of ``task`` on ``devices`` ranks (cached per task and count)."""
    return Problem(task, devices)
