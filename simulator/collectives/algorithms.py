"""Collective algorithms decomposed into flows on the topology.

Each function takes the topology, the ranks (global GPU indices, in the collective's rank
order) and the size, and returns a :class:`CollectivePlan`. Conventions follow NCCL:

* **ring**: one ring in rank order, split into channels; inside a node the ring hops over NVLink,
  between nodes channel ``k`` crosses on rail ``k`` (NCCL keeps a channel on one NIC rail), so a
  full node uses all its NICs. Pipelined: one phase, ``steps × alpha`` of latency.
* **tree**: NCCL's tree: a chain through each node's GPUs and a double binary tree over the
  nodes (each tree carries half the data, reduce and broadcast pipelined together).
* **hierarchical**: reduce-scatter inside each node, ring all-reduce across nodes between GPUs of
  the same local index (size / GPUs per node each), all-gather inside each node.
* **halving_doubling**: recursive halving reduce-scatter then recursive doubling all-gather
  (Rabenseifner), one phase per step; needs a power-of-two group.
* **nvls**: in-switch reduction (NVLink SHARP): every GPU sends its data to the node switch,
  which reduces and multicasts; one node, a switch with ``in_switch_reduction``.
* **direct** / **pairwise** all-to-all: all pairs at once, or ``n − 1`` rounds of shifted pairs.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np

from simulator.collectives.plan import CollectivePlan, Phase
from simulator.errors import SpecError
from simulator.network.route import Routes, route, route_to_node_switch
from simulator.topology import Topology

__all__ = ["ring", "tree", "hierarchical", "halving_doubling", "nvls", "alltoall_direct",
           "alltoall_pairwise", "sendrecv", "dbt_parents"]

_RING_FACTOR = {"allreduce": (2.0, 2), "allgather": (1.0, 1), "reducescatter": (1.0, 1)}


def _nodes(topo: Topology, ranks: np.ndarray) -> np.ndarray:
    h = topo.hierarchy
    if h is not None:
        return h.node_of_gpu[ranks]
    return np.array([topo.node_of(int(r)) for r in ranks])


def _rails_per_node(topo: Topology, ranks: np.ndarray) -> list[int]:
    """Rails a group can use on every one of its nodes: distinct NIC rails of its GPUs there."""
    h = topo.hierarchy
    if h is None or h.nics_per_node == 0:
        return [-1]
    nodes = h.node_of_gpu[ranks]
    pairs = np.unique(np.stack([h.rail_of_gpu[ranks], nodes], axis=1), axis=0)
    rails, nodes_on = np.unique(pairs[:, 0], return_counts=True)
    common = rails[nodes_on == np.unique(nodes).size]
    return common.tolist() if common.size else [int(h.rail_of_gpu[ranks[0]])]


def _edge_flows(topo: Topology, src: np.ndarray, dst: np.ndarray, rails: list[int]) -> Routes:
    """Route edges once per channel; inter-node edges of channel k ride rail ``rails[k]``."""
    nodes_s, nodes_d = _nodes(topo, src), _nodes(topo, dst)
    cross = nodes_s != nodes_d
    parts = []
    for r in rails:
        if r < 0 or not cross.any():
            parts.append(route(topo, src, dst))
        else:
            rail = np.where(cross, r, -1)
            rail = np.where(cross, rail, topo.hierarchy.rail_of_gpu[src])
            parts.append(route(topo, src, dst, rail))
    return Routes.concat(parts)


def _latency(topo: Topology, routes: Routes, algo: str, steps: float, size: float = 0.0) -> float:
    """``steps × (alpha + path latency)`` plus the algorithm's local per-byte pass over ``size``."""
    path = float(routes.latency_s.max()) if routes.n_flows else 0.0
    return steps * (topo.comm.alpha(algo) + path) + topo.comm.local_time(algo, size)


