"""The SimPy engine: run a :class:`~simulator.workload.Workload` on a topology.

Each op waits for its dependencies and for the previous op on each of its (rank, stream) pairs,
then runs: compute for its roofline time (or fixed duration), a collective as its phases of
flows on the shared :class:`~simulator.network.FlowNetwork`, so concurrent collectives share
links. The result is a :class:`~simulator.result.SimResult`: the op table (a pandas DataFrame
on demand, one row per op) and a Chrome/Perfetto trace.

>>> from simulator.topology import load_topology
>>> from simulator.workload import Workload
>>> w = Workload()
>>> a = w.compute(0, "gemm", flops=2 * 4096**3)
>>> b = w.collective("allreduce", range(8), 2**26, deps=[a])
>>> res = simulate(load_topology("dgx-a100"), w)
>>> res.step_time_s > 0
True
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import simpy

from simulator.collectives import CollectivePlan, plan_collective, run_plan
from simulator.collectives.algorithms import sendrecv as _sendrecv_plan
from simulator.compute import ComputeProfile, load_compute_profile, op_time
from simulator.cpushare import CpuShare
from simulator.errors import SimulationError, SpecError
from simulator.network import FlowNetwork
from simulator.result import SimResult, op_table
from simulator.topology import Topology
from simulator.workload import Workload

if TYPE_CHECKING:
    from simulator.faults import LinkFault

__all__ = ["simulate"]

# beyond ~30 years of virtual time float seconds cannot resolve a µs flow any more
MAX_OP_S = 1e9


def simulate(topo: Topology, workload: Workload, *, mode: str = "explicit",
             compute: ComputeProfile | None = None,
             slowdown: Mapping[int, float] | None = None,
             link_faults: Sequence["LinkFault"] = (),
             track_links: bool = False, measured_comm=None) -> SimResult:
    """Simulate ``workload`` on ``topo`` and return per-op timings.

    Parameters
    ----------
    mode:
        ``explicit`` or ``symmetric`` flow simulation (see :mod:`simulator.network.flows`).
    compute:
        Compute profile for roofline times; by default the topology GPU's shipped profile.
    slowdown:
        Optional per-rank factor ≥ 1 multiplying that rank's compute times (stragglers).
    link_faults:
        :class:`~simulator.faults.LinkFault` s: from ``at_s`` on, the links carry ``factor`` of
        their capacity (a bundle that lost some cables, ECMP spreading over the rest; a flaky or
        lossy link). Flows in flight are re-rated at that moment. Forces explicit mode.
    track_links:
        Record bytes and busy seconds per link (``SimResult.link_busy_s``; explicit mode), the
        input of hot-link diagnosis (:func:`simulator.faults.find_hot_links`).
    measured_comm:
        A :class:`~simulator.gloo_profile.GlooProfile` (or anything with ``comm_time_s(kind,
        nranks, nbytes, gap_s, splits=)`` and ``shared_core``): collectives and messages it
        has a table for take their measured time instead of flows (algorithm ``measured``); with
        ``shared_core`` every rank is one core that its compute ops and its measured
        communication hold in turn (CPU processes under gloo); where the profile's processes
        had fewer cores than there are ranks or processes, rank ``r`` computes on core
        ``r mod cores`` beside the other ranks pinned there, and where it measured how much
        faster a core runs while the others are idle (``alone_speedup``), compute speeds up
        as cores fall idle (:mod:`simulator.cpushare`).
    """
    t0 = time.perf_counter()
    ops = workload.ops
    _check_ranks(topo, ops)
    profile = compute or load_compute_profile(topo.gpu)
    slow = _slowdown_factors(topo, slowdown)
    env = simpy.Environment()
    if link_faults:
        mode = "explicit"       # a fault on one link breaks the symmetry classes rely on
    net = FlowNetwork(env, topo, mode="explicit" if track_links else mode,
                      track_links=track_links)
    _schedule_link_faults(env, net, link_faults)

    run = _OpRunner(env, net, topo, ops, profile, slow, measured_comm)
    run.run()
    _check_finished(ops, run.end)
    table = op_table(topo, ops, run.start, run.end, run.algo)
    st = net.stats
    events = run.events + st.flows_started + st.flows_finished
    n = len(ops)
    return SimResult(table=table, step_time_s=float(np.nanmax(run.end)) if n else 0.0, events=events,
                     wall_s=time.perf_counter() - t0, network=st, topology=topo.name,
                     mode=net.mode, workload=workload, device_names=topo.gpus,
                     slowdown={r: f for r, f in slow.items() if f != 1.0},
                     link_faults=tuple(link_faults), link_bytes=net.link_bytes,
                     link_busy_s=net.link_busy_s)


def _check_ranks(topo: Topology, ops) -> None:
    """Raise a :class:`SpecError` naming the first op that uses a rank ``topo`` lacks."""
    n_gpus = topo.num_gpus
    for op in ops:
        for r in op.ranks:
            if not 0 <= r < n_gpus:
                raise SpecError(f"op {op.id} ({op.name}) uses rank {r}, but topology "
                                f"{topo.name} has {n_gpus} GPUs", field=f"ops[{op.id}].ranks",
                                fix="use ranks 0..N-1 or a bigger topology (--gpus)")


def _slowdown_factors(topo: Topology, slowdown: Mapping[int, float] | None) -> dict[int, float]:
    """The compute slowdown factor per rank (rank → factor > 0), checked against ``topo``."""
    n_gpus = topo.num_gpus
    slow = {int(r): float(f) for r, f in (slowdown or {}).items()}
    for r, f in slow.items():
        if not 0 <= r < n_gpus or not (np.isfinite(f) and f > 0):
            raise SpecError(f"slowdown {f!r} for rank {r} is not a positive factor on a rank of "
                            f"{topo.name}", field="slowdown",
                            fix=f"give rank → factor with ranks 0..{n_gpus - 1}, e.g. {{17: 1.1}}")
    return slow


def _schedule_link_faults(env: simpy.Environment, net: FlowNetwork, link_faults) -> None:
    """Scale the faulty links' capacity now (``at_s`` ≤ 0) or at ``at_s`` seconds."""
    for fault in link_faults:
        if fault.at_s <= 0:
            net.scale_capacity(fault.links, fault.factor)
        else:
            ev = env.timeout(fault.at_s)
            ev.callbacks.append(lambda _e, f=fault: net.scale_capacity(f.links, f.factor))


