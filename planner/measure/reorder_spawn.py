"""Run a function in N spawned torch.distributed processes, with a hard overall timeout.

Every worker joins one process group (``timeout=`` on ``init_process_group`` as well, so a lost peer
fails instead of hanging for the default 30 minutes); rank 0's return value comes back through a
queue. If the whole run takes longer than ``timeout_s`` the parent terminates the processes it
started (by their handles), then kills those still alive, and raises a one-line error.
"""

from __future__ import annotations

import os
import queue as _queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from simulator.errors import ClusterplanError, SpecError

__all__ = ["run_distributed", "ProbeFailed"]


class ProbeFailed(ClusterplanError):
    """A spawned measurement failed or ran out of time (exit code 2, one line)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, backend: str, port: int, timeout_s: float,
            fn: Callable, args: tuple, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
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
    import torch.multiprocessing as mp
    if backend == "nccl":
        import torch
        if not torch.cuda.is_available():
            raise SpecError("backend nccl needs CUDA GPUs, and torch sees none",
                            field="--backend", fix="use --backend gloo on CPU machines")
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, nproc, backend, port, timeout_s, fn, args, out),
                         daemon=True) for r in range(nproc)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    result = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProbeFailed(f"no result within {timeout_s:g} s from {nproc} {backend} "
                                  "processes (fix: raise --timeout or lower --nproc/--repeats)")
            try:
                status, value = out.get(timeout=min(left, 0.5))
            except _queue.Empty:
                if all(not p.is_alive() for p in procs) and out.empty():
                    codes = sorted({p.exitcode for p in procs})
                    raise ProbeFailed(f"all {nproc} processes exited (codes {codes}) without a "
                                      "result") from None
                continue
            if status == "error":
                raise ProbeFailed(value)
            result = value
            break
        for p in procs:
            p.join(timeout=max(1.0, deadline - time.monotonic()))
        return result
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
