"""A real ring all-reduce (torch.distributed isend/irecv) over an emulated heterogeneous network.

Each process plays one VM of a cost matrix; every message from VM i to VM j costs the sender
``bytes / β(i, j)`` and reaches the receiver ``α(i, j)`` after it was sent (see
:class:`~planner.measure.network.probe.EmulatedLinks`), on top of this machine's own cost, so one machine
can show whether a reordered ring is faster for real. The ring is the
textbook one: reduce-scatter in n − 1 steps, then all-gather in n − 1 steps, chunk k of the
buffer travelling round the ring; each step posts the receive from the previous rank, sleeps,
sends to the next rank and adds the received chunk. The result is checked (every element must
equal the sum of the ranks' inputs) and the time of a run is the slowest rank's.
"""

from __future__ import annotations

import statistics
import time
from typing import Mapping, Sequence

import numpy as np

from simulator.costmatrix import CostMatrix

from planner.measure.network.probe import EmulatedLinks
from planner.measure.network.spawn import run_distributed

__all__ = ["run_emulated_ring"]


def _ring_allreduce(rank, world, order, buf, links, dist, torch):
    pos = order.index(rank)
    nxt, prv = order[(pos + 1) % world], order[(pos - 1) % world]
    chunks = list(buf.chunk(world))
    stamp_in = torch.zeros(1, dtype=torch.float64)

    def step(send_t, recv_t):
        reqs = [dist.irecv(recv_t, prv)]
        if links.active:
            reqs.append(dist.irecv(stamp_in, prv))
        links.serialise(rank, nxt, send_t.numel() * send_t.element_size())
        sends = [dist.isend(send_t, nxt)]
        if links.active:
            sends.append(dist.isend(torch.tensor([time.monotonic()], dtype=torch.float64), nxt))
        for r in reqs:
            r.wait()
        if links.active:
            links.arrive(prv, rank, float(stamp_in))
        for r in sends:
            r.wait()

    for s in range(world - 1):                      # reduce-scatter
        si, ri = (pos - s) % world, (pos - s - 1) % world
        tmp = torch.empty_like(chunks[ri])
        step(chunks[si], tmp)
        chunks[ri].add_(tmp)
    for s in range(world - 1):                      # all-gather
        si, ri = (pos - s + 1) % world, (pos - s) % world
        step(chunks[si], chunks[ri])


def _ring_worker(rank: int, world: int, orders: dict, lat, bw, nbytes: int, repeats: int):
    import torch
    import torch.distributed as dist
    links = EmulatedLinks(lat, bw)
    out: dict[str, list[float]] = {}
    n_el = max(world, nbytes // 4)
    for name, order in orders.items():
        times = []
        for k in range(repeats + 1):                # first run is a warm-up
            buf = torch.full((n_el,), float(rank + 1))
            dist.barrier()
            t0 = time.perf_counter()
            _ring_allreduce(rank, world, list(order), buf, links, dist, torch)
            el = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(el, op=dist.ReduceOp.MAX)
            want = world * (world + 1) / 2
            if not torch.allclose(buf, torch.full_like(buf, want)):
                raise RuntimeError(f"ring all-reduce in order {name} gave a wrong sum")
            if k:
                times.append(float(el))
        out[name] = times
    return out if rank == 0 else None


def run_emulated_ring(cm: CostMatrix, orders: Mapping[str, Sequence[int]], nbytes: int, *,
                      repeats: int = 5, timeout_s: float = 300.0) -> dict[str, dict]:
    """Median and all run times (s) of the ring all-reduce in each order, one process per VM."""
    plain = {k: [int(x) for x in v] for k, v in orders.items()}
    res = run_distributed(_ring_worker, cm.n,
                          args=(plain, np.asarray(cm.latency_s), np.asarray(cm.bandwidth_Bps),
                                int(nbytes), repeats), timeout_s=timeout_s)
    return {k: {"median_s": statistics.median(v), "runs_s": v} for k, v in res.items()}