def _ring_latency(topo: Topology, routes: Routes, steps: float, size: float) -> float:
    """A pipelined ring's first chunk travels ``steps`` hops around the ring, so it pays the
    mean hop latency of the ring's edges ``steps`` times (intra-node hops are cheap, the few
    inter-node ones dear), plus ``alpha`` per step and the local pass."""
    mean_path = float(routes.latency_s.sum()) / routes.n_flows if routes.n_flows else 0.0
    return steps * (topo.comm.alpha("ring") + mean_path) + topo.comm.local_time("ring", size)


def ring(topo: Topology, ranks: Sequence[int], size: float, kind: str) -> CollectivePlan:
    """Ring all-reduce / all-gather / reduce-scatter / broadcast (pipelined chain)."""
    r = np.asarray(ranks, dtype=np.int64)
    n = len(r)
    if n == 1:
        return CollectivePlan(kind, "ring", tuple(r.tolist()), size, ())
    if kind == "broadcast":
        per_edge, steps = float(size), n - 1
    else:
        mult, sf = _RING_FACTOR[kind]
        per_edge, steps = mult * (n - 1) / n * size, sf * (n - 1)
    routes, c = _ring_routes(topo, r, kind == "broadcast")
    nbytes = np.full(routes.n_flows, per_edge / c)
    phase = Phase(routes, nbytes, _ring_latency(topo, routes, steps, size), "ring")
    return CollectivePlan(kind, "ring", tuple(r.tolist()), size, (phase,), channels=c)


def _ring_routes(topo: Topology, r: np.ndarray, chain: bool) -> tuple[Routes, int]:
    """Routes of the ring (or, with ``chain``, the open chain) over ``r``, one set of edges per
    channel, and the channel count."""
    def make():
        rails = _rails_per_node(topo, r)
        src, dst = (r[:-1], r[1:]) if chain else (r, np.roll(r, -1))
        return _edge_flows(topo, src, dst, rails), len(rails)
    return topo.memoized(("ring", chain, r.tobytes()), make)


