"""``hugectr_auto``: HugeCTR's ``auto`` and ``hier_auto`` sharding plans, the ``SHARDING_PLAN``
of NVIDIA's MLPerf DLRM-DCNv2 submissions (``--sharding_plan``, ``--mem_comm_bw_ratio``,
``--dp_sharding_threshold``, ``--memory_cap_for_embedding``).

Its rule, read from the submissions' ``sharding`` package (no step cost of ours plays a part):

- **Buckets.** ``auto``: one bucket per GPU. ``hier_auto``: one per node, its memory the GPUs'
  together; every GPU of a node then holds all of the node's tables.
- **Cost of a bucket**: ``hotness + table cost``. Hotness sums, over the bucket's shards, the
  table's multi-hot size (pooling factor) over its split count; table cost is
  ``mem_comm_bw_ratio / mem_comm_work_ratio`` per shard held (each shard sends a pooled
  vector per sample). Memory sums each table's bytes over its split count, against
  ``memory_cap_gb`` per bucket (default: the task's capacity per device, HBM less the reserve or
  ``--memory``); the bytes are the plan's memory model's (weights and optimizer state), so a
  plan that passes here fits the devices (HugeCTR counts 8 B per element with Adagrad).
- **Data-parallel tables**: those whose rows × dim × 8 B (4 with SGD: HugeCTR's count) are under
  ``dp_threshold_gb`` (GB, 10⁹ B) are replicated; their memory comes off every bucket's cap.
- **Search.** Start with every other table whole. Up to ``max_iterations`` times: deal the
  shards hottest first, each to the cheapest bucket (ties: the lower index) that holds no shard
  of its table and has memory left; keep the plan and its cost (the costliest bucket's), then
  split the hottest table that can still double (to at most the bucket count). A shard that
  fits nowhere doubles its own table's split instead; when it cannot, the search stops.
- **Pick** the cheapest plan kept; the first candidate, kept before any search, splits every
  table over every bucket and wins ties.

Under ``auto`` (HugeCTR's ``Uniform`` communication) a table on one bucket is ``table_wise``;
split, it is ``subset_row_wise`` over its buckets' GPUs
(:func:`~planner.model.tables.shards.subset_row_wise`), whose partial sums the pooled
all-to-all carries to every sample's rank. Under ``hier_auto`` (``Hierarchical``
communication, which the submissions set for more than one node) every table is
``hierarchical_row_wise`` over its nodes' GPUs
(:func:`~planner.model.tables.shards.hierarchical_row_wise`): HugeCTR's hierarchical embedding
first reduces each node's partial sums inside the node, over NVLink, and only the reduced
vectors cross nodes, each to its sample's rank.

>>> hotness_cost([100.0, 27.0, 12.0], [4, 1, 1], [[0, 1], [0], [0, 2]], table_cost=2.25)
[56.5, 27.25, 41.5]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from simulator.errors import SpecError

from planner.model.tables.memory import table_bytes
from planner.model.tables.plan import Plan, PlannerStats, make_plan
from planner.model.tables.shards import (TableSharding, data_parallel, hierarchical_row_wise,
                                          subset_row_wise, table_wise)
from planner.model.tables.spec import TableSpec
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["HugeCtrAutoPlanner", "HugeCtrSettings", "hotness_cost", "search", "MODES"]

MODES = ("auto", "hier_auto")


@dataclass(frozen=True)
class HugeCtrSettings:
    """The planner's settings under HugeCTR's names and defaults (its ``train.py``):
    ``mem_comm_bw_ratio`` the system's memory over communication bandwidth (default H100's
    3.35 TB/s HBM over 450 GB/s NVLink), ``mem_comm_work_ratio`` the network's memory over
    communication work (8 / 2), ``memory_cap_gb`` per GPU for embeddings (GB; None, the
    default: the task's capacity per device, where HugeCTR assumes 60),
    ``dp_threshold_gb`` (GB; 0: no table replicated), ``max_iterations`` (20)."""

    mode: str = "auto"
    mem_comm_bw_ratio: float = 3.35e12 / 450e9
    mem_comm_work_ratio: float = 8 / 2
    memory_cap_gb: float | None = None
    dp_threshold_gb: float = 0.0
    max_iterations: int = 20

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise SpecError(f"unknown HugeCTR sharding plan {self.mode!r}", source="--planner-set",
                            field="mode", fix="use mode=auto or mode=hier_auto")
        for name in ("mem_comm_bw_ratio", "mem_comm_work_ratio", "memory_cap_gb"):
            v = getattr(self, name)
            if v is None and name == "memory_cap_gb":
                continue
            if not (isinstance(v, (int, float)) and 0 < v < math.inf):
                raise SpecError(f"{name} must be a positive number, got {v!r}",
                                source="--planner-set", field=name,
                                fix=f"pass e.g. --planner-set {name}=9")
        if not 0 <= self.dp_threshold_gb < math.inf:
            raise SpecError(f"dp_threshold_gb must be ≥ 0 GB, got {self.dp_threshold_gb!r}",
                            source="--planner-set", field="dp_threshold_gb",
                            fix="pass GB, e.g. --planner-set dp_threshold_gb=0.008")
        if not (isinstance(self.max_iterations, int) and self.max_iterations >= 1):
            raise SpecError(f"max_iterations must be a whole number ≥ 1, got "
                            f"{self.max_iterations!r}", source="--planner-set",
                            field="max_iterations", fix="pass e.g. --planner-set max_iterations=20")

    @property
    def table_cost(self) -> float:
        """Cost of one shard in a bucket, in hotness units."""
        return self.mem_comm_bw_ratio / self.mem_comm_work_ratio


def hotness_cost(hot, splits, buckets, *, table_cost: float) -> list[float]:
    """Each bucket's cost: Σ hot[t] / splits[t] over the tables ``t`` in it, plus
    ``table_cost`` per table held."""
    return [sum(hot[t] / splits[t] for t in b) + table_cost * len(b) for b in buckets]


def _deal(hot, splits, size_gb, tables, n: int, cap_gb: float, table_cost: float):
    """Deal the shards of ``tables`` (``splits[t]`` each, hottest first) over ``n`` buckets;
    (buckets, None) or (None, the table whose shard fit nowhere)."""
    shards = sorted(((hot[t] / splits[t], t) for t in tables for _ in range(splits[t])),
                    key=lambda x: (-x[0], x[1]))
    buckets: list[list[int]] = [[] for _ in range(n)]
    cost, mem = [0.0] * n, [0.0] * n
    for h, t in shards:
        share = size_gb[t] / splits[t]
        for b in sorted(range(n), key=lambda k: (cost[k], k)):
            if t not in buckets[b] and mem[b] + share <= cap_gb:
                buckets[b].append(t)
                cost[b] += h + table_cost
                mem[b] += share
                break
        else:
            return None, t
    return buckets, None


def search(hot, size_gb, n: int, s: HugeCtrSettings, *, dp_gb=None
           ) -> tuple[list[list[int]], list[int], float]:
    """HugeCTR's search (module docstring) over ``n`` buckets of ``s.memory_cap_gb`` each:
    (the model-parallel tables in each bucket, the data-parallel tables, the winning cost).
    ``hot`` are the tables' multi-hot sizes, ``size_gb`` their memory (GB), ``dp_gb`` what the
    data-parallel threshold compares (default ``size_gb``)."""
    T = len(hot)
    dp_gb = size_gb if dp_gb is None else dp_gb
    if sum(size_gb) / n > s.memory_cap_gb:
        raise SpecError(f"HugeCTR's plan runs out of memory even with every table split over "
                        f"{n} buckets ({sum(size_gb) / n:.1f} GB each, cap {s.memory_cap_gb:g})",
                        source="--planner-set", field="memory_cap_gb",
                        fix="raise memory_cap_gb, or plan for more GPUs")
    dp = [t for t in range(T) if dp_gb[t] < s.dp_threshold_gb]
    cap = s.memory_cap_gb - sum(size_gb[t] for t in dp)
    if cap < 0:
        raise SpecError(f"the data-parallel tables take {sum(size_gb[t] for t in dp):.2f} GB, "
                        f"more than memory_cap_gb {s.memory_cap_gb:g}", source="--planner-set",
                        field="dp_threshold_gb", fix="lower dp_threshold_gb")
    mp = [t for t in range(T) if t not in dp]
    everywhere = [n] * T
    candidates = [(max(hotness_cost(hot, everywhere, [list(range(T))] * n,
                                    table_cost=s.table_cost)), [list(mp) for _ in range(n)], dp)]
    splits = [1] * T
    for _ in range(s.max_iterations):
        buckets, full = _deal(hot, splits, size_gb, mp, n, cap, s.table_cost)
        if buckets is None:
            if splits[full] * 2 > n:
                break
            splits[full] *= 2
            continue
        candidates.append((max(hotness_cost(hot, splits, buckets, table_cost=s.table_cost)),
                           buckets, dp))
        hottest = sorted(mp, key=lambda t: (-hot[t] / splits[t], t))
        for t in hottest:
            if splits[t] * 2 <= n:
                splits[t] *= 2
                break
        else:
            break                      # nothing splits further: every later round is this one
    best = min(range(len(candidates)), key=lambda i: (candidates[i][0], i))
    cost, buckets, dp_tables = candidates[best]
    return buckets, list(dp_tables), cost


class HugeCtrAutoPlanner:
    """HugeCTR's ``auto`` / ``hier_auto`` sharding plan (see the module docstring)."""

    name = "hugectr_auto"

    def __init__(self, settings: HugeCtrSettings | None = None, **options) -> None:
        self.settings = settings or HugeCtrSettings(**options)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        t0 = time.perf_counter()
        s = self.settings
        if task.sharding_types is not None:
            raise SpecError("HugeCTR's plan chooses its own layouts", source="--sharding-types",
                            fix="drop --sharding-types with --planner hugectr_auto")
        problem = prepare(task, devices)
        model = problem.model
        hosts = problem.hosts
        if s.mode == "hier_auto" and len(hosts) < 2:
            raise SpecError("hier_auto plans over nodes and needs more than one",
                            source="--planner-set", field="mode",
                            fix="use mode=auto on one node")
        per_elem = 4 if model.optimizer == "sgd" else 8
        hot = [float(t.pooling_factor) for t in model.tables]
        dp_gb = [t.num_embeddings * t.embedding_dim * per_elem * 1e-9 for t in model.tables]
        size_gb = [table_bytes(t, model.optimizer) * 1e-9 for t in model.tables]
        groups = [tuple(h) for h in hosts] if s.mode == "hier_auto" else \
            [(r,) for r in range(devices)]
        cap = s.memory_cap_gb if s.memory_cap_gb is not None else \
            min(problem.capacity_bytes) * 1e-9
        tuned = replace(s, memory_cap_gb=cap * len(groups[0]))
        buckets, dp, cost = search(hot, size_gb, len(groups), tuned, dp_gb=dp_gb)
        layouts = [data_parallel(i, t.name, t.num_embeddings, t.embedding_dim, devices)
                   if i in dp else _layout(i, t, [g for b, g in zip(buckets, groups) if i in b],
                                           s.mode)
                   for i, t in enumerate(model.tables)]
        notes = [f"{s.mode}: mem_comm_bw_ratio {s.mem_comm_bw_ratio:g}, mem_comm_work_ratio "
                 f"{s.mem_comm_work_ratio:g}, memory_cap_gb {cap:.4g}, "
                 f"dp_threshold_gb {s.dp_threshold_gb:g}; HugeCTR cost {cost:.4g}"]
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, tuple(layouts), self.name, stats)


def _layout(i: int, t: TableSpec, held: list[tuple[int, ...]], mode: str) -> TableSharding:
    """Table ``i``'s layout on the GPUs of the buckets ``held`` (each a bucket's ranks)."""
    rows, dim = t.num_embeddings, t.embedding_dim
    if mode == "hier_auto":
        return hierarchical_row_wise(i, t.name, rows, dim, held)
    ranks = [r for g in held for r in g]
    if len(ranks) == 1:
        return table_wise(i, t.name, rows, dim, ranks[0])
    return subset_row_wise(i, t.name, rows, dim, ranks)
