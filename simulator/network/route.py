"""Routes: which links each flow crosses, and what fraction of its bytes each one carries.

Generated fabrics are routed arithmetically from their :class:`~simulator.topology.Hierarchy`
(one vectorised pass for any number of flows); hand-written graphs by graph search, with traffic
split evenly over equal-hop shortest paths at every branching (ideal per-hop ECMP). GPUs and
CPUs carry no transit traffic unless a device says ``transit: true``.

A flow may name a ``rail``: it then leaves and enters its hosts through the NICs of that rail
(NCCL keeps a channel on one rail; the hop from the GPU to a NIC of another rail goes over
NVLink, PXN-style, and is not modelled). A flow without a rail uses each GPU's own NIC.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.errors import SimulationError
from simulator.topology import Topology

__all__ = ["Routes", "route", "route_to_node_switch"]


@dataclass(frozen=True, slots=True)
class Routes:
    """Flows as a sparse (flow × link) matrix in coordinate form.

    Attributes
    ----------
    n_flows : int
    flow, link : np.ndarray of int64
        One entry per (flow, link) the flow crosses.
    frac : np.ndarray of float
        Fraction of the flow's bytes on that link (1.0 on a single path; < 1 under ECMP).
    latency_s : np.ndarray of float, shape (n_flows,)
        One-way latency of each flow's path (the longest branch under ECMP), seconds.
    """

    n_flows: int
    flow: np.ndarray
    link: np.ndarray
    frac: np.ndarray
    latency_s: np.ndarray

    @staticmethod
    def concat(parts: list["Routes"]) -> "Routes":
        offs = np.cumsum([0] + [p.n_flows for p in parts])
        return Routes(int(offs[-1]),
                      np.concatenate([p.flow + o for p, o in zip(parts, offs)]),
                      np.concatenate([p.link for p in parts]),
                      np.concatenate([p.frac for p in parts]),
                      np.concatenate([p.latency_s for p in parts]))


def route(topo: Topology, src, dst, rail=None) -> Routes:
    """Route flows between global GPU ranks ``src[i] → dst[i]`` (optionally on ``rail[i]``)."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if src.shape != dst.shape:
        raise ValueError("src and dst must have the same shape")
    n = topo.num_gpus
    if src.size and (src.min() < 0 or dst.min() < 0 or src.max() >= n or dst.max() >= n):
        raise SimulationError(f"rank out of range for topology {topo.name} with {n} GPUs")
    if topo.hierarchy is not None:
        r = None if rail is None else np.broadcast_to(np.asarray(rail, dtype=np.int64), src.shape)
        return _route_tree(topo, src, dst, r)
    return _route_graph(topo, src, dst)


def route_to_node_switch(topo: Topology, gpus, *, to_switch: bool) -> Routes:
    """Flows between GPUs and their own node's switch (NVLink SHARP style in-switch reduction)."""
    h = topo.hierarchy
    if h is None:
        raise SimulationError(f"topology {topo.name} has no node switch to reduce in")
    g = np.asarray(gpus, dtype=np.int64)
    link = (h.gpu_up if to_switch else h.gpu_down)[g]
    return Routes(len(g), np.arange(len(g)), link, np.ones(len(g)), topo.links.latency_s[link])


