"""Alpha-beta time of a collective on a cost matrix, for a given rank order.

``order[k]`` is the matrix rank (VM) that plays collective rank ``k``. Costs come from a
:class:`~simulator.costmatrix.CostMatrix`: ``α(i, j)`` its one-way latency and ``β(i, j)`` its
bandwidth for one stream alone. Streams that run at the same time share links when the matrix
carries :class:`~simulator.costmatrix.Sharing`: a link of capacity C used by m concurrent streams
gives each C / m, and a stream's rate is the smallest share along its way (never more than β).

Models (M = message bytes per rank, n = ranks):

* **ring all-reduce** (reduce-scatter then all-gather, 2(n − 1) steps of M/n bytes, every rank
  sending to the next at once)::

      T = (2(n − 1)/n) · Σ_k α(π_k, π_k+1)  +  2(n − 1) · max_k (M/n) / r_k

  Bandwidth: every step is paced by the slowest (contended) link of the ring, r_k the rate of
  hop k with all n hops running. Latency: the ring is pipelined, so a chunk's latency accumulates
  hop by hop as it travels round the ring: 2(n − 1) hops of the ring's mean latency. With equal
  latencies this is the textbook 2(n − 1)(α + M/(nβ)). :func:`ring_allreduce_time_sync` gives the
  fully synchronous variant (each step max_k (α_k + (M/n)/r_k)), an upper bound.
* **tree all-reduce** (binary tree over the order, reduce up then broadcast down, pipelined)::

      T = 2 · max over leaves of Σ α along the path to the root  +  2 · M / min_edge r_e

  with all tree edges of one direction active together (a parent receives from two children).
* **hierarchical all-reduce** (groups = consecutive blocks of ``g`` ranks in the order):
  reduce-scatter inside every group (rings of g, M/g bytes per step), all-reduce across groups
  (g rings, one per position in the group, on M/g bytes each), all-gather inside every group;
  all rings of a phase run at once and the slowest sets the phase's time::

      T = 2 · max_groups RS_g(M) + max_columns AR_G(M/g)

  with RS_p(B) = ((p − 1)/p) Σ α + (p − 1)(B/p)/r_min and AR_p(B) = 2 · RS_p(B).
* **all-to-all** (pairwise exchange, n − 1 steps; in step s rank k sends M/n bytes to k + s)::

      T = Σ_s max_k (α(π_k, π_k+s) + (M/n) / r_{k,s})
"""

from __future__ import annotations

import numpy as np

from simulator.costmatrix import CostMatrix

__all__ = ["stream_rates", "ring_allreduce_time", "ring_allreduce_time_sync",
           "tree_allreduce_time", "alltoall_time", "hierarchical_allreduce_time",
           "concurrent_rings_time", "collective_time", "COLLECTIVES",
           "ring_edge_cost"]

COLLECTIVES = ("allreduce", "tree", "alltoall", "hierarchical")


