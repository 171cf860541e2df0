"""Collectives as flows: algorithms, NCCL-like automatic choice, and stand-alone timing.

>>> from simulator.topology import load_topology
>>> topo = load_topology("dgx-a100")
>>> res = simulate_collective(topo, "allreduce", range(8), 2**30, algo="ring")
>>> res.algorithm, round(res.busbw_Bps / 1e9)  # doctest: +SKIP
('ring', 229)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import simpy

from simulator.collectives import algorithms as alg
from simulator.collectives.plan import BUSBW_FACTOR, KINDS, CollectivePlan, Phase
from simulator.errors import SpecError
from simulator.network import FlowNetwork
from simulator.network.maxmin import maxmin_rates
from simulator.topology import Topology

__all__ = ["ALGORITHMS", "plan_collective", "run_plan", "simulate_collective", "CollectiveResult",
           "CollectivePlan", "Phase", "KINDS", "BUSBW_FACTOR"]

#: algorithm name -> (builder, kinds it implements)
ALGORITHMS: dict[str, tuple[Callable[..., CollectivePlan], tuple[str, ...]]] = {
    "ring": (alg.ring, ("allreduce", "allgather", "reducescatter", "broadcast")),
    "tree": (alg.tree, ("allreduce",)),
    "hierarchical": (alg.hierarchical, ("allreduce",)),
    "nvls_tree": (lambda t, r, s, k: alg.hierarchical(t, r, s, k, intra="nvls", inter="tree"),
                  ("allreduce",)),
    "halving_doubling": (alg.halving_doubling, ("allreduce", "allgather", "reducescatter")),
    "nvls": (alg.nvls, ("allreduce", "allgather", "reducescatter")),
    "direct": (alg.alltoall_direct, ("alltoall",)),
    "pairwise": (alg.alltoall_pairwise, ("alltoall",)),
}

#: NCCL's default candidates per kind (NCCL_ALGO unset); the fastest predicted one wins.
_AUTO = {"allreduce": ("ring", "tree", "nvls", "nvls_tree"), "allgather": ("ring", "nvls"),
         "reducescatter": ("ring", "nvls"), "broadcast": ("ring",), "alltoall": ("direct",)}


def _eligible(topo: Topology, name: str, ranks: Sequence[int]) -> bool:
    h = topo.hierarchy
    if name in ("nvls", "nvls_tree"):
        if h is None or not h.node_switch_reduces:
            return False
        per_node: dict[int, int] = {}
        for r in ranks:
            per_node[int(h.node_of_gpu[r])] = per_node.get(int(h.node_of_gpu[r]), 0) + 1
        if name == "nvls":
            return len(per_node) == 1
        return len(per_node) > 1 and len(set(per_node.values())) == 1 and min(per_node.values()) > 1
    return True


def _parse_hier(algo: str):
    """``hier:INTRA+INTER`` → a builder of the per-tier hierarchical all-reduce."""
    intra, plus, inter = algo[5:].partition("+")
    if not plus:
        raise SpecError(f"bad per-tier algorithm {algo!r}", field="--algo",
                        fix="write hier:INTRA+INTER, e.g. hier:nvls+tree or hier:ring+ring")
    return lambda t, r, s, k, **kw: alg.hierarchical(t, r, s, k, intra=intra, inter=inter)


def plan_collective(topo: Topology, kind: str, ranks: Sequence[int], size_bytes: float, *,
                    algo: str = "auto", splits=None) -> CollectivePlan:
    """Decompose a collective into flows; ``algo='auto'`` picks the fastest as NCCL's tuner
    rates them (ring against tree with the tuner's bandwidth model, :func:`_tuner_tree_time`).

    Parameters
    ----------
    kind:
        One of allreduce, allgather, reducescatter, alltoall, broadcast.
    ranks:
        Global GPU indices in the collective's rank order (its ring order).
    size_bytes:
        nccl-tests convention (see :class:`CollectivePlan`).
    algo:
        ``auto`` or a name from :data:`ALGORITHMS`.
    splits:
        All-to-all only: an n×n matrix of bytes from rank i to rank j (uneven splits).
    """
    if kind not in _AUTO:
        raise SpecError(f"unknown collective {kind!r}", field="kind",
                        fix=f"use one of: {', '.join(_AUTO)}")
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise SpecError("a collective needs at least one rank", field="ranks", fix="pass ranks")
    if len(set(ranks)) != len(ranks):
        raise SpecError("a rank appears twice in the group", field="ranks",
                        fix="list each rank once")
    if size_bytes < 0:
        raise SpecError(f"size must be non-negative, got {size_bytes}", field="--size",
                        fix="pass a byte count such as 1GiB")
    kw = {"splits": splits} if kind == "alltoall" else {}
    if algo == "auto":
        cands = [a for a in _AUTO[kind] if _eligible(topo, a, ranks)]
        if len(cands) == 1:
            return ALGORITHMS[cands[0]][0](topo, ranks, size_bytes, kind, **kw)
        plans = [ALGORITHMS[a][0](topo, ranks, size_bytes, kind, **kw) for a in cands]
        times = [_uncontended_time(topo, p) for p in plans]
        if "ring" in cands and "tree" in cands and len(ranks) > 1:
            i_r, i_t = cands.index("ring"), cands.index("tree")
            times[i_t] = _tuner_tree_time(plans[i_r], times[i_r], plans[i_t], len(ranks))
        return plans[int(np.argmin(times))]
    if algo.startswith("hier:"):
        if kind != "allreduce":
            raise SpecError(f"per-tier algorithms implement allreduce, not {kind}",
                            field="--algo", fix="use --algo ring")
        return _parse_hier(algo)(topo, ranks, size_bytes, kind)
    if algo not in ALGORITHMS:
        raise SpecError(f"unknown algorithm {algo!r}", field="--algo",
                        fix=f"use auto, hier:INTRA+INTER or one of: {', '.join(ALGORITHMS)}")
    builder, kinds = ALGORITHMS[algo]
    if kind not in kinds:
        raise SpecError(f"algorithm {algo} does not implement {kind}", field="--algo",
                        fix=f"for {kind} use: {', '.join(a for a, (_, k) in ALGORITHMS.items() if kind in k)}")
    return builder(topo, ranks, size_bytes, kind, **kw)


def _tuner_tree_time(ring_plan: CollectivePlan, ring_s: float, tree_plan: CollectivePlan,
                     n: int) -> float:
    """The tree all-reduce's time *as NCCL's tuner rates it* when it picks between ring and tree.

    NCCL (``src/graph/tuning.cc``, ``ncclTopoTuneModel``) gives both algorithms the same bus
    bandwidth per channel, takes 0.92 of it for tree, and converts bus to algorithm bandwidth
    with a ratio of 0.5 for tree but ``n / (2(n - 1))`` for ring: in its model the tree's
    bandwidth term is ``n / (0.92 (n - 1))`` times the ring's, so it picks tree only where
    latency dominates (small messages, many nodes). The flows of a tree on few nodes move
    less inter-node data than a ring (on 2 nodes nccl-tests shows tree bus bandwidth above the
    NIC line rate), a gain the tuner does not see: NCCL runs ring there, and so does ``auto``.
    The chosen algorithm is then timed by its own flows."""
    lat_r = sum(ph.latency_s for ph in ring_plan.phases)
    lat_t = sum(ph.latency_s for ph in tree_plan.phases)
    return lat_t + max(0.0, ring_s - lat_r) * n / (0.92 * (n - 1))


def _uncontended_time(topo: Topology, plan: CollectivePlan) -> float:
    cap = topo.effective_capacity_Bps()
    total = 0.0
    for ph in plan.phases:
        rt = ph.routes
        rates = maxmin_rates(rt.flow, rt.link, rt.frac, cap, rt.n_flows)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(ph.nbytes > 0, ph.nbytes / rates, 0.0)
        total += ph.latency_s + (float(t.max()) if t.size else 0.0)
    return total


def run_plan(env: simpy.Environment, net: FlowNetwork, plan: CollectivePlan):
    """SimPy process body: run the plan's phases in order on ``net``."""
    for ph in plan.phases:
        if ph.latency_s > 0:
            yield env.timeout(ph.latency_s)
        yield net.transfer(ph.routes, ph.nbytes)


@dataclass(frozen=True, slots=True)
class CollectiveResult:
    """Time of one collective alone on the topology, with nccl-tests' bandwidth figures."""

    kind: str
    algorithm: str
    ranks: int
    size_bytes: float
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    channels: int
    mode: str
    flows: int
    events: int

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}


def simulate_collective(topo: Topology, kind: str, ranks: Sequence[int], size_bytes: float, *,
                        algo: str = "auto", mode: str = "explicit", splits=None
                        ) -> CollectiveResult:
    """Simulate one collective alone on an idle network and report time and bandwidths."""
    plan = plan_collective(topo, kind, ranks, size_bytes, algo=algo, splits=splits)
    env = simpy.Environment()
    net = FlowNetwork(env, topo, mode=mode)
    env.process(run_plan(env, net, plan))
    env.run()
    t = float(env.now)
    n = len(plan.ranks)
    algbw = size_bytes / t if t > 0 else float("inf")
    return CollectiveResult(kind=kind, algorithm=plan.algorithm, ranks=n, size_bytes=size_bytes,
                            time_s=t, algbw_Bps=algbw, busbw_Bps=algbw * BUSBW_FACTOR(kind, n),
                            channels=plan.channels, mode=net.mode,
                            flows=net.stats.flows_started,
                            events=net.stats.flows_started + net.stats.flows_finished
                            + 2 * len(plan.phases))
