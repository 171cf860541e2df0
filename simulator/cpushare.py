"""Processor sharing of a core among the ranks pinned to it (CPU processes under gloo).

A gloo profile times compute with every measured process busy at once: on 2 cores with 4
processes, two ranks pinned to each core (``planner/measure/validate/worker.py`` pins rank
``r`` to core ``r mod cores``), each op ran on half a core. In a step the ranks are not always
all busy: a rank waiting in a collective sleeps, and the kernel gives its core's time to the
ranks pinned there that compute. So an op's time in the profile is work at the measured share,
and it runs at the share it gets now: with ``k`` ranks computing on a core each gets ``1/k``
of it (the kernel's fair scheduler, one thread per rank). A plan
whose ranks carry unequal work then finishes its busiest rank faster than the all-busy rate
says, as far as its core-mates leave it the core. Units: seconds and core-seconds.
"""

from __future__ import annotations

import simpy

__all__ = ["CpuShare"]


class CpuShare:
    """The compute ops in flight on one core, processor-shared.

    ``measured_share``: the share of a core each process had when the op times were measured
    (cores / processes, at most 1); an op of ``d`` seconds is ``d * measured_share``
    core-seconds of work."""

    def __init__(self, env: simpy.Environment, measured_share: float) -> None:
        self.env, self.measured_share = env, measured_share
        self.left: dict[int, float] = {}          # op key -> core-seconds still to run
        self.done: dict[int, simpy.Event] = {}
        self.t = 0.0                               # when ``left`` was last brought up to date
        self.gen = 0                               # a wake-up of an older generation is stale
        self.next_key = 0

    def run(self, duration_s: float) -> simpy.Event:
        """An event that fires when an op measured at ``duration_s`` seconds has run."""
        self._advance()
        key = self.next_key
        self.next_key += 1
        self.left[key] = duration_s * self.measured_share
        ev = self.done[key] = self.env.event()
        self._schedule()
        return ev

    def rate(self) -> float:
        """Core share of each op in flight now."""
        return 1.0 / len(self.left) if self.left else 0.0

    def _advance(self) -> None:
        now = self.env.now
        if self.left and now > self.t:
            ran = self.rate() * (now - self.t)
            for k in self.left:
                self.left[k] -= ran
        self.t = now

    def _schedule(self) -> None:
        self.gen += 1
        if not self.left:
            return
        first = min(self.left.values())
        gen = self.gen
        wake = self.env.timeout(max(0.0, first) / self.rate())
        wake.callbacks.append(lambda _e: self._wake(gen, first))

    def _wake(self, gen: int, first: float) -> None:
        if gen != self.gen:
            return
        self._advance()
        # the ops due now: rounding leaves them a few ulps either side of zero
        tol = 1e-9 * max(first, 1e-12)
        for k in [k for k, w in self.left.items() if w <= tol]:
            del self.left[k]
            self.done.pop(k).succeed()
        self._schedule()