def stream_rates(cm: CostMatrix, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Rate (bytes/s) of each of the concurrent streams ``src[k] → dst[k]`` (matrix ranks)."""
    rate = cm.bandwidth_Bps[src, dst].astype(float)
    if cm.sharing is None:
        return rate
    for lv in cm.sharing.levels:
        gs, gd = lv.group[src], lv.group[dst]
        cross = gs != gd
        if not cross.any():
            continue
        ng = len(lv.capacity_Bps)
        up = np.bincount(gs[cross], minlength=ng)
        down = np.bincount(gd[cross], minlength=ng)
        share = np.minimum(lv.capacity_Bps[gs] / np.maximum(up[gs], 1),
                           lv.capacity_Bps[gd] / np.maximum(down[gd], 1))
        rate = np.where(cross, np.minimum(rate, share), rate)
    return rate


def _ring_hops(order) -> tuple[np.ndarray, np.ndarray]:
    o = np.asarray(order, dtype=np.int64)
    return o, np.roll(o, -1)


def ring_allreduce_time(cm: CostMatrix, order, nbytes: float) -> float:
    """Pipelined ring all-reduce time, seconds (model in the module docstring)."""
    src, dst = _ring_hops(order)
    n = len(src)
    if n < 2:
        return 0.0
    lat = cm.latency_s[src, dst]
    rate = stream_rates(cm, src, dst)
    return float(2 * (n - 1) / n * lat.sum() + 2 * (n - 1) * (nbytes / n) / rate.min())


def ring_allreduce_time_sync(cm: CostMatrix, order, nbytes: float) -> float:
    """Synchronous ring all-reduce: 2(n − 1) steps, each max_k (α_k + (M/n)/r_k), seconds."""
    src, dst = _ring_hops(order)
    n = len(src)
    if n < 2:
        return 0.0
    step = cm.latency_s[src, dst] + (nbytes / n) / stream_rates(cm, src, dst)
    return float(2 * (n - 1) * step.max())


def tree_allreduce_time(cm: CostMatrix, order, nbytes: float) -> float:
    """Binary-tree all-reduce (reduce + broadcast, pipelined), seconds."""
    o = np.asarray(order, dtype=np.int64)
    n = len(o)
    if n < 2:
        return 0.0
    child = np.arange(1, n)
    parent = (child - 1) // 2
    depth_lat = np.zeros(n)
    up_lat = cm.latency_s[o[child], o[parent]]
    down_lat = cm.latency_s[o[parent], o[child]]
    for c, p, a, b in zip(child, parent, up_lat, down_lat):   # parents precede children
        depth_lat[c] = depth_lat[p] + max(a, b)
    r_up = stream_rates(cm, o[child], o[parent])
    r_down = stream_rates(cm, o[parent], o[child])
    return float(2 * depth_lat.max() + nbytes / r_up.min() + nbytes / r_down.min())


def alltoall_time(cm: CostMatrix, order, nbytes: float) -> float:
    """Pairwise-exchange all-to-all of ``nbytes`` per rank (M/n to each peer), seconds."""
    o = np.asarray(order, dtype=np.int64)
    n = len(o)
    total = 0.0
    chunk = nbytes / n
    for s in range(1, n):
        dst = np.roll(o, -s)
        step = cm.latency_s[o, dst] + chunk / stream_rates(cm, o, dst)
        total += float(step.max())
    return total


def concurrent_rings_time(cm: CostMatrix, rings: np.ndarray, nbytes: float, *,
                          passes: int = 2) -> float:
    """Rings (rows of matrix ranks) running at once, ``nbytes`` each: the slowest ring's time.

    ``passes`` 2 is an all-reduce, 1 a reduce-scatter or an all-gather.
    """
    g, p = rings.shape
    if p < 2:
        return 0.0
    src = rings.ravel()
    dst = np.roll(rings, -1, axis=1).ravel()
    lat = cm.latency_s[src, dst].reshape(g, p).sum(axis=1)
    rate = stream_rates(cm, src, dst).reshape(g, p).min(axis=1)
    return float((passes * (p - 1) / p * lat + passes * (p - 1) * (nbytes / p) / rate).max())


def hierarchical_allreduce_time(cm: CostMatrix, order, nbytes: float, *,
                                group_size: int) -> float:
    """Two-level all-reduce over blocks of ``group_size`` consecutive ranks, seconds."""
    o = np.asarray(order, dtype=np.int64)
    g = int(group_size)
    if g < 1 or len(o) % g:
        raise ValueError(f"{len(o)} ranks do not split into groups of {g}")
    groups = o.reshape(-1, g)
    intra = concurrent_rings_time(cm, groups, nbytes, passes=1)
    inter = concurrent_rings_time(cm, groups.T.copy(), nbytes / g, passes=2)
    return 2 * intra + inter


_TIME = {"allreduce": ring_allreduce_time, "tree": tree_allreduce_time,
         "alltoall": alltoall_time}


def collective_time(cm: CostMatrix, kind: str, order, nbytes: float, *,
                    group_size: int | None = None) -> float:
    """Model time of collective ``kind`` (one of :data:`COLLECTIVES`) in ``order``."""
    if kind == "hierarchical":
        return hierarchical_allreduce_time(cm, order, nbytes, group_size=group_size or 1)
    return _TIME[kind](cm, order, nbytes)


def ring_edge_cost(cm: CostMatrix, nbytes: float) -> np.ndarray:
    """Symmetric per-hop cost for the ring TSP: α + (M/n)/β averaged over both directions.

    A ring may run either way round, so the TSP works on the mean of the two directions.
    """
    n = cm.n
    c = cm.latency_s + (nbytes / n) / np.where(cm.bandwidth_Bps > 0, cm.bandwidth_Bps, np.inf)
    c = 0.5 * (c + c.T)
    np.fill_diagonal(c, 0.0)
    return c
