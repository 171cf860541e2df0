"""How many cores other processes used while we measured (Linux ``/proc``).

Timing runs on a shared machine are only worth comparing when nobody else was busy: a
measurement is flagged (and retried by the benchmark) when the machine's busy CPU time, minus
what this process and its descendants used, exceeds about 0.2 cores over the measurement.
"""

from __future__ import annotations

import os
import time

from planner.measure.compute.cpu import machine_busy_s

__all__ = ["LoadMeter", "OTHER_CORES_LIMIT"]

OTHER_CORES_LIMIT = 0.2
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree_cpu_s() -> float:
    """CPU seconds of this process, its reaped children and its live descendants."""
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    me = os.getpid()
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return total
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        parent[pid] = int(rest[1])
        cpu[pid] = (int(rest[11]) + int(rest[12])) / _TICK
    for pid in cpu:
        p, seen = parent.get(pid), 0
        while p is not None and p != me and p > 1 and seen < 64:
            p, seen = parent.get(p), seen + 1
        if p == me and pid != me:
            total += cpu[pid]
    return total


class LoadMeter:
    """Started on creation; :meth:`other_cores` gives the mean cores used by other processes
    since then (0.0 where ``/proc`` is not available)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_s()
        self.ours0 = _tree_cpu_s()

    def other_cores(self) -> float:
        wall = time.monotonic() - self.t0
        busy = machine_busy_s()
        if self.busy0 is None or busy is None or wall <= 0:
            return 0.0
        ours = _tree_cpu_s() - self.ours0
        return max(0.0, (busy - self.busy0 - ours) / wall)
