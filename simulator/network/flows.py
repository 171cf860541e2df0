"""The flow-level network inside a SimPy environment.

Transfers are batches of flows (one collective phase, one point-to-point message). While any flow
is in flight the network holds the max-min fair rate of every active flow; whenever a batch
starts or a flow finishes it advances every flow by ``rate × elapsed`` and solves the rates again,
then sleeps until the next completion. A batch's event fires when its last flow is done.

Two modes:

* ``explicit``: every flow and every link as they are. Exact for the model.
* ``symmetric``: flows with the same bytes and the same multiset of link *classes* (tier, kind,
  direction, bandwidth) are one class with a multiplicity, and each link class carries its load
  spread evenly over the links of that class the batch touches. Exact when traffic is spread
  evenly over those links (rings, all-to-alls and regular groups on homogeneous fabrics), and
  orders of magnitude cheaper at 16k+ GPUs. Hand-written topologies always run explicit.

Topologies with ``routing: ecmp`` always run explicit too: hashing pins flows to single ports,
so the ports of a tier carry uneven loads that differ from batch to batch, and concurrent
batches that share some ports but not others are exactly what a class row cannot see (it
would drop the collisions ECMP is there to show). Explicit mode stays affordable where
symmetric mode would be chosen (a GPT-3 175B step on 16,384 GPUs, 64 DP rings of 256 ranks:
about a second).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import simpy

from simulator.network.maxmin import maxmin_rates
from simulator.network.route import Routes
from simulator.topology import Topology

__all__ = ["FlowNetwork", "NetworkStats", "link_classes", "symmetric_reduce"]

_DONE_REL = 1e-9


@dataclass
class NetworkStats:
    """Counters of one simulation: flows started/finished, rate solves, bytes moved."""

    flows_started: int = 0
    flows_finished: int = 0
    solves: int = 0
    bytes: float = 0.0
    link_bytes: dict = field(default_factory=dict)


@dataclass
class _Batch:
    flow: np.ndarray
    link: np.ndarray
    coef: np.ndarray
    remaining: np.ndarray   # bytes left per flow (per representative flow in symmetric mode)
    size: np.ndarray
    mult: np.ndarray        # flows each row stands for
    event: simpy.Event
    rate: np.ndarray | None = None


def link_classes(topo: Topology) -> tuple[np.ndarray, np.ndarray]:
    """Class id of every link and the capacity (bytes/s, effective) of one link of each class.

    Links are in one class when they share tier, kind, direction and bandwidth.
    """
    lt = topo.links
    cap = topo.effective_capacity_Bps()
    keys = [(lt.tier[i], lt.kind[i], i % 2, float(lt.bandwidth_Bps[i])) for i in range(len(lt))]
    uniq: dict[tuple, int] = {}
    cls = np.fromiter((uniq.setdefault(k, len(uniq)) for k in keys), dtype=np.int64,
                      count=len(keys))
    class_cap = np.zeros(len(uniq))
    class_cap[cls] = cap
    return cls, class_cap


class _ClassSpace:
    """Link classes of a topology, extended on demand by per-batch refinements."""

    def __init__(self, topo: Topology) -> None:
        self.base, cap = link_classes(topo)
        self.capacity = list(cap)
        self.refined: dict[tuple, int] = {}
        self.batches = 0

    def refine(self, key: tuple, cap: float) -> int:
        if key not in self.refined:
            self.refined[key] = len(self.capacity)
            self.capacity.append(cap)
        return self.refined[key]


def symmetric_reduce(routes: Routes, nbytes: np.ndarray, space: _ClassSpace
                     ) -> tuple[Routes, np.ndarray, np.ndarray]:
    """Collapse identical flows into classes; return (class routes, bytes, multiplicity).

    Links of one class (tier, kind, direction, bandwidth) touched by the batch become one class
    row keyed by the exact set of links, so concurrent batches on the same links share it and
    batches on disjoint links (the DP groups of different rails) do not; if the batch loads
    those links unevenly the set is split further by per-link load (a tree's busy and idle
    NICs), which keeps the reduction exact for the batch. Concurrent batches whose link sets
    overlap only in part do not see each other: use explicit mode for such traffic. Coefficients are
    ``multiplicity × fraction / links in the (sub)class``, so one class row stands for all its
    flows under the even-spread assumption.
    """
    n = routes.n_flows
    cls = space.base
    # everything below is per link the batch touches, never per link of the fabric
    touched_links, at = np.unique(routes.link, return_inverse=True)
    load = np.bincount(at, weights=routes.frac * nbytes[routes.flow], minlength=touched_links.size)
    cnt = np.bincount(at, weights=routes.frac, minlength=touched_links.size)
    tcls = cls[touched_links]                 # class of each touched link, refined below
    tc = tcls.copy()
    order = np.argsort(tc, kind="stable")
    tc = tc[order]
    bounds = np.flatnonzero(np.diff(tc)) + 1
    cap = np.asarray(space.capacity)
    space.batches += 1
    for grp in np.split(order, bounds):
        links = touched_links[grp]
        ld, ct = load[grp], cnt[grp]
        c = int(cls[links[0]])
        # a class row stands for load spread over exactly these links: batches touching the
        # same link set share it, batches on other links of the same kind do not
        where = hash(links.tobytes())
        if np.ptp(ld) <= 1e-9 * ld.max() and np.ptp(ct) <= 1e-9 * ct.max():
            tcls[grp] = space.refine(("set", c, where), float(cap[c]))
            continue
        key_l = np.round(ld / max(ld.max(), 1e-300), 9)
        key_c = np.round(ct, 9)
        for kl, kc in sorted(set(zip(key_l.tolist(), key_c.tolist()))):
            sel = grp[(key_l == kl) & (key_c == kc)]
            tcls[sel] = space.refine((space.batches, c, kl, kc), float(cap[c]))
    lc = tcls[at]
    n_cls = len(space.capacity)
    touched = np.bincount(tcls, minlength=n_cls).astype(float)
    if n == 1:                              # one flow (a pipeline send): its own class row
        return (Routes(1, routes.flow, lc, routes.frac / touched[lc], routes.latency_s),
                nbytes.astype(float), np.ones(1, dtype=np.int64))
    h1, h2 = _class_hashes(n_cls)
    q = np.round(routes.frac * 1e6).astype(np.int64) % (2**31)
    s1 = np.bincount(routes.flow, weights=(h1[lc] * q % (2**31)).astype(float), minlength=n)
    s2 = np.bincount(routes.flow, weights=(h2[lc] * ((q + 7) % (2**31)) % (2**31)).astype(float),
                     minlength=n)
    sig = np.stack([s1, s2, nbytes.astype(float)], axis=1)
    _, rep, inv, mult = np.unique(sig, axis=0, return_index=True, return_inverse=True,
                                  return_counts=True)
    inv = inv.ravel()
    is_rep = np.zeros(n, dtype=bool)
    is_rep[rep] = True
    keep = is_rep[routes.flow]
    cflow = inv[routes.flow[keep]]
    clink = lc[keep]
    coef = mult[cflow] * routes.frac[keep] / touched[clink]
    return (Routes(len(rep), cflow, clink, coef, routes.latency_s[rep]),
            nbytes[rep].astype(float), mult)


@lru_cache(maxsize=64)
def _class_hashes(n_cls: int) -> tuple[np.ndarray, np.ndarray]:
    """Two seeded random weights per link class (flow signatures of :func:`symmetric_reduce`)."""
    rng = np.random.default_rng(12345)
    return (rng.integers(1, 2**31, size=n_cls + 1, dtype=np.int64),
            rng.integers(1, 2**31, size=n_cls + 1, dtype=np.int64))


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
        if self.mode == "symmetric":
            self._space = _ClassSpace(topo)
            self.capacity = np.asarray(self._space.capacity)
        else:
            self._space, self.capacity = None, topo.effective_capacity_Bps()
        self.stats = NetworkStats()
        self._active: list[_Batch] = []
        self._last = 0.0
        self._wake: simpy.Event | None = None
        self._version = 0
        self._usage = np.zeros(self.capacity.size, dtype=np.int64)   # active entries per link
        # per-link bytes carried and busy seconds (bytes / capacity at the time), when tracked
        self.track_links = track_links and self.mode == "explicit"
        self.link_bytes = np.zeros(self.capacity.size) if self.track_links else None
        self.link_busy_s = np.zeros(self.capacity.size) if self.track_links else None

    def transfer(self, routes: Routes, nbytes) -> simpy.Event:
        """Start a batch of flows now; the returned event fires when all are delivered.

        ``nbytes`` is the size of each flow in bytes (scalar or one per flow). Flows of zero bytes
        or with no link finish at once. Latency is not added here: callers add it.
        """
        nbytes = np.broadcast_to(np.asarray(nbytes, dtype=float), (routes.n_flows,)).copy()
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
        if not busy.all():
            routes = _subset(routes, busy)
            nbytes = nbytes[busy]
        if self.mode == "symmetric":
            routes, nbytes, mult = symmetric_reduce(routes, nbytes, self._space)
            if len(self._space.capacity) != self.capacity.size:
                self.capacity = np.asarray(self._space.capacity)
        else:
            mult = np.ones(routes.n_flows, dtype=np.int64)
        if self._usage.size < self.capacity.size:
            self._usage = np.concatenate([self._usage, np.zeros(self.capacity.size
                                                                 - self._usage.size, np.int64)])
        self._advance()
        batch = _Batch(routes.flow, routes.link, routes.frac, nbytes, nbytes.copy(), mult, ev)
        self._active.append(batch)
        # Fast path: a batch whose flows share no link with anything in flight (nor with each
        # other) leaves every other rate unchanged; each of its flows runs at its bottleneck.
        if (not self._usage[routes.link].any()
                and np.unique(routes.link).size == routes.link.size):
            rate = np.full(routes.n_flows, np.inf)
            np.minimum.at(rate, routes.flow, self.capacity[routes.link] / routes.frac)
            batch.rate = rate
            self._usage[routes.link] += 1
            self._schedule()
        else:
            np.add.at(self._usage, routes.link, 1)
            self._resolve(force=True)
        return ev

    def scale_capacity(self, links, factor: float) -> None:
        """Multiply the capacity of ``links`` by ``factor`` from now on (a link fault or
        degradation; explicit mode only) and re-solve the rates of the flows in flight."""
        if self.mode != "explicit":
            raise ValueError("link faults need the explicit network mode")
        links = np.asarray(links, dtype=np.int64)
        self._advance()
        self.capacity = self.capacity.copy()
        self.capacity[links] *= factor
        if self._active:
            self._resolve(force=True)

    # -- internals -------------------------------------------------------------------------
    def _advance(self) -> None:
        dt = self.env.now - self._last
        self._last = self.env.now
        if dt <= 0:
            return
        for b in self._active:
            if b.rate is not None:
                moved = np.where(np.isinf(b.rate), b.remaining, np.minimum(b.rate * dt,
                                                                          b.remaining))
                if self.track_links:
                    on_link = np.bincount(b.link, weights=moved[b.flow] * b.coef,
                                          minlength=self.capacity.size)
                    self.link_bytes += on_link
                    self.link_busy_s += on_link / self.capacity
                b.remaining -= moved

    def _resolve(self, *, force: bool = False) -> None:
        """Drop finished flows, fire finished batches, re-solve rates if anything could change."""
        still = []
        freed: list[np.ndarray] = []
        for b in self._active:
            done = b.remaining <= b.size * _DONE_REL
            if done.any():
                freed.append(b.link[done[b.flow]])
                self.stats.flows_finished += int(b.mult[done].sum())
                if done.all():
                    b.event.succeed()
                    continue
                keep = ~done
                ent = keep[b.flow]
                newid = np.cumsum(keep) - 1
                b.flow, b.link, b.coef = newid[b.flow[ent]], b.link[ent], b.coef[ent]
                b.remaining, b.size, b.mult = b.remaining[keep], b.size[keep], b.mult[keep]
                if b.rate is not None:
                    b.rate = b.rate[keep]
            still.append(b)
        self._active = still
        for links in freed:
            np.subtract.at(self._usage, links, 1)
        if not still:
            self._version += 1
            return
        # rates change only if a freed link is still used by someone, or a batch was added
        if not force and not any(self._usage[links].any() for links in freed):
            self._schedule()
            return
        offs = np.cumsum([0] + [len(b.remaining) for b in still])
        rates = maxmin_rates(np.concatenate([b.flow + o for b, o in zip(still, offs)]),
                             np.concatenate([b.link for b in still]),
                             np.concatenate([b.coef for b in still]),
                             self.capacity, int(offs[-1]))
        self.stats.solves += 1
        for b, o in zip(still, offs):
            b.rate = rates[o:o + len(b.remaining)]
        self._schedule()

    def _schedule(self) -> None:
        """Sleep until the next flow completes (superseding any earlier wake-up)."""
        self._version += 1
        t_next = np.inf
        with np.errstate(divide="ignore"):
            for b in self._active:
                t_next = min(t_next, float(np.min(b.remaining / b.rate)))
        version = self._version
        wake = self.env.timeout(max(t_next, 0.0))
        wake.callbacks.append(lambda _e: self._on_wake(version))

    def _on_wake(self, version: int) -> None:
        if version != self._version:
            return  # a newer solve superseded this wake-up
        self._advance()
        # snap flows that are within rounding of done
        for b in self._active:
            close = b.remaining <= np.maximum(b.size * _DONE_REL, b.rate * 1e-15)
            b.remaining[close] = 0.0
        self._resolve()


def _subset(routes: Routes, keep: np.ndarray) -> Routes:
    ent = keep[routes.flow]
    newid = np.cumsum(keep) - 1
    return Routes(int(keep.sum()), newid[routes.flow[ent]], routes.link[ent], routes.frac[ent],
                  routes.latency_s[keep])
