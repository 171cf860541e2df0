"""Closed-form collective times of an embedding plan's ranks: ``alpha + bytes / Bps`` per
collective and a per-rank all-to-all with intra- and inter-host bandwidths, fitted to the
simulator's own collectives on the plan's topology (:func:`calibrate_comm`), so a slower fabric
or a multi-node plan costs what the simulator says. Used by :class:`~.cost.CostModel`."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from simulator.collectives import simulate_collective
from simulator.topology import Topology, load_topology

__all__ = ["CommModel", "SyncCommModel", "calibrate_comm", "calibrate_cached"]


@dataclass(frozen=True)
class CommModel:
    """Closed-form collective times for ranks ``0..n-1`` of a topology, fitted to the simulator.

    Attributes
    ----------
    n : int
    node_of : numpy.ndarray
        Host index of each rank.
    node_size : numpy.ndarray
        Ranks of the group in each rank's host.
    a2a_alpha_s : float
        Fixed time of one all-to-all, seconds.
    intra_Bps, inter_Bps : float
        Per-rank all-to-all bandwidth to peers inside / outside the host, bytes/s
        (``inf`` where a rank has no such peers).
    fits : Mapping[str, tuple[float, float]]
        ``(alpha_s, Bps)`` per collective: ``reducescatter``, ``allgather``, ``allreduce``
        over all ranks and ``host_reducescatter``, ``host_allgather`` inside one host;
        time = alpha + size / Bps (nccl-tests sizes).
    source : str
    """

    n: int
    node_of: np.ndarray
    node_size: np.ndarray
    a2a_alpha_s: float
    intra_Bps: float
    inter_Bps: float
    fits: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    source: str = ""

    def time(self, kind: str, size_bytes):
        """Seconds of collective ``kind`` of ``size_bytes`` (0 when the size is 0)."""
        alpha, bw = self.fits.get(kind, (0.0, math.inf))
        s = np.asarray(size_bytes, dtype=float)
        return np.where(s > 0, alpha + s / bw, 0.0)

    def a2a_times(self, owned_bytes: np.ndarray) -> np.ndarray:
        """Per-rank all-to-all time, seconds, when rank r exchanges ``owned_bytes[..., r]`` with
        each peer one way and each peer q exchanges ``owned_bytes[..., q]`` with r the other way:
        ``alpha + max(send, recv)_intra / bw_intra + max(send, recv)_inter / bw_inter``.
        """
        y = np.asarray(owned_bytes, dtype=float)
        total = y.sum(axis=-1, keepdims=True)
        onehot = _onehot(self.node_of.tobytes(), self.node_of.dtype.str)
        if onehot is None:
            node_sum = total
        else:
            node_sum = (y @ onehot)[..., self.node_of]                 # (..., n)
        g = self.node_size
        send_i = y * (g - 1)
        recv_i = node_sum - y
        t = np.maximum(send_i, recv_i) / self.intra_Bps
        if self.n > g.min():
            send_e = y * (self.n - g)
            recv_e = total - node_sum
            t = t + np.maximum(send_e, recv_e) / self.inter_Bps
        return self.a2a_alpha_s + t


@functools.lru_cache(maxsize=64)
def _onehot(node_of: bytes, dtype: str) -> np.ndarray | None:
    """``(ranks, hosts)`` indicator of each rank's host (None for one host), memoised: the
    planners price thousands of candidate plans on one topology."""
    nodes = np.frombuffer(node_of, dtype=np.dtype(dtype))
    count = int(nodes.max()) + 1
    return None if count == 1 else np.eye(count)[nodes]


@functools.lru_cache(maxsize=32)
def calibrate_cached(ref: str, n: int) -> CommModel:
    """:func:`calibrate_comm` on ranks ``0..n-1`` of the topology ``ref`` names, kept for the
    32 latest (reference, ranks): a planner prices many plans on one topology."""
    return calibrate_comm(load_topology(ref), n, ref=ref)


def calibrate_comm(topo: Topology, n: int, *, ref: str | None = None) -> CommModel:
    """Fit :class:`CommModel` to the simulator's collectives on ranks ``0..n-1`` of ``topo``.

    Each fit runs the collective alone at 1 MiB and 256 MiB and takes the line through both.
    The all-to-all bandwidths come from one uniform exchange inside a host and one in which every
    rank sends only to other hosts (over at most 4 hosts, to keep calibration fast).
    """
    mode = "symmetric" if n > 64 else "explicit"
    node_of = np.array([topo.node_of(r) for r in range(n)])
    _, inv, counts = np.unique(node_of, return_inverse=True, return_counts=True)
    node_of = inv.astype(int)
    node_size = counts[node_of].astype(float)
    s1, s2 = float(2 ** 20), float(2 ** 28)

    def fit(kind: str, ranks: Sequence[int]) -> tuple[float, float]:
        if len(ranks) < 2:
            return 0.0, math.inf
        t1 = simulate_collective(topo, kind, ranks, s1, mode=mode).time_s
        t2 = simulate_collective(topo, kind, ranks, s2, mode=mode).time_s
        bw = (s2 - s1) / max(t2 - t1, 1e-15)
        return max(0.0, t1 - s1 / bw), bw

    ranks = list(range(n))
    host0 = [r for r in ranks if node_of[r] == 0]
    fits = {"reducescatter": fit("reducescatter", ranks), "allgather": fit("allgather", ranks),
            "allreduce": fit("allreduce", ranks),
            "host_reducescatter": fit("reducescatter", host0),
            "host_allgather": fit("allgather", host0)}
    alpha = 0.0
    if n > 1:
        alpha = simulate_collective(topo, "alltoall", ranks, 64.0 * n, mode=mode).time_s
    intra = math.inf
    if len(host0) > 1:
        m = len(host0)
        a0 = simulate_collective(topo, "alltoall", host0, 64.0 * m).time_s
        t = simulate_collective(topo, "alltoall", host0, s2).time_s
        intra = (s2 * (m - 1) / m) / max(t - a0, 1e-15)
    inter = math.inf
    hosts = int(node_of.max()) + 1
    if hosts > 1:
        sub = [r for r in ranks if node_of[r] < min(hosts, 4)]
        k = len(sub)
        per = s2 / k
        mat = np.array([[per if node_of[i] != node_of[j] else 0.0 for j in sub] for i in sub])
        a0 = simulate_collective(topo, "alltoall", sub, 64.0 * k, mode=mode).time_s
        t = simulate_collective(topo, "alltoall", sub, s2, splits=mat, mode=mode).time_s
        inter = float(mat.sum(axis=1).max()) / max(t - a0, 1e-15)
    return CommModel(n=n, node_of=node_of, node_size=node_size, a2a_alpha_s=float(alpha),
                     intra_Bps=float(intra), inter_Bps=float(inter), fits=fits,
                     source=f"fitted to simulate_collective on {ref or topo.name}, "
                            f"ranks 0..{n - 1}")


@dataclass(frozen=True)
class SyncCommModel(CommModel):
    """A :class:`CommModel` whose all-to-all is one synchronising exchange: every rank takes
    ``alpha + v / Bps`` with ``v = mean + uneven_weight · (max − mean)`` of the ranks'
    ``max(sent, received)``. The gloo fits of the CPU profile use it: with the processes
    sharing a few cores, per-rank all-to-all times do not follow per-rank volumes (measured
    within-plan correlation ≈ 0), all finish together; and a rank that sends more than the
    others is helped by their idle cores, so the exchange takes less than the busiest rank's
    equal exchange would (``uneven_weight`` < 1, fitted to the calibration's uneven
    all-to-alls: :func:`planner.measure.tables.fit_comm.fit_comm_profile`; 1 where the
    profile predates it)."""

    uneven_weight: float = 1.0

    def a2a_times(self, owned_bytes: np.ndarray) -> np.ndarray:
        t = CommModel.a2a_times(self, owned_bytes)
        top = t.max(axis=-1, keepdims=True)
        sync = t.mean(axis=-1, keepdims=True) + self.uneven_weight * (top - t.mean(axis=-1,
                                                                                keepdims=True))
        return np.broadcast_to(sync, t.shape).copy()