def _route_tree(topo: Topology, src, dst, rail) -> Routes:
    h = topo.hierarchy
    lat = topo.links.latency_s
    ns, nd = h.node_of_gpu[src], h.node_of_gpu[dst]
    fid = np.arange(src.size)
    flows, links = [], []
    same = (ns == nd) & (src != dst)
    flows += [fid[same], fid[same]]
    links += [h.gpu_up[src[same]], h.gpu_down[dst[same]]]
    cross = ns != nd
    if cross.any():
        if h.nics_per_node == 0 or len(h.up) < 2:
            raise SimulationError(f"topology {topo.name}: GPUs on different nodes but no fabric "
                                  "joins them")
        c = fid[cross]
        s, d, a, b = src[cross], dst[cross], ns[cross], nd[cross]
        rs = h.rail_of_gpu[s] if rail is None else rail[cross]
        rd = h.rail_of_gpu[d] if rail is None else rail[cross]
        if (rs < 0).any() or (rs >= h.nics_per_node).any():
            raise SimulationError(f"rail out of range 0..{h.nics_per_node - 1}")
        own_s, own_d = rs == h.rail_of_gpu[s], rd == h.rail_of_gpu[d]
        flows += [c[own_s], c[own_d]]
        links += [h.gpu_nic_up[s[own_s]], h.gpu_nic_down[d[own_d]]]

        def unit(k, node, r):
            m = h.rail_mult[k]
            return h.node_unit[k][node] * m + r if m else h.node_unit[k][node]

        levels = len(h.node_unit)
        lca = np.full(c.size, -1)
        for k in range(1, levels):
            hit = (lca < 0) & (unit(k, a, rs) == unit(k, b, rd))
            lca[hit] = k
        if (lca < 0).any():
            raise SimulationError(f"topology {topo.name}: no route between some nodes")
        for k in range(levels - 1):
            use = lca > k
            flows += [c[use], c[use]]
            links += [h.up[k][unit(k, a[use], rs[use])], h.down[k][unit(k, b[use], rd[use])]]
    flow = np.concatenate(flows) if flows else np.zeros(0, np.int64)
    link = np.concatenate(links) if links else np.zeros(0, np.int64)
    if (link < 0).any():
        raise SimulationError(f"topology {topo.name}: a route climbs past the top tier")
    latency = np.bincount(flow, weights=lat[link], minlength=src.size)
    return Routes(int(src.size), flow, link, np.ones(link.size), latency)


def _route_graph(topo: Topology, src, dst) -> Routes:
    table = _pair_table(topo)
    flows, links, fracs, lats = [], [], [], np.zeros(src.size)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        if s == d:
            continue
        ids, fr, lt = table(s, d)
        flows.append(np.full(len(ids), i))
        links.append(ids)
        fracs.append(fr)
        lats[i] = lt
    if not flows:
        z = np.zeros(0, np.int64)
        return Routes(int(src.size), z, z, np.zeros(0), lats)
    return Routes(int(src.size), np.concatenate(flows), np.concatenate(links),
                  np.concatenate(fracs), lats)


_PAIR_CACHE: dict[int, object] = {}


def _pair_table(topo: Topology):
    key = id(topo)
    if key in _PAIR_CACHE and _PAIR_CACHE[key][0] is topo:
        return _PAIR_CACHE[key][1]
    g = topo.graph
    transit = {n: bool(a.get("transit", a.get("kind") not in ("gpu", "cpu")))
               for n, a in g.nodes(data=True)}

    @lru_cache(maxsize=None)
    def dist_to(d: str) -> dict[str, int]:
        dist = {d: 0}
        frontier = [d]
        while frontier:
            nxt = []
            for v in frontier:
                for u in g.predecessors(v):
                    if u not in dist:
                        dist[u] = dist[v] + 1
                        if transit[u]:
                            nxt.append(u)
            frontier = nxt
        return dist

    @lru_cache(maxsize=None)
    def pair(s_rank: int, d_rank: int):
        s, d = topo.gpus[s_rank], topo.gpus[d_rank]
        dist = dist_to(d)
        if s not in dist:
            raise SimulationError(f"topology {topo.name}: no route from {s} to {d}",)
        share = {s: 1.0}
        reach = {s: 0.0}
        order = [s]
        frac_on: dict[int, float] = {}
        i = 0
        while i < len(order):
            v = order[i]
            i += 1
            if v == d:
                continue
            nxt = [w for w in g.successors(v) if dist.get(w) == dist[v] - 1
                   and (w == d or transit[w])]
            for w in nxt:
                e = g.edges[v, w]
                part = share[v] / len(nxt)
                frac_on[e["id"]] = frac_on.get(e["id"], 0.0) + part
                lat = reach[v] + e["latency"]
                if w not in share:
                    share[w] = 0.0
                    reach[w] = lat
                    order.append(w)
                share[w] += part
                reach[w] = max(reach[w], lat)
        ids = np.fromiter(frac_on.keys(), dtype=np.int64, count=len(frac_on))
        fr = np.fromiter(frac_on.values(), dtype=float, count=len(frac_on))
        return ids, fr, reach[d]

    _PAIR_CACHE[key] = (topo, pair)
    return pair
