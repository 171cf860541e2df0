"""Routes: which links each flow crosses, and what fraction of its bytes each one carries.

Generated fabrics are routed arithmetically from their :class:`~simulator.topology.Hierarchy`
(one vectorised pass for any number of flows); hand-written graphs by graph search, with traffic
split evenly over equal-hop shortest paths at every branching (ideal per-hop ECMP). The search
runs backwards from a flow's destination only as far as its source and is kept for the next
flow to that destination (at most 1,024 destinations), so routing costs what the workload
routes: a ring all-reduce over a 4,096-device ring searches two levels per flow, not the ring. GPUs and
CPUs carry no transit traffic unless a device says ``transit: true``.

A flow may name a ``rail``: it then leaves and enters its hosts through the NICs of that rail
(NCCL keeps a channel on one rail; the hop from the GPU to a NIC of another rail goes over
NVLink, PXN-style, and is not modelled). A flow without a rail uses each GPU's own NIC.

Under ``routing: ecmp`` (:class:`~simulator.topology.model.Routing`) a flow is cut into
``qps`` sub-flows and each is pinned to one equal-cost path chosen by a hash of (seed, source,
destination, rail, sub-flow, level), as a switch hashes a queue pair's 5-tuple. On a generated
fabric the hash picks port ``j`` of the bundle at each level the flow climbs, and the flow comes
down the same level on port ``j`` of the destination's unit (in a folded Clos the ``j``-th
uplink of every unit of a tier reaches the same parent switch). This is a simplification where
a level's ports hang off several parent switches: each level's choice is drawn independently.
On a hand-written graph the hash picks one successor at every branching of the shortest-path
DAG. Each sub-flow carries ``1/qps`` of its flow's bytes; the flow moves at one rate, that of
its slowest sub-flow (NCCL deals a connection's chunks round-robin over its queue pairs).
With one path everywhere this is the ideal route.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.errors import SimulationError
from simulator.hashing import hash64
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

    def subset(self, keep: np.ndarray) -> "Routes":
        """The flows ``keep`` (a mask over flows) selects, renumbered in order."""
        ent = keep[self.flow]
        newid = np.cumsum(keep) - 1
        return Routes(int(keep.sum()), newid[self.flow[ent]], self.link[ent], self.frac[ent],
                      self.latency_s[keep])

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
    if topo.routing.ecmp:
        return _route_graph_ecmp(topo, src, dst)
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
    flows, links, hashed = [], [], []
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
            ua, ub = unit(k, a[use], rs[use]), unit(k, b[use], rd[use])
            flows += [c[use], c[use]]
            links += [h.up[k][ua], h.down[k][ub]]
            if k >= 1 and topo.routing.ecmp:
                hashed.append((k, c[use], s[use], d[use], rs[use], ua, ub))
    flow = np.concatenate(flows) if flows else np.zeros(0, np.int64)
    link = np.concatenate(links) if links else np.zeros(0, np.int64)
    if (link < 0).any():
        raise SimulationError(f"topology {topo.name}: a route climbs past the top tier")
    latency = np.bincount(flow, weights=lat[link], minlength=src.size)
    if hashed:
        return _ecmp_ports(topo, flow, link, latency, hashed)
    return Routes(int(src.size), flow, link, np.ones(link.size), latency)


def _ecmp_ports(topo: Topology, flow: np.ndarray, link: np.ndarray, latency: np.ndarray,
                hashed: list) -> Routes:
    """Replace the bundle legs of a tree route by hashed ports (``routing: ecmp``).

    ``hashed`` lists per level ``k`` the flows that climb it with their source, destination,
    rail, and source and destination units; each flow becomes ``qps`` sub-flows of ``1/qps``
    of its bytes, sub-flow ``q`` going up port ``j`` of the source unit and down port ``j`` of
    the destination unit, ``j`` a hash of (seed, source, destination, rail, q, k). Latencies
    stay those of the bundles (a port has its bundle's latency)."""
    h, rt = topo.hierarchy, topo.routing
    bundle = np.zeros(topo.links.latency_s.size, dtype=bool)
    flows, links, fracs = [], [], []
    q = np.arange(rt.qps)
    for k, f, s, d, r, ua, ub in hashed:
        bundle[h.up[k][ua]] = True
        bundle[h.down[k][ub]] = True
        j = hash64(rt.seed, s[:, None], d[:, None], r[:, None], q[None, :], k)
        na, nb = h.port_count[k][ua][:, None], h.port_count[k][ub][:, None]
        up = h.port_first[k][ua][:, None] + 2 * (j % na.astype(np.uint64)).astype(np.int64)
        down = h.port_first[k][ub][:, None] + 2 * (j % nb.astype(np.uint64)).astype(np.int64) + 1
        ff = np.repeat(f, rt.qps)
        flows += [ff, ff]
        links += [up.ravel(), down.ravel()]
        fracs.append(np.full(2 * ff.size, 1.0 / rt.qps))
    keep = ~bundle[link]
    return Routes(latency.size, np.concatenate([flow[keep]] + flows),
                  np.concatenate([link[keep]] + links),
                  np.concatenate([np.ones(int(keep.sum()))] + fracs), latency)


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


def _route_graph_ecmp(topo: Topology, src, dst) -> Routes:
    """Hand-written graph under ``routing: ecmp``: each of a flow's ``qps`` sub-flows follows
    one shortest path, a hashed successor at every branching (see the module docstring)."""
    rt = topo.routing
    table = _pair_table(topo)
    flows, links, lats = [], [], np.zeros(src.size)
    for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist())):
        if s == d:
            continue
        for q in range(rt.qps):
            ids, lt = table.path(s, d, q)
            flows.append(np.full(len(ids), i))
            links.append(ids)
            lats[i] = max(lats[i], lt)
    if not flows:
        z = np.zeros(0, np.int64)
        return Routes(int(src.size), z, z, np.zeros(0), lats)
    flow = np.concatenate(flows)
    return Routes(int(src.size), flow, np.concatenate(links), np.full(flow.size, 1.0 / rt.qps),
                  lats)


