"""The measurement processes' heap policy (planner/measure/heap.py) does what it says: under
``retain`` a step that allocates again what the step before freed takes no page faults; under
glibc's defaults (``system``) it faults its heap back in every time."""

import multiprocessing
import resource
import sys

import pytest

from planner.measure.heap import apply_heap_policy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")

MIB = 2 ** 20


def _steps(policy: str, out) -> None:
    """Three 'steps' of 48 live 2 MiB buffers and two of 64 MiB (above glibc's mmap
    threshold), all freed at the step's end (as a training step's temporaries are); the minor
    faults of the third."""
    out.put(apply_heap_policy(policy))
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        live = [bytearray(2 * MIB) for _ in range(48)] + [bytearray(64 * MIB) for _ in range(2)]
        del live
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    out.put(faults[-1])


def _third_step_faults(policy: str) -> int:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_steps, args=(policy, q))
    p.start()
    applied, faults = q.get(timeout=60), q.get(timeout=60)
    p.join(10)
    assert applied
    return faults


def test_retain_keeps_freed_memory_and_system_faults_it_back():
    system, retain = _third_step_faults("system"), _third_step_faults("retain")
    pages = (48 * 2 + 2 * 64) * MIB // resource.getpagesize()
    assert system > 0.5 * pages           # glibc trimmed the heap and faulted it back in
    assert retain < 0.05 * pages          # kept: the third step reuses resident pages


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="heap policy"):
        apply_heap_policy("jemalloc")