def _dependencies(ops) -> tuple[np.ndarray, list[list[int]]]:
    """Per op: how many ops it waits for (its explicit dependencies plus the previous op on
    each of its (rank, stream) pairs), and the ops that wait for it."""
    n = len(ops)
    waiting = np.zeros(n, dtype=np.int64)
    children: list[list[int]] = [[] for _ in range(n)]
    last_on: dict[tuple[int, str], int] = {}
    for op in ops:
        parents = set(op.deps)
        for r in op.ranks:
            key = (r, op.stream)
            if key in last_on:
                parents.add(last_on[key])
            last_on[key] = op.id
        waiting[op.id] = len(parents)
        for p in parents:
            children[p].append(op.id)
    return waiting, children


class _OpRunner:
    """Runs the ops of one simulation as SimPy processes: each begins once every op it waits
    for has finished. Records each op's start and end (seconds) and algorithm, and counts op
    starts and ends in ``events``."""

    def __init__(self, env: simpy.Environment, net: FlowNetwork, topo: Topology, ops,
                 profile: ComputeProfile, slow: dict[int, float], measured_comm) -> None:
        n, n_gpus = len(ops), topo.num_gpus
        self.env, self.net, self.topo, self.ops = env, net, topo, ops
        self.profile, self.slow, self.measured_comm = profile, slow, measured_comm
        self.waiting, self.children = _dependencies(ops)
        self.start = np.full(n, np.nan)
        self.end = np.full(n, np.nan)
        self.algo = [""] * n
        self.plan_cache: dict[tuple, CollectivePlan] = {}
        self.events = 0
        self.cores = ([simpy.Resource(env, capacity=1) for _ in range(n_gpus)]
                      if measured_comm is not None and measured_comm.shared_core else None)
        self.cpu = _cpu_share(env, measured_comm, n_gpus) if self.cores is not None else None
        self.last_comm = np.zeros(n_gpus)   # when each rank's last measured call ended, seconds

    def run(self) -> None:
        """Begin the ops that wait for none and run the simulation until nothing is left."""
        roots = [i for i in range(len(self.ops)) if self.waiting[i] == 0]
        for i in roots:
            self.begin(i)
        self.env.run()

    def begin(self, i: int) -> None:
        """Start op ``i`` now: a compute op for its time, a measured exchange for its measured
        time, other communication as the flows of its collective plan."""
        op = self.ops[i]
        self.start[i] = self.env.now
        self.events += 1
        if op.kind == "compute":
            d = self._compute_s(op)
            self.algo[i] = ""
            self._run_for(i, op.ranks[:1], d)
            return
        mc = self.measured_comm
        if mc is not None:
            kind = op.collective if op.kind == "collective" else "sendrecv"
            if mc.comm_time_s(kind, len(op.ranks), op.bytes_moved) is not None:
                self.algo[i] = "measured"
                self._run_for(i, op.ranks, self._measured_time(op, kind))
                return
        plan = self._plan(op)
        self.algo[i] = plan.algorithm
        self.env.process(self._run_comm(i, plan))

    def finish(self, i: int) -> None:
        """Record op ``i``'s end and begin the ops that waited only for it."""
        self.end[i] = self.env.now
        self.events += 1
        waiting = self.waiting
        for c in self.children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                self.begin(c)

    def _compute_s(self, op) -> float:
        """Seconds compute op ``op`` takes (roofline or fixed), times its rank's slowdown."""
        if op.duration_s is not None:
            d = op.duration_s
        else:
            d = op_time(self.profile, flops=op.flops, bytes_moved=op.bytes_moved, dtype=op.dtype)
        d *= self.slow.get(op.ranks[0], 1.0)
        if not d < MAX_OP_S:
            raise SimulationError(f"op {op.id} ({op.name}) would take {d:.3g} s, past the "
                                  f"{MAX_OP_S:.0e} s this simulator resolves (fix: check "
                                  "the op's flops, bytes or duration and their units)")
        return d

    def _plan(self, op) -> CollectivePlan:
        """The flows of communication op ``op`` (a collective or a send/receive), cached."""
        if op.kind == "collective":
            key = (op.collective, op.ranks, op.bytes_moved, op.algo, op.splits)
            plan = self.plan_cache.get(key)
            if plan is None:
                plan = self.plan_cache[key] = plan_collective(self.topo, op.collective, op.ranks,
                                                              op.bytes_moved, algo=op.algo,
                                                              splits=op.splits)
        else:
            key = ("p2p", op.ranks, op.bytes_moved)
            plan = self.plan_cache.get(key)
            if plan is None:
                plan = self.plan_cache[key] = _sendrecv_plan(self.topo, op.ranks[0], op.ranks[1],
                                                             op.bytes_moved)
        return plan

    def _run_for(self, i: int, ranks, d) -> None:
        """Run op ``i`` for ``d`` seconds (or ``d()``, evaluated once its cores are free)."""
        if self.cores is None:
            ev = self.env.timeout(d() if callable(d) else d)
            ev.callbacks.append(lambda _e, i=i: self.finish(i))
        else:
            self.env.process(self._on_cores(i, ranks, d))

    def _on_cores(self, i: int, ranks, d):
        """Process: hold the cores of ``ranks``, run op ``i`` for ``d`` seconds, release."""
        env, cores = self.env, self.cores
        held = []
        for r in sorted(set(ranks)):     # one global order: no two ops wait for each other
            req = cores[r].request()
            yield req
            held.append((r, req))
        self.start[i] = env.now          # the op runs from when it holds its cores
        if self.cpu is not None and self.ops[i].kind == "compute":
            yield self.cpu.run(self.ops[i].ranks[0], d() if callable(d) else d)
        else:
            yield env.timeout(d() if callable(d) else d)
        for r, req in held:
            cores[r].release(req)
        self.finish(i)

    def _measured_time(self, op, kind: str):
        """A function giving the measured seconds of ``op`` when called at its start (the
        gap since its ranks' last measured call is an input of the measurement's model)."""
        def seconds() -> float:
            idx = list(op.ranks)
            gap = float(self.env.now - self.last_comm[idx].min())
            d = self.measured_comm.comm_time_s(kind, len(idx), op.bytes_moved, gap,
                                               splits=op.splits)
            self.last_comm[idx] = self.env.now + d
            return d
        return seconds

    def _run_comm(self, i: int, plan: CollectivePlan):
        """Process: run ``plan``'s flows on the network, then finish op ``i``."""
        yield from run_plan(self.env, self.net, plan)
        self.finish(i)