_PAIR_CACHE: dict[int, object] = {}
#: destinations whose search state is kept (least recently used dropped): bounds memory on
#: large graphs, where every destination's full table would take O(nodes²)
_BALLS = 1024


class _Ball:
    """Breadth-first search backwards from one destination, grown level by level on demand.

    A route from ``s`` needs the distances of the nodes no farther than ``s``; a neighbour in
    a ring of 4,096 devices then costs two levels, not the whole graph."""

    __slots__ = ("g", "transit", "dist", "frontier")

    def __init__(self, g, transit: dict, d: str) -> None:
        self.g, self.transit = g, transit
        self.dist = {d: 0}
        self.frontier = [d]

    def grown_to(self, s: str) -> dict[str, int]:
        """Distances with every level up to ``s``'s complete (all, if ``s`` is unreachable)."""
        while s not in self.dist and self.frontier:
            self._level()
        return self.dist

    def _level(self) -> None:
        dist, transit, nxt = self.dist, self.transit, []
        for v in self.frontier:
            for u in self.g.predecessors(v):
                if u not in dist:
                    dist[u] = dist[v] + 1
                    if transit[u]:
                        nxt.append(u)
        self.frontier = nxt


def _pair_table(topo: Topology):
    key = id(topo)
    if key in _PAIR_CACHE and _PAIR_CACHE[key][0] is topo:
        return _PAIR_CACHE[key][1]
    g = topo.graph
    transit = {n: bool(a.get("transit", a.get("kind") not in ("gpu", "cpu")))
               for n, a in g.nodes(data=True)}

    @lru_cache(maxsize=_BALLS)
    def ball(d: str) -> _Ball:
        return _Ball(g, transit, d)

    def dist_to(s: str, d: str) -> dict[str, int]:
        """Hop distances to ``d`` of every node at most as far as ``s`` (the nodes a shortest
        path from ``s`` can use); a breadth-first search grown only that far."""
        return ball(d).grown_to(s)

    @lru_cache(maxsize=None)
    def pair(s_rank: int, d_rank: int):
        s, d = topo.gpus[s_rank], topo.gpus[d_rank]
        dist = dist_to(s, d)
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

    index = {n: i for i, n in enumerate(g.nodes)}

    @lru_cache(maxsize=None)
    def path(s_rank: int, d_rank: int, q: int) -> tuple[np.ndarray, float]:
        """Link ids and latency (s) of sub-flow ``q``'s hashed shortest path."""
        s, d = topo.gpus[s_rank], topo.gpus[d_rank]
        dist = dist_to(s, d)
        if s not in dist:
            raise SimulationError(f"topology {topo.name}: no route from {s} to {d}")
        ids, lat, v = [], 0.0, s
        while v != d:
            nxt = [w for w in g.successors(v) if dist.get(w) == dist[v] - 1
                   and (w == d or transit[w])]
            w = nxt[int(hash64(topo.routing.seed, s_rank, d_rank, q, index[v]) % len(nxt))]
            e = g.edges[v, w]
            ids.append(e["id"])
            lat += e["latency"]
            v = w
        return np.asarray(ids, dtype=np.int64), lat

    pair.path = path
    _PAIR_CACHE[key] = (topo, pair)
    return pair
