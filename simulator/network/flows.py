"""The flow-level network inside a SimPy environment.

Transfers are batches of flows (one collective phase, one point-to-point message). While any flow
is in flight the network holds the max-min fair rate of every active flow. The work per event
follows the flows it concerns, not the fabric or everything in flight:

* max-min fairness splits over the connected components of the (flow × link) graph, so a batch
  that starts, or flows that end, re-solve only the batches linked to theirs through shared
  links (transitively); every other rate stays as it was;
* each batch keeps its bytes left as of its own last update and is advanced only when its rates
  change or its flows finish; its next completion time sits in a heap, and the network sleeps
  until the earliest;
* a batch that shares no link with anything in flight, nor among its own flows (a pipeline
  send, the rings of a lone collective), runs at its flows' bottlenecks without a solve.

A batch's event fires when its last flow is done.

Two modes:

* ``explicit``: every flow and every link as they are. Exact for the model.
* ``symmetric``: identical flows of a batch are one class row over link classes
  (:mod:`simulator.network.symmetric`); exact when traffic is spread evenly over the links of a
  class, and cheaper at 16k+ GPUs. Hand-written topologies always run explicit.

Topologies with ``routing: ecmp`` always run explicit too: hashing pins flows to single ports,
so the ports of a tier carry uneven loads that differ from batch to batch, and concurrent
batches that share some ports but not others are exactly what a class row cannot see (it
would drop the collisions ECMP is there to show). Explicit mode stays affordable where
symmetric mode would be chosen (a GPT-3 175B step on 16,384 GPUs, 64 DP rings of 256 ranks:
about a second).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import simpy

from simulator.network.maxmin import maxmin_rates
from simulator.network.route import Routes
from simulator.network.symmetric import ClassSpace
from simulator.topology import Topology

__all__ = ["FlowNetwork", "NetworkStats"]

#: a flow within this fraction of its size of done is done
_DONE_REL = 1e-9
#: flows due within this many seconds per second of simulated time finish together (float
#: rounding of absolute times is ~1e-16 of them)
_DUE_REL = 1e-12


@dataclass
class NetworkStats:
    """Counters of one simulation: flows started/finished, rate solves, bytes moved."""

    flows_started: int = 0
    flows_finished: int = 0
    solves: int = 0
    bytes: float = 0.0
    link_bytes: dict = field(default_factory=dict)


@dataclass(eq=False)
class _Batch:
    """Flows started together, as (flow, link) entries; ``remaining`` holds at time ``t``."""

    key: int
    flow: np.ndarray
    link: np.ndarray
    coef: np.ndarray
    ulinks: np.ndarray      # the distinct links of the entries
    remaining: np.ndarray   # bytes left per flow (per representative flow in symmetric mode)
    size: np.ndarray
    mult: np.ndarray        # flows each row stands for
    event: simpy.Event
    t: float
    rate: np.ndarray | None = None
    version: int = 0

    def next_done_s(self) -> float:
        """Absolute time its next flow finishes at the current rates, seconds."""
        with np.errstate(divide="ignore", invalid="ignore"):
            left = np.where(self.remaining > 0, self.remaining / self.rate, 0.0)
        return self.t + float(left.min())


class FlowNetwork:
    """Max-min fair flow network over a topology, driven by a SimPy environment."""

    def __init__(self, env: simpy.Environment, topo: Topology, *, mode: str = "explicit",
                 track_links: bool = False) -> None:
        if mode not in ("explicit", "symmetric"):
            raise ValueError(f"mode must be explicit or symmetric, got {mode!r}")
        self.env = env
        self.topo = topo
        # hand-written graphs and hashed (ECMP) routes break the symmetry classes rely on
        self.mode = mode if topo.hierarchy is not None and not topo.routing.ecmp \
            else "explicit"
        self._space = ClassSpace(topo) if self.mode == "symmetric" else None
        self._capacity = None if self._space else topo.effective_capacity_Bps()
        self.stats = NetworkStats()
        self._active: dict[int, _Batch] = {}
        self._keys = 0
        self._heap: list[tuple[float, int, int]] = []    # (due time, batch key, version)
        self._wake_at = np.inf
        self._wake_token = 0
        n = self.capacity.size
        self._usage = np.zeros(n, dtype=np.int64)   # batches in flight using each link
        self._mark = np.zeros(n, dtype=bool)        # scratch of the component search
        # per-link bytes carried and busy seconds (bytes / capacity at the time), when tracked
        self.track_links = track_links and self.mode == "explicit"
        self.link_bytes = np.zeros(n) if self.track_links else None
        self.link_busy_s = np.zeros(n) if self.track_links else None

    @property
    def capacity(self) -> np.ndarray:
        """Capacity of every link (explicit) or link class (symmetric), bytes/s."""
        return self._space.capacity if self._space is not None else self._capacity

    def transfer(self, routes: Routes, nbytes) -> simpy.Event:
        """Start a batch of flows now; the returned event fires when all are delivered.

        ``nbytes`` is the size of each flow in bytes (scalar or one per flow). Flows of zero bytes
        or with no link finish at once. Latency is not added here: callers add it.
        """
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), (routes.n_flows,))
        ev = self.env.event()
        self.stats.flows_started += routes.n_flows
        self.stats.bytes += float(nbytes.sum())
        has_link = np.zeros(routes.n_flows, dtype=bool)
        has_link[routes.flow] = True
        busy = has_link & (nbytes > 0)
        self.stats.flows_finished += int((~busy).sum())
        if not busy.any():
            ev.succeed()
            return ev
        if self.mode == "symmetric":
            routes, nbytes, mult = self._space.reduce(routes, np.ascontiguousarray(nbytes), busy)
        else:
            if not busy.all():
                routes, nbytes = routes.subset(busy), nbytes[busy]
            mult = np.ones(routes.n_flows, dtype=np.int64)
        self._grow(self.capacity.size)
        now = self.env.now
        ulinks = np.unique(routes.link)
        self._keys += 1
        b = _Batch(self._keys, routes.flow, routes.link, routes.frac, ulinks,
                   np.array(nbytes, dtype=float), np.array(nbytes, dtype=float), mult, ev, now)
        lone = ulinks.size == routes.link.size and not self._usage[ulinks].any()
        self._active[b.key] = b
        self._usage[ulinks] += 1
        if lone:
            # nothing shares its links: each flow runs at its bottleneck, no one else changes
            rate = np.full(routes.n_flows, np.inf)
            np.minimum.at(rate, routes.flow, self.capacity[routes.link] / routes.frac)
            self._set_rate(b, rate)
        else:
            self._solve(self._component(ulinks))
        self._arm()
        return ev

    def scale_capacity(self, links, factor: float) -> None:
        """Multiply the capacity of ``links`` by ``factor`` from now on (a link fault or
        degradation; explicit mode only) and re-solve the rates of the flows in flight."""
        if self.mode != "explicit":
            raise ValueError("link faults need the explicit network mode")
        links = np.asarray(links, dtype=np.int64)
        for b in self._active.values():
            self._advance(b)            # bytes so far moved at the old capacity
        self._capacity = self._capacity.copy()
        self._capacity[links] *= factor
        hit = self._component(links) if links.size else []
        if hit:
            self._solve(hit)
            self._arm()

    # -- internals -------------------------------------------------------------------------
    def _grow(self, n: int) -> None:
        """Make the per-link arrays hold ``n`` links (symmetric mode adds classes)."""
        if self._usage.size >= n:
            return
        extra = max(n - self._usage.size, self._usage.size)
        self._usage = np.concatenate([self._usage, np.zeros(extra, np.int64)])
        self._mark = np.concatenate([self._mark, np.zeros(extra, bool)])

    def _component(self, links: np.ndarray) -> list[_Batch]:
        """The batches in flight linked to ``links`` through shared links, transitively (the
        part of the network whose max-min rates a change on ``links`` can move)."""
        batches = list(self._active.values())
        if not batches:
            return []
        ulinks = np.concatenate([b.ulinks for b in batches])
        owner = np.repeat(np.arange(len(batches)), [b.ulinks.size for b in batches])
        mark = self._mark
        mark[links] = True
        inside = np.zeros(len(batches), dtype=bool)
        while True:                     # one layer of the breadth-first search per round
            hit = np.zeros(len(batches), dtype=bool)
            hit[owner[mark[ulinks]]] = True
            new = hit & ~inside
            if not new.any():
                break
            inside |= new
            mark[ulinks[new[owner]]] = True
        mark[links] = False
        mark[ulinks[inside[owner]]] = False
        return [b for b, i in zip(batches, inside) if i]

    def _advance(self, b: _Batch) -> None:
        """Move batch ``b``'s flows on at their rates up to now."""
        dt = self.env.now - b.t
        b.t = self.env.now
        if dt <= 0 or b.rate is None:
            return
        moved = np.where(np.isinf(b.rate), b.remaining, np.minimum(b.rate * dt, b.remaining))
        if self.track_links:
            on_link = np.bincount(b.link, weights=moved[b.flow] * b.coef,
                                  minlength=self.capacity.size)
            self.link_bytes += on_link
            self.link_busy_s += on_link / self.capacity
        b.remaining -= moved

    def _solve(self, batches: list[_Batch]) -> None:
        """Max-min rates of the flows of ``batches`` (a union of whole components)."""
        for b in batches:
            self._advance(b)
        if len(batches) == 1:
            b = batches[0]
            self._set_rate(b, maxmin_rates(b.flow, b.link, b.coef, self.capacity,
                                           b.remaining.size))
        else:
            offs = np.cumsum([0] + [b.remaining.size for b in batches])
            rates = maxmin_rates(np.concatenate([b.flow + o for b, o in zip(batches, offs)]),
                                 np.concatenate([b.link for b in batches]),
                                 np.concatenate([b.coef for b in batches]),
                                 self.capacity, int(offs[-1]))
            for b, o in zip(batches, offs):
                self._set_rate(b, rates[o:o + b.remaining.size])
        self.stats.solves += 1

    def _set_rate(self, b: _Batch, rate: np.ndarray) -> None:
        """Give ``b`` new rates (from now) and queue its next completion."""
        b.rate = rate
        b.version += 1
        heapq.heappush(self._heap, (b.next_done_s(), b.key, b.version))

    def _arm(self) -> None:
        """Make sure a wake-up is due at the earliest completion in the heap."""
        heap, active = self._heap, self._active
        while heap and (heap[0][1] not in active or active[heap[0][1]].version != heap[0][2]):
            heapq.heappop(heap)
        if not heap or heap[0][0] >= self._wake_at:
            return
        self._wake_at = heap[0][0]
        self._wake_token += 1
        token = self._wake_token
        wake = self.env.timeout(max(self._wake_at - self.env.now, 0.0))
        wake.callbacks.append(lambda _e: self._on_wake(token))

    def _on_wake(self, token: int) -> None:
        if token != self._wake_token:
            return              # an earlier wake-up was armed since
        self._wake_at = np.inf
        now = self.env.now
        due_by = now + _DUE_REL * max(now, 1e-6)
        heap, active = self._heap, self._active
        due: list[_Batch] = []
        while heap and heap[0][0] <= due_by:
            _, key, version = heapq.heappop(heap)
            b = active.get(key)
            if b is not None and b.version == version:
                due.append(b)
        freed = [self._finish_flows(b, due_by) for b in due]
        links = np.concatenate(freed) if freed else np.zeros(0, np.int64)
        links = links[self._usage[links] > 0]
        versions = [b.version for b in due]
        if links.size:
            self._solve(self._component(links))
        for b, v in zip(due, versions):     # partly done, rates unchanged: queue its next flow
            if b.key in active and b.version == v:
                self._set_rate(b, b.rate)
        self._arm()

    def _finish_flows(self, b: _Batch, due_by: float) -> np.ndarray:
        """Retire ``b``'s flows that are done by ``due_by``; fire its event when none is left.
        Returns the links those flows freed (their capacity may go to others now)."""
        self._advance(b)
        with np.errstate(divide="ignore", invalid="ignore"):
            left_s = b.remaining / b.rate
        done = (b.remaining <= b.size * _DONE_REL) | (left_s <= due_by - b.t)
        self.stats.flows_finished += int(b.mult[done].sum())
        if done.all():
            del self._active[b.key]
            self._usage[b.ulinks] -= 1
            b.event.succeed()
            return b.ulinks
        keep = ~done
        ent = keep[b.flow]
        freed = b.link[~ent]
        newid = np.cumsum(keep) - 1
        b.flow, b.link, b.coef = newid[b.flow[ent]], b.link[ent], b.coef[ent]
        b.remaining, b.size, b.mult = b.remaining[keep], b.size[keep], b.mult[keep]
        b.rate = b.rate[keep]
        ulinks = np.unique(b.link)
        self._usage[np.setdiff1d(b.ulinks, ulinks, assume_unique=True)] -= 1
        b.ulinks = ulinks
        return freed
