"""What a measurement process's C heap does with freed memory (``--heap``).

glibc returns the top of its heap to the kernel whenever more than its trim threshold lies free
there (twice its dynamic mmap threshold: at most 64 MiB). A training step frees most of what it
allocated at its end, so every step trims and the next one page-faults its heap back in, a few
to a few hundred MB a step: on a 2-core AMD EPYC VM 20-45% of a TorchRec step on gloo
(2026-11-27: set 8 of the unseen family, random plan 235 ms against 132 ms with freed memory
kept). No kernel or collective curve sees it, and how much trims depends on the order a step
frees its tensors in, which nothing here models.

Tuned CPU trainers do not pay it: they run jemalloc or tcmalloc told to keep freed pages
(Intel's DLRM CPU recipes preload jemalloc with decay disabled for this reason), large
allocations included. The measurement processes (validation ranks and the gloo calibration's)
do the same by default with glibc's own ``mallopt``: ``retain`` serves every allocation from the
heap (no ``mmap`` of its own, so a tensor above glibc's 32 MiB mmap threshold is not unmapped
when freed and faulted in again when made anew) and never trims the heap; after the first step
a step reuses what the one before freed. ``system`` leaves glibc's defaults; its steps then
include the faults above, which predictions do not.

Until 2026-11-27 ``retain`` still let tensors above 32 MiB be mapped and unmapped each time.
Their faults were slow and erratic on a 2-core EPYC VM: set 9 of the unseen family, column-wise
plan, 766 and 1,044 ms in two runs, greedy 1,052 and 565 ms; with no mmap 584 / 598 and
538 / 560 ms.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["HEAP_POLICIES", "DEFAULT_HEAP", "HEAP_HELP", "apply_heap_policy"]

HEAP_POLICIES = ("retain", "system")

DEFAULT_HEAP = "retain"

HEAP_HELP = ("what measurement processes do with freed memory: retain (default: glibc keeps "
             "it, as tuned trainers' jemalloc/tcmalloc do) or system (glibc's defaults: each "
             "step page-faults its heap back in, which predictions do not model)")

#: mallopt(3) parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4

_INT_MAX = 2 ** 31 - 1


def apply_heap_policy(policy: str) -> bool:
    """Set this process's heap ``policy`` (one of :data:`HEAP_POLICIES`) before it allocates
    much; True when in force (``system`` always; ``retain`` only where glibc's ``mallopt``
    exists)."""
    if policy not in HEAP_POLICIES:
        raise ValueError(f"heap policy {policy!r} is not one of {HEAP_POLICIES}")
    if policy == "system":
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(_M_MMAP_MAX, 0) and mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
