"""Timing of collectives on gloo ranks for the calibrations: every rank runs the same calls at
the same time, a barrier before each timed loop, and reports its own seconds per call. Used by
``calibrate gloo`` (:mod:`.calibrate`) and its uneven all-to-all probe (:mod:`.uneven_a2a`)."""

from __future__ import annotations

import time

__all__ = ["alltoallv_chunk", "time_calls", "time_comm"]


def time_calls(dist, call, *, repeats: int, calls: int, warmup: int = 2) -> list:
    """Seconds per call of ``call``: ``warmup`` calls after barriers, then ``repeats`` loops of
    ``calls`` calls back to back, each after a barrier (its skew spread over the loop)."""
    for _ in range(warmup):
        dist.barrier()
        call()
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - t0) / calls)
    return times


def time_comm(dist, torch, kind: str, size: int, world: int, rank: int, repeats: int) -> list:
    """This rank's seconds per call of ``kind`` on ``size`` bytes (fp32), per repeat
    (``alltoallv``: bytes sent to the other ranks; the others: the nccl-tests buffer)."""
    if kind == "alltoallv":
        return _time_alltoallv(dist, torch, size, world, repeats)
    n = max(1, size // 4)
    if kind in ("allgather", "reducescatter", "alltoall"):
        n = max(world, n - n % world)
    x = torch.ones(n)
    if kind == "allreduce":
        def call():
            dist.all_reduce(x)
    elif kind == "broadcast":
        def call():
            dist.broadcast(x, 0)
    elif kind == "allgather":
        part = torch.ones(n // world)

        def call():
            dist.all_gather_into_tensor(x, part)
    elif kind == "reducescatter":
        part = torch.empty(n // world)

        def call():
            dist.reduce_scatter_tensor(part, x)
    elif kind == "alltoall":
        y = torch.empty(n)

        def call():
            dist.all_to_all_single(y, x)
    else:                                    # sendrecv: rank 0 → rank 1, the others idle
        def call():
            if rank == 0:
                dist.send(x, 1)
            elif rank == 1:
                dist.recv(x, 0)
    # back to back, as a step issues them: one barrier's skew between ranks spread over k calls
    return time_calls(dist, call, repeats=repeats, calls=_calls(size))


def _calls(size: int) -> int:
    """Calls per timed loop: enough small ones to outlast a barrier's skew, one large one."""
    return max(1, min(32, 2 ** 21 // max(size, 1)))


def alltoallv_chunk(size: int, world: int) -> int:
    """fp32 elements each rank sends each rank (itself included) in the ``alltoallv`` probe of
    ``size`` bytes: ``size`` is what a rank sends to the *others*, so the chunk is
    ``size / (world − 1)`` bytes."""
    return max(1, size // 4 // max(world - 1, 1))


def _time_alltoallv(dist, torch, size: int, world: int, repeats: int) -> list:
    """The all-to-all TorchRec makes: ``all_to_all_single`` with split lists (gloo's
    ``alltoallv``, another code path than the equal call), equal chunks, a rank's own chunk
    kept (a local copy). ``size``: bytes a rank sends to the other ranks, the convention of a
    plan's byte matrix off its diagonal."""
    chunk = alltoallv_chunk(size, world)
    splits = [chunk] * world
    x, y = torch.ones(chunk * world), torch.empty(chunk * world)

    def call():
        dist.all_to_all_single(y, x, splits, splits)
    return time_calls(dist, call, repeats=repeats, calls=_calls(size))
