"""What every rank of a validation run does around its training steps: pin its main thread to
a core (and give the cores back after), time its warm-up and measured steps between barriers
(and one profiled step), and inject the fault a test asked for.
"""

from __future__ import annotations

import os
import sys
import time

from planner.measure.validate.comm import Recorder

__all__ = ["pin_main_thread", "unpin", "timed_steps", "inject_fault"]


def pin_main_thread(rank: int) -> None:
    """Pin the calling (main) thread of a rank to core ``rank mod cores``, once its process
    groups exist. Unpinned, the kernel moves two single-thread ranks between the cores and one
    of them computed up to 25% slower (a GEMM, on this 2-core VM; pinned, both ran at the
    speed of one alone). Only this thread: gloo's threads, started with the groups, keep every
    core (pinned beside the main thread, a small all-reduce took 1.6 ms instead of 0.5)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})   # pid 0: this thread only
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass


def unpin() -> None:
    """Give the calling thread every core again (a pool process runs several jobs)."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        pass


def timed_steps(rec: Recorder, run_step, cfg, rank: int) -> tuple[list, str | None]:
    """Run warm-up and measured steps between barriers, (step, start, end) wall times each,
    then one profiled step whose Chrome trace goes to ``cfg.trace_dir`` (when set)."""
    steps: list[tuple[int, float, float]] = []
    n_steps = cfg.warmup + cfg.steps
    for step in range(n_steps):
        rec.barrier()
        t0 = time.perf_counter()
        run_step(step)
        steps.append((step, t0, time.perf_counter()))
    trace = None
    if cfg.trace_dir:
        from torch.profiler import ProfilerActivity, profile
        rec.barrier()
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU],
                                      record_shapes=True) as prof:
            run_step(n_steps)
        os.makedirs(cfg.trace_dir, exist_ok=True)
        trace = os.path.join(cfg.trace_dir, f"rank{rank}.trace.json")
        prof.export_chrome_trace(trace)
    rec.barrier()
    return steps, trace


def inject_fault(kind: str, rank: int, step: int) -> None:
    """The fault a run was asked for on this rank at this step: ``raise`` an error, ``hang``,
    or ``exit`` the process (code 3), so the runner's handling of each can be tested."""
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step}")
    if kind == "hang":
        time.sleep(10 ** 6)
    if kind == "exit":
        os._exit(3)


class _quiet_stderr:
    """Silence file descriptor 2 (Kineto prints a line per profiler start and stop)."""

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc):
        os.dup2(self.saved, 2)
        os.close(self.saved)