@functools.lru_cache(maxsize=256)
def dbt_parents(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Parents (−1 for the root) of positions 0..m−1 in the two trees of a double binary tree.

    Tree A, as NCCL builds it: position ``p ≥ 1`` with lowest set bit ``b`` has children
    ``p ± b/2``, so odd positions are leaves; the largest power of two below ``m`` is the top,
    hung under position 0. Tree B mirrors A (``p → m − 1 − p``) when ``m`` is even and shifts it
    by one when odd, so a position interior in one tree is a leaf in the other and every rank
    sends and receives at most twice its share: the bandwidth of a ring at log latency.

    >>> [int(x) for x in dbt_parents(8)[0]]
    [-1, 2, 4, 2, 0, 6, 4, 6]
    """
    pa = np.full(m, -1)

    def up(q: int) -> int:          # in-order parent: q ± lowbit(q), toward lowbit 2·lowbit
        b = q & -q
        return q - b if q & (b << 1) else q + b

    if m > 1:
        top = 1 << ((m - 1).bit_length() - 1)
        pa[top] = 0
        for p in range(1, m):
            if p != top:
                q = up(p)
                while q >= m:       # parent missing in a short tree: climb to an ancestor
                    q = up(q)
                pa[p] = q
    if m % 2 == 0:
        perm = m - 1 - np.arange(m)
    else:
        perm = (np.arange(m) + 1) % m
    pb = np.full(m, -1)
    pb[perm] = np.where(pa >= 0, perm[np.maximum(pa, 0)], -1)
    pa.setflags(write=False)
    pb.setflags(write=False)
    return pa, pb


def _depth(parents: np.ndarray) -> int:
    """Edges on the longest path from a position up to the root (parent −1)."""
    depth = np.zeros(len(parents), dtype=np.int64)
    up = np.asarray(parents)
    while (up >= 0).any():
        depth += up >= 0
        up = np.where(up >= 0, parents[np.maximum(up, 0)], -1)
    return int(depth.max()) if depth.size else 0


def tree(topo: Topology, ranks: Sequence[int], size: float, kind: str = "allreduce"
         ) -> CollectivePlan:
    """NCCL-style tree all-reduce: intra-node chains plus a double binary tree across nodes."""
    if kind != "allreduce":
        raise SpecError(f"the tree algorithm implements allreduce, not {kind}",
                        field="--algo", fix="use --algo ring")
    r = np.asarray(ranks, dtype=np.int64)
    if len(r) == 1:
        return CollectivePlan(kind, "tree", tuple(r.tolist()), size, ())
    routes, share, steps, c = topo.memoized(("tree", r.tobytes()), lambda: _tree_shape(topo, r))
    phase = Phase(routes, share * size, _latency(topo, routes, "tree", steps, size), "tree")
    return CollectivePlan(kind, "tree", tuple(r.tolist()), size, (phase,), channels=c)


def _tree_shape(topo: Topology, r: np.ndarray) -> tuple[Routes, np.ndarray, int, int]:
    """The tree all-reduce's flows over ``r``: routes, each flow's share of the size, the
    steps a chunk takes (down and up), and the channel count.

    Per channel: a chain inside each node from its leader (the member on the channel's rail,
    else its first member) through the other members in group order, each edge both ways,
    then the double binary tree over the leaders in order of their nodes' first appearance.
    """
    nodes = _nodes(topo, r)
    _, first, inv = np.unique(nodes, return_index=True, return_inverse=True)
    appear = np.empty(first.size, dtype=np.int64)
    appear[np.argsort(first, kind="stable")] = np.arange(first.size)
    node_pos = appear[inv.ravel()]              # node of each member, in appearance order
    m = first.size
    rails = _rails_per_node(topo, r)
    c = len(rails)
    h = topo.hierarchy
    idx = np.arange(r.size)
    first_member = np.full(m, r.size)
    np.minimum.at(first_member, node_pos, idx)
    chain_len = int(np.bincount(node_pos).max()) - 1
    trees = dbt_parents(m) if m > 1 else ()
    src_p, dst_p, share_p, rail_p = [], [], [], []
    for rail in rails:
        lead = first_member.copy()
        if h is not None and rail >= 0:
            on = h.rail_of_gpu[r] == rail
            on_first = np.full(m, r.size)
            np.minimum.at(on_first, node_pos[on], idx[on])
            lead = np.where(on_first < r.size, on_first, lead)
        # members in chain order: by node, the leader first, then the rest in group order
        is_lead = idx == lead[node_pos]
        order = np.lexsort((idx, ~is_lead, node_pos))
        a, b = order[:-1], order[1:]
        same = node_pos[a] == node_pos[b]
        a, b = r[a[same]], r[b[same]]
        pairs_s = [np.stack([b, a], axis=1).ravel()]
        pairs_d = [np.stack([a, b], axis=1).ravel()]
        shares = [np.full(2 * a.size, 1 / c)]
        leaders = r[lead]
        for parents in trees:
            i = np.flatnonzero(parents >= 0)
            li, lp = leaders[i], leaders[parents[i]]
            pairs_s.append(np.stack([li, lp], axis=1).ravel())
            pairs_d.append(np.stack([lp, li], axis=1).ravel())
            shares.append(np.full(2 * i.size, 1 / (2 * c)))
        src_p += pairs_s
        dst_p += pairs_d
        share_p += shares
        rail_p += [np.full(2 * a.size, -1)] + [np.full(x.size, rail) for x in pairs_s[1:]]
    src, dst = np.concatenate(src_p), np.concatenate(dst_p)
    rail_arr = np.concatenate(rail_p)
    if h is not None:
        rail_arr = np.where(rail_arr >= 0, rail_arr, h.rail_of_gpu[src])
        routes = route(topo, src, dst, rail_arr)
    else:
        routes = route(topo, src, dst)
    depth = _depth(trees[0]) if m > 1 else 0
    return routes, np.concatenate(share_p), 2 * (depth + chain_len), c


_INTRA = {"ring": lambda t, m, s, k: ring(t, m, s, k), "nvls": lambda t, m, s, k: nvls(t, m, s, k)}


def hierarchical(topo: Topology, ranks: Sequence[int], size: float, kind: str = "allreduce", *,
                 intra: str = "ring", inter: str = "ring") -> CollectivePlan:
    """All-reduce by tier: reduce-scatter inside each node (``intra``: ring or nvls), all-reduce
    of each 1/G shard across nodes between GPUs of the same local index (``inter``: ring, tree
    or halving_doubling), all-gather inside each node. ``intra=nvls, inter=tree`` is NCCL's
    NVLSTree."""
    if kind != "allreduce":
        raise SpecError(f"the hierarchical algorithm implements allreduce, not {kind}",
                        field="--algo", fix="use --algo ring")
    inter_fn = {"ring": ring, "tree": tree, "halving_doubling": halving_doubling}.get(inter)
    if intra not in _INTRA or inter_fn is None:
        raise SpecError(f"unknown tier algorithms intra={intra!r}, inter={inter!r}",
                        field="--algo", fix="use hier:INTRA+INTER with INTRA in ring|nvls and "
                                            "INTER in ring|tree|halving_doubling")
    r = np.asarray(ranks, dtype=np.int64)
    nodes = _nodes(topo, r)
    order = list(dict.fromkeys(nodes.tolist()))
    members = [r[nodes == nd] for nd in order]
    g = len(members[0])
    if any(len(m) != g for m in members):
        raise SpecError("hierarchical all-reduce needs the same number of ranks on every node",
                        field="--algo", fix="use --algo ring")
    phases = []
    if g > 1:
        parts = [_INTRA[intra](topo, m, size, "reducescatter").phases for m in members]
        phases += [_merge(list(ph), f"intra reduce-scatter ({intra})") for ph in zip(*parts)]
    if len(members) > 1:
        parts = [inter_fn(topo, [m[i] for m in members], size / g, "allreduce").phases
                 for i in range(g)]
        phases += [_merge(list(ph), f"inter all-reduce ({inter})") for ph in zip(*parts)]
    if g > 1:
        parts = [_INTRA[intra](topo, m, size, "allgather").phases for m in members]
        phases += [_merge(list(ph), f"intra all-gather ({intra})") for ph in zip(*parts)]
    name = "hierarchical" if (intra, inter) == ("ring", "ring") else f"hier:{intra}+{inter}"
    if inter != "halving_doubling":
        # NCCL pipelines the stages (chunks flow through all of them at once): one phase whose
        # flows carry each stage's bytes, paying every stage's latency once.
        phases = [Phase(Routes.concat([p.routes for p in phases]),
                        np.concatenate([p.nbytes for p in phases]),
                        sum(p.latency_s for p in phases), "pipelined tiers")]
    return CollectivePlan(kind, name, tuple(r.tolist()), size, tuple(phases))


def _merge(phases: list[Phase], label: str) -> Phase:
    return Phase(Routes.concat([p.routes for p in phases]),
                 np.concatenate([p.nbytes for p in phases]),
                 max(p.latency_s for p in phases), label)


def halving_doubling(topo: Topology, ranks: Sequence[int], size: float, kind: str
                     ) -> CollectivePlan:
    """Recursive halving (reduce-scatter) and doubling (all-gather); power-of-two groups."""
    r = np.asarray(ranks, dtype=np.int64)
    n = len(r)
    if n & (n - 1):
        raise SpecError(f"halving-doubling needs a power-of-two group, got {n} ranks",
                        field="--algo", fix="use --algo ring or a power-of-two group")
    if kind not in ("allreduce", "allgather", "reducescatter"):
        raise SpecError(f"halving-doubling does not implement {kind}", field="--algo",
                        fix="use --algo ring")
    idx = np.arange(n)
    phases = []
    steps = int(math.log2(n)) if n > 1 else 0
    rs = [(n >> (k + 1), size / (2 ** (k + 1))) for k in range(steps)]
    seq = []
    if kind in ("allreduce", "reducescatter"):
        seq += [("rs", d, b) for d, b in rs]
    if kind in ("allreduce", "allgather"):
        seq += [("ag", d, b) for d, b in reversed(rs)]
    for tag, d, b in seq:
        routes = route(topo, r, r[idx ^ d])
        phases.append(Phase(routes, np.full(n, b), _latency(topo, routes, "halving_doubling", 1),
                            f"{tag} distance {d}"))
    return CollectivePlan(kind, "halving_doubling", tuple(r.tolist()), size, tuple(phases))


def nvls(topo: Topology, ranks: Sequence[int], size: float, kind: str = "allreduce"
         ) -> CollectivePlan:
    """In-switch reduction inside one node: each GPU sends S(1 + 1/n) up and receives it back."""
    r = np.asarray(ranks, dtype=np.int64)
    h = topo.hierarchy
    nodes = _nodes(topo, r)
    if h is None or not h.node_switch_reduces or len(set(nodes.tolist())) != 1:
        raise SpecError("nvls needs all ranks on one node whose switch has in_switch_reduction",
                        field="--algo", fix="use --algo ring, or a topology with NVLink SHARP")
    n = len(r)
    factor = {"allreduce": 1 + 1 / n, "allgather": 1 / n, "reducescatter": 1.0}[kind]
    back = {"allreduce": 1 + 1 / n, "allgather": 1.0, "reducescatter": 1 / n}[kind]
    routes = Routes.concat([route_to_node_switch(topo, r, to_switch=True),
                            route_to_node_switch(topo, r, to_switch=False)])
    nbytes = np.concatenate([np.full(n, factor * size), np.full(n, back * size)])
    phase = Phase(routes, nbytes, _latency(topo, routes, "nvls", 2, size), "nvls")
    return CollectivePlan(kind, "nvls", tuple(r.tolist()), size, (phase,))


def _a2a_matrix(n: int, size: float, splits) -> np.ndarray:
    if splits is None:
        m = np.full((n, n), size / n)
    else:
        m = np.asarray(splits, dtype=float)
        if m.shape != (n, n) or (m < 0).any():
            raise SpecError(f"all-to-all splits must be a non-negative {n}×{n} byte matrix",
                            field="splits", fix="give one row of byte counts per sending rank")
    m = m.copy()
    np.fill_diagonal(m, 0.0)
    return m


def alltoall_direct(topo: Topology, ranks: Sequence[int], size: float, kind: str = "alltoall",
                    *, splits=None) -> CollectivePlan:
    """All pairs at once (NCCL's grouped send/recv); ``splits[i][j]`` bytes from i to j."""
    r = np.asarray(ranks, dtype=np.int64)
    n = len(r)
    m = _a2a_matrix(n, size, splits)
    i, j = np.nonzero(m)
    routes = route(topo, r[i], r[j])
    phase = Phase(routes, m[i, j], _latency(topo, routes, "direct", 1), "direct")
    return CollectivePlan("alltoall", "direct", tuple(r.tolist()), size, (phase,))


def alltoall_pairwise(topo: Topology, ranks: Sequence[int], size: float, kind: str = "alltoall",
                      *, splits=None) -> CollectivePlan:
    """``n − 1`` rounds; in round k rank i sends to rank (i + k) mod n."""
    r = np.asarray(ranks, dtype=np.int64)
    n = len(r)
    m = _a2a_matrix(n, size, splits)
    idx = np.arange(n)
    phases = []
    for k in range(1, n):
        j = (idx + k) % n
        routes = route(topo, r, r[j])
        phases.append(Phase(routes, m[idx, j], _latency(topo, routes, "pairwise", 1), f"round {k}"))
    return CollectivePlan("alltoall", "pairwise", tuple(r.tolist()), size, tuple(phases))


def sendrecv(topo: Topology, src: int, dst: int, size: float) -> CollectivePlan:
    """One point-to-point message from global rank ``src`` to ``dst``."""
    routes = route(topo, [src], [dst])
    phase = Phase(routes, np.array([float(size)]), _latency(topo, routes, "p2p", 1), "p2p")
    return CollectivePlan("sendrecv", "p2p", (src, dst), size, (phase,))
