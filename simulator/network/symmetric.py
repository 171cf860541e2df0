"""Symmetric mode: identical flows of a batch collapsed into classes over link classes.

Flows with the same bytes and the same multiset of link *classes* (tier, kind, direction,
bandwidth) are one class row with a multiplicity, and each link class carries its load spread
evenly over the links of that class the batch touches. Exact when traffic is spread evenly over
those links (rings, all-to-alls and regular groups on homogeneous fabrics), and orders of
magnitude cheaper than one row per flow at 16k+ GPUs.

A reduction depends only on the batch's routes and bytes, so :class:`ClassSpace` keeps the
reductions it made: a collective phase that runs again (the same bucket every micro-batch) costs
a lookup and a relabelling of its batch-private classes, not a new reduction.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.network.route import Routes
from simulator.topology import Topology

__all__ = ["ClassSpace", "link_classes", "symmetric_reduce"]

#: reductions a space remembers (each holds arrays the size of the batch's class rows)
CACHE_ENTRIES = 512


def link_classes(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Class id of every link and the capacity (bytes/s, effective) of one link of each class.

    Links are in one class when they share tier, kind, direction and bandwidth; classes are
    numbered in the order of their first link.
    """
    lt = topo.links
    n = len(lt)
    cap = topo.effective_capacity_Bps()
    key = np.zeros(n, dtype=np.int64)
    for column in (lt.tier, lt.kind, np.arange(n) % 2, np.asarray(lt.bandwidth_Bps, float)):
        codes, size = _codes(column)
        key = key * size + codes
    _, first, inv = np.unique(key, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    cls = rank[inv.ravel()]
    class_cap = np.zeros(first.size)
    class_cap[cls] = cap
    return cls, class_cap


def _codes(values) -> tuple[np.ndarray, int]:
    """Integer codes of a column (equal values, equal codes) and how many there are."""
    if isinstance(values, np.ndarray):
        uniq, inv = np.unique(values, return_inverse=True)
        return inv.ravel().astype(np.int64), max(uniq.size, 1)
    seen = {v: i for i, v in enumerate(dict.fromkeys(values))}
    codes = np.fromiter(map(seen.__getitem__, values), dtype=np.int64, count=len(values))
    return codes, max(len(seen), 1)


@dataclass(frozen=True)
class _Reduced:
    """A cached reduction. Link ids ``< 0`` are batch-private classes ``-1 - k``, numbered
    afresh every time the reduction is used; ``private_cap[k]`` is the capacity of class k."""

    routes: Routes
    nbytes: np.ndarray
    mult: np.ndarray
    private_cap: np.ndarray
    source: Routes          # the routes reduced (kept alive: the cache is keyed by its id)
    nbytes_in: np.ndarray   # the bytes reduced


class ClassSpace:
    """Link classes of a topology, extended on demand by per-batch refinements.

    ``capacity`` (bytes/s per class id) grows by doubling, so adding classes never copies
    it per batch; ``size`` ids are in use.
    """

    def __init__(self, topo: Topology) -> None:
        self.base, cap = topo.memoized(("link_classes",), lambda: link_classes(topo))
        self._cap = np.array(cap, dtype=float)
        self.size = cap.size
        self.refined: dict[tuple, int] = {}
        self._cache: OrderedDict[tuple, _Reduced] = OrderedDict()
        self.shapes: OrderedDict[tuple, _Shape] = OrderedDict()

    @property
    def capacity(self) -> np.ndarray:
        """Capacity of every class id in use, bytes/s (a view: read it again after a batch)."""
        return self._cap[:self.size]

    def new_class(self, cap: float) -> int:
        if self.size == self._cap.size:
            self._cap = np.concatenate([self._cap, np.zeros(max(self._cap.size, 64))])
        self._cap[self.size] = cap
        self.size += 1
        return self.size - 1

    def refine(self, key: tuple, cap: float) -> int:
        """The class id of a shared refinement ``key`` (created on first use)."""
        if key not in self.refined:
            self.refined[key] = self.new_class(cap)
        return self.refined[key]

    def reduce(self, routes: Routes, nbytes: np.ndarray, keep: np.ndarray
               ) -> tuple[Routes, np.ndarray, np.ndarray]:
        """:func:`symmetric_reduce` of the flows ``keep`` selects of a batch, from the cache
        when these routes and bytes were reduced before (its private classes get fresh ids)."""
        key = (id(routes), nbytes.size, hash(nbytes.tobytes()))
        red = self._cache.get(key)
        if red is None or red.source is not routes or not np.array_equal(red.nbytes_in, nbytes):
            red = _reduce(routes, nbytes, keep, self)
            self._cache[key] = red
            if len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        link = red.routes.link
        if red.private_cap.size:
            first = self.size
            for c in red.private_cap:
                self.new_class(float(c))
            link = np.where(link < 0, first + (-1 - link), link)
        r = red.routes
        return Routes(r.n_flows, r.flow, link, r.frac, r.latency_s), red.nbytes, red.mult


def _reduce(routes: Routes, nbytes: np.ndarray, keep: np.ndarray, space: ClassSpace
            ) -> _Reduced:
    """Reduce the ``keep`` flows, with private classes as placeholders ``-1 - k``."""
    priv: list[float] = []

    def private(cap: float) -> int:
        priv.append(cap)
        return -len(priv)

    sub = routes if keep.all() else routes.subset(keep)
    red, b, mult = symmetric_reduce(sub, nbytes[keep], space, private=private)
    return _Reduced(red, b, mult, np.asarray(priv, dtype=float), routes, nbytes.copy())


def symmetric_reduce(routes: Routes, nbytes: np.ndarray, space: ClassSpace, *, private=None
                     ) -> tuple[Routes, np.ndarray, np.ndarray]:
    """Collapse identical flows into classes; return (class routes, bytes, multiplicity).

    Links of one class (tier, kind, direction, bandwidth) touched by the batch become one class
    row keyed by the exact set of links, so concurrent batches on the same links share it and
    batches on disjoint links (the DP groups of different rails) do not; if the batch loads
    those links unevenly the set is split further by per-link load (a tree's busy and idle
    NICs) into classes of this batch alone (``private(cap)`` makes one; by default a new id in
    ``space``), which keeps the reduction exact for the batch. Concurrent batches whose link sets
    overlap only in part do not see each other: use explicit mode for such traffic. Coefficients are
    ``multiplicity × fraction / links in the (sub)class``, so one class row stands for all its
    flows under the even-spread assumption.

    Batches of the same shape (the TP groups of every node, the DP groups of every rail: the
    same flows, bytes and fractions over links of the same classes, only other links) share
    one analysis; each still gets the class ids of its own links.
    """
    private = private or space.new_class
    touched, at = np.unique(routes.link, return_inverse=True)
    at = at.ravel()
    key = _shape_key(routes, nbytes, at, space.base[touched])
    shape = space.shapes.get(key)
    if shape is None:
        shape = _Shape.of(routes, nbytes, touched, at, space)
        space.shapes[key] = shape
        if len(space.shapes) > CACHE_ENTRIES:
            space.shapes.popitem(last=False)
    else:
        space.shapes.move_to_end(key)
    ids = np.array([space.refine(("set", c, hash(touched[pos].tobytes())), cap) if c >= 0
                    else private(cap) for c, cap, pos in shape.parts], dtype=np.int64)
    rank = np.argsort(np.argsort(ids))
    rows = shape.rows.get(rank.tobytes())
    if rows is None:
        rows = shape.rows[rank.tobytes()] = _rows(routes, nbytes, shape, at, rank)
    keep, cflow, coef, rep, mult = rows
    link = ids[shape.part_of[at[keep]]]
    return (Routes(len(rep), cflow, link, coef, routes.latency_s[rep]),
            np.asarray(nbytes, dtype=float)[rep], mult)


def _shape_key(routes: Routes, nbytes: np.ndarray, at: np.ndarray, touched_cls: np.ndarray
               ) -> tuple:
    """What a reduction depends on besides which links: flows, bytes, fractions, which entries
    share a link, and the class of each link (a 16-byte digest of them)."""
    h = hashlib.blake2b(digest_size=16)
    for a in (routes.flow, at, touched_cls):
        h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    for a in (routes.frac, nbytes):
        h.update(np.ascontiguousarray(a, dtype=float).tobytes())
    return routes.n_flows, at.size, touched_cls.size, h.digest()


@dataclass
class _Shape:
    """The analysis of a batch's shape. ``parts``: (base class, capacity, positions among the
    touched links) in the order their class ids are made; base class ``-1`` marks a part of
    this batch alone (uneven load). ``part_of``: part of each touched link. ``rows``: the class
    rows, by the order of the parts' ids (it decides the rows' order)."""

    parts: list[tuple[int, float, np.ndarray]]
    part_of: np.ndarray
    rows: dict[bytes, tuple]

    @classmethod
    def of(cls, routes: Routes, nbytes: np.ndarray, touched: np.ndarray, at: np.ndarray,
           space: ClassSpace) -> _Shape:
        base = space.base
        load = np.bincount(at, weights=routes.frac * nbytes[routes.flow], minlength=touched.size)
        cnt = np.bincount(at, weights=routes.frac, minlength=touched.size)
        tcls = base[touched]
        order = np.argsort(tcls, kind="stable")
        bounds = np.flatnonzero(np.diff(tcls[order])) + 1
        cap = space.capacity
        starts = np.concatenate([[0], bounds])
        even = _even(load[order], starts) & _even(cnt[order], starts)
        parts: list[tuple[int, float, np.ndarray]] = []
        for grp, is_even in zip(np.split(order, bounds), even.tolist()):
            c = int(base[touched[grp[0]]])
            # a class row stands for load spread over exactly these links: batches touching
            # the same link set share it, batches on other links of the same kind do not
            if is_even:
                parts.append((c, float(cap[c]), grp))
                continue
            ld, ct = load[grp], cnt[grp]
            key_l = np.round(ld / max(ld.max(), 1e-300), 9)
            key_c = np.round(ct, 9)
            for kl, kc in sorted(set(zip(key_l.tolist(), key_c.tolist()))):
                parts.append((-1, float(cap[c]), grp[(key_l == kl) & (key_c == kc)]))
        part_of = np.empty(touched.size, dtype=np.int64)
        for i, (_, _, pos) in enumerate(parts):
            part_of[pos] = i
        return cls(parts, part_of, {})


def _rows(routes: Routes, nbytes: np.ndarray, shape: _Shape, at: np.ndarray, rank: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(entries kept, their class row, coefficient, representative flows, multiplicity): flows
    with equal bytes over the same multiset of (sub)classes are one row. ``rank``: the order of
    the parts' class ids, which numbers the (sub)classes in the flows' signatures."""
    n = routes.n_flows
    hid = rank[shape.part_of[at]]
    count = np.bincount(shape.part_of, minlength=len(shape.parts))[np.argsort(rank)]
    per_class = count[hid].astype(float)
    if n == 1:                              # one flow (a pipeline send): its own class row
        return (np.ones(at.size, dtype=bool), routes.flow, routes.frac / per_class,
                np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64))
    h1, h2 = _class_hashes(int(count.size))
    q = np.round(routes.frac * 1e6).astype(np.int64) % (2**31)
    s1 = np.bincount(routes.flow, weights=(h1[hid] * q % (2**31)).astype(float), minlength=n)
    s2 = np.bincount(routes.flow, weights=(h2[hid] * ((q + 7) % (2**31)) % (2**31)).astype(float),
                     minlength=n)
    sig = np.stack([s1, s2, np.asarray(nbytes, dtype=float)], axis=1)
    rep, inv, mult = _unique_rows(sig)
    is_rep = np.zeros(n, dtype=bool)
    is_rep[rep] = True
    keep = is_rep[routes.flow]
    cflow = inv[routes.flow[keep]]
    coef = mult[cflow] * routes.frac[keep] / per_class[keep]
    return keep, cflow, coef, rep, mult


def _even(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per run of ``values`` beginning at ``starts``: are its values equal (to 1e-9 of its
    largest)?"""
    hi = np.maximum.reduceat(values, starts)
    return hi - np.minimum.reduceat(values, starts) <= 1e-9 * hi


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0)``'s first indices, inverse and counts, in its (lexicographic)
    order, by one stable lexsort: about 9x faster than ``unique(axis=0)`` at a few thousand
    rows, which sorts a structured view."""
    order = np.lexsort(rows.T[::-1])
    s = rows[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = np.any(s[1:] != s[:-1], axis=1)
    group = np.cumsum(start) - 1
    inv = np.empty(len(order), dtype=np.int64)
    inv[order] = group
    return order[start], inv, np.bincount(group)


@lru_cache(maxsize=64)
def _class_hashes(n_cls: int) -> tuple[np.ndarray, np.ndarray]:
    """Two pseudo-random weights in [1, 2**31) per class id (flow signatures of
    :func:`symmetric_reduce`): splitmix64 of the id, which needs no ``numpy.random`` (its
    import alone costs a small run ~15 ms)."""
    i = np.arange(2 * (n_cls + 1), dtype=np.uint64)
    x = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    w = ((x ^ (x >> np.uint64(31))) % np.uint64(2**31 - 1)).astype(np.int64) + 1
    return w[:n_cls + 1], w[n_cls + 1:]
