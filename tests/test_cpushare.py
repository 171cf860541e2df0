"""Processor sharing of a host's cores (simulator/cpushare.py) against closed forms."""

import doctest

import pytest
import simpy

from simulator import cpushare
from simulator.cpushare import CpuShare


def _finish(env: simpy.Environment, events, max_steps: int = 10_000) -> list[float]:
    """Run ``env`` until every event has fired, at most ``max_steps`` simulation steps (a
    scheduler that wakes itself at the same instant forever fails here, not hangs)."""
    for _ in range(max_steps):
        if all(e.processed for e in events):
            return [e.value for e in events]
        env.step()
    raise AssertionError(f"not done after {max_steps} steps at t={env.now!r}")


def test_doctests():
    assert doctest.testmod(cpushare).failed == 0


def test_two_ranks_on_one_core_take_turns_at_half_speed():
    """Two ops of 1 s and 3 s (measured at a whole core) pinned to one core: both run at half
    speed until the first ends at 2 s, then the second alone: 2 + (3 - 1) = 4 s."""
    env = simpy.Environment()
    share = CpuShare(env, cores=2, measured_share=1.0)
    a, b = share.run(0, 1.0), share.run(2, 3.0)          # core 2 mod 2 = core 0
    assert _finish(env, [a, b]) == pytest.approx([2.0, 4.0], rel=1e-12)


def test_measured_share_turns_times_into_work():
    """Times measured with 2 processes per core are half a core's work: alone, an op of 1 s
    runs in 0.5 s."""
    env = simpy.Environment()
    share = CpuShare(env, cores=2, measured_share=0.5)
    assert _finish(env, [share.run(1, 1.0)]) == pytest.approx([0.5], rel=1e-12)


def test_an_op_shorter_than_the_clock_resolution_finishes():
    """At t = 1e6 s an op of 1e-12 s is below the clock's resolution (ulp ≈ 1.2e-10 s): its
    wake-up lands at the same instant. It must finish then, not wake itself forever (this hung
    a validation prediction of a row-wise plan, 2026-11-29)."""
    env = simpy.Environment()
    share = CpuShare(env, cores=2, measured_share=0.5, alone_speedup=1.3)
    env.run(until=1e6)
    tiny, normal = share.run(0, 1e-12), share.run(0, 1.0)
    done = _finish(env, [tiny, normal])
    assert done[0] == 1e6
    assert done[1] == pytest.approx(1e6 + 0.5 / 1.3, rel=1e-12)
