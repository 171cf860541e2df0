"""Processor sharing of a host's cores among the ranks pinned to them (CPU processes under gloo).

A gloo profile times compute with every measured process busy at once: on 2 cores with 4
processes, two ranks pinned to each core (``planner/measure/validate/worker.py`` pins rank
``r`` to core ``r mod cores``), each op ran on half a core. In a step the ranks are not always
all busy: a rank waiting in a collective sleeps, and the kernel gives its core's time to the
ranks pinned there that compute. So an op's time in the profile is work at the measured share,
and it runs at the share it gets now: with ``k`` ranks computing on a core each gets ``1/k``
of it (the kernel's fair scheduler, one thread per rank).

The cores also slow each other down: they share the last-level cache and the memory bus (on a
VM often one physical core's two hyperthreads), so a core computes faster while the others are
idle. ``alone_speedup`` is how much faster one busy core runs than when every core is busy, as
measured (the planner's lookup probe, timed on every rank at once and on each rank alone); with
``b`` of ``C`` cores busy the speed is interpolated linearly between the two, ``1`` at ``b = C``.
A plan whose ranks carry unequal work then finishes its busiest rank faster than the all-busy
rate says, as far as its core-mates and the other cores leave it the machine. Units: seconds
and core-seconds.

>>> import simpy
>>> env = simpy.Environment()
>>> share = CpuShare(env, cores=2, measured_share=1.0, alone_speedup=1.5)
>>> a, b = share.run(0, 1.0), share.run(1, 2.0)
>>> env.run()
>>> round(a.value, 6), round(b.value, 6)      # b runs alone 1.5x faster once a is done
(1.0, 1.666667)
"""

from __future__ import annotations

import math

import simpy

__all__ = ["CpuShare"]


class CpuShare:
    """The compute ops in flight on a host's cores, processor-shared per core, each core's
    speed set by how many cores are busy.

    ``measured_share``: the share of a core each process had when the op times were measured
    (cores / processes, at most 1); an op of ``d`` seconds is ``d * measured_share``
    core-seconds of work at the all-busy speed. ``alone_speedup`` (≥ 1): the speed of a core
    while it is the only busy one, relative to every core busy. Each op's event succeeds with
    the time it finished."""

    def __init__(self, env: simpy.Environment, *, cores: int, measured_share: float,
                 alone_speedup: float = 1.0) -> None:
        if cores < 1 or not 0 < measured_share <= 1 or not alone_speedup >= 1:
            raise ValueError("cores >= 1, 0 < measured_share <= 1 and alone_speedup >= 1")
        self.env, self.cores = env, cores
        self.measured_share, self.alone_speedup = measured_share, alone_speedup
        self.left: dict[int, float] = {}          # op key -> core-seconds still to run
        self.core_of: dict[int, int] = {}
        self.done: dict[int, simpy.Event] = {}
        self.t = 0.0                               # when ``left`` was last brought up to date
        self.gen = 0                               # a wake-up of an older generation is stale
        self.next_key = 0

    def run(self, core: int, duration_s: float) -> simpy.Event:
        """An event that fires when an op measured at ``duration_s`` seconds has run on
        ``core`` (taken modulo the host's cores)."""
        self._advance()
        key = self.next_key
        self.next_key += 1
        self.left[key] = duration_s * self.measured_share
        self.core_of[key] = core % self.cores
        ev = self.done[key] = self.env.event()
        self._schedule()
        return ev

    def speed(self, busy: int) -> float:
        """A busy core's speed with ``busy`` cores busy (1 when all are)."""
        if self.cores < 2 or busy >= self.cores:
            return 1.0
        return 1.0 + (self.alone_speedup - 1.0) * (self.cores - busy) / (self.cores - 1)

    def rates(self) -> dict[int, float]:
        """Core-seconds per second of each op in flight now."""
        per_core: dict[int, int] = {}
        for c in self.core_of.values():
            per_core[c] = per_core.get(c, 0) + 1
        s = self.speed(len(per_core))
        return {k: s / per_core[c] for k, c in self.core_of.items()}

    def _advance(self) -> None:
        now = self.env.now
        if self.left and now > self.t:
            for k, r in self.rates().items():
                self.left[k] -= r * (now - self.t)
        self.t = now

    def _schedule(self) -> None:
        self.gen += 1
        if not self.left:
            return
        rates = self.rates()
        first = min(max(0.0, self.left[k]) / r for k, r in rates.items())
        gen = self.gen
        wake = self.env.timeout(first)
        wake.callbacks.append(lambda _e: self._wake(gen, first))

    def _wake(self, gen: int, first: float) -> None:
        if gen != self.gen:
            return
        self._advance()
        # the ops due now: rounding leaves them a few ulps either side of zero, and what is
        # left of an op shorter than the clock's resolution at ``now`` (a few ulps of it) is
        # due too, since a wake-up that much later is ``now`` again and would repeat forever
        tol = max(1e-9 * max(first, 1e-12), 4.0 * math.ulp(self.env.now))
        rates = self.rates()
        for k in [k for k, w in self.left.items() if w <= tol * rates[k]]:
            del self.left[k]
            del self.core_of[k]
            self.done.pop(k).succeed(self.env.now)
        self._schedule()
