"""Run a function in N spawned torch.distributed processes, with a hard overall timeout.

Every worker joins one process group (:func:`planner.measure.runner.init_group`, whose timeout
makes a lost peer fail instead of hanging for the default 30 minutes); rank 0's return value
comes back through a queue. If the whole run takes longer than ``timeout_s`` the parent ends the
processes it started (:func:`planner.measure.runner.end_processes`) and raises a one-line error.
"""

from __future__ import annotations

import os
import queue as _queue
import time
import traceback
from typing import Any, Callable

from simulator.errors import ClusterplanError, SpecError

from planner.measure.runner import (
    SPAWN,
    end_processes,
    release,
    rendezvous,
    init_group,
    running,
    start_processes,
    wait,
)

__all__ = ["run_distributed", "ProbeFailed"]


class ProbeFailed(ClusterplanError):
    """A spawned measurement failed or ran out of time (exit code 2, one line)."""


def _worker(rank: int, world: int, backend: str, rdzv: str, timeout_s: float,
            fn: Callable, args: tuple, out) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        init_group(backend, rank, world, rdzv, timeout_s)
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        if rank == 0:
            out.put(("ok", result))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent as one line
        out.put(("error", f"rank {rank}: {exc.__class__.__name__}: {exc}".splitlines()[0]
                 + ("" if str(exc) else " " + traceback.format_exc(limit=1).splitlines()[-1])))


def run_distributed(fn: Callable, nproc: int, *, args: tuple = (), backend: str = "gloo",
                    timeout_s: float = 120.0) -> Any:
    """Run ``fn(rank, world, *args)`` in ``nproc`` spawned processes; return rank 0's result."""
    if backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            raise SpecError("backend nccl needs CUDA GPUs, and torch sees none",
                            field="--backend", fix="use --backend gloo on CPU machines")
    out = SPAWN.Queue()
    rdzv = rendezvous()
    procs = start_processes(_worker, [(r, nproc, backend, rdzv, timeout_s, fn, args, out)
                                      for r in range(nproc)])
    deadline = time.monotonic() + timeout_s
    try:
        result = _result(out, procs, deadline, timeout_s, backend)
        wait(procs, max(1.0, deadline - time.monotonic()))
        return result
    finally:
        end_processes(procs)
        release(rdzv)


def _result(out, procs: list, deadline: float, timeout_s: float, backend: str) -> Any:
    """Rank 0's result from ``out``, or ProbeFailed: a rank's error, every process gone without
    a result, or no result by ``deadline`` (time.monotonic() seconds)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ProbeFailed(f"no result within {timeout_s:g} s from {len(procs)} {backend} "
                              "processes (fix: raise --timeout or lower --nproc/--repeats)")
        try:
            status, value = out.get(timeout=min(left, 0.5))
        except _queue.Empty:
            if not running(procs) and out.empty():
                codes = sorted({p.exitcode for p in procs})
                raise ProbeFailed(f"all {len(procs)} processes exited (codes {codes}) without a "
                                  "result") from None
            continue
        if status == "error":
            raise ProbeFailed(value)
        return value