def _cpu_share(env: simpy.Environment, mc, n_ranks: int) -> CpuShare | None:
    """The host's cores shared by its ranks (:class:`~simulator.cpushare.CpuShare`), rank ``r``
    computing on core ``r mod cores`` (as the measurement processes pin their ranks), when the
    profile says how many cores its processes had and there are more ranks or measured
    processes than cores, or its cores run faster alone than all busy (``alone_speedup``);
    None otherwise (every rank a core of its own at the measured speed)."""
    cores, procs = getattr(mc, "cores", None), getattr(mc, "processes", None)
    speedup = float(getattr(mc, "alone_speedup", None) or 1.0)
    if not cores or not procs or (cores >= max(procs, n_ranks) and speedup <= 1.0):
        return None
    return CpuShare(env, cores=cores, measured_share=min(1.0, cores / procs),
                    alone_speedup=max(1.0, speedup))


def _check_finished(ops, end: np.ndarray) -> None:
    """Raise a :class:`SimulationError` naming the first ops that never finished (a deadlock)."""
    unfinished = np.isnan(end)
    if unfinished.any():
        stuck = [ops[i] for i in np.flatnonzero(unfinished)[:5]]
        desc = "; ".join(f"op {o.id} {o.name} on ranks {list(o.ranks)[:8]} stream {o.stream}"
                         for o in stuck)
        raise SimulationError(f"deadlock: {int(unfinished.sum())} ops never started or finished "
                              f"(first: {desc}); collectives must be issued in the same order "
                              "on every member's stream")
