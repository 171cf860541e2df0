"""Timing one rank's embedding work for real: a fused table-batched EmbeddingBag, forward and
backward with the optimizer update fused into the backward, one thread.

A rank's *shard set* is a list of :class:`~planner.measure.tables.tbe.KernelTable` (rows,
columns, precision, the ids of every bag it serves). :func:`time_shard_set` builds the kernels
once and times ``warmup + repeats`` iterations of forward, then backward (gradient of ones,
fused SGD/Adagrad/Adam update), and returns the medians.

The kernels (:mod:`planner.measure.tables.tbe`) are FBGEMM's fused TBE, as TorchRec runs it, for
sparse shards and its dense TBE for data-parallel replicas (``backend="auto"``), or
``torch.nn.EmbeddingBag`` when fbgemm_gpu is missing (``torch``; a replica's dense backward is
about 5× slower on CPU: 21 against 3.8 ms for four small replicas, 167k ids, on a 2-core EPYC
VM). Before every timed iteration a buffer twice the size of the last-level cache is written, so
no iteration starts with the previous one's rows in cache (NeuroShard flushes the GPU L2 the
same way); what is measured is a kernel whose first touch of a row goes to memory, with in-batch
repeats free to hit the cache.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

from simulator.errors import SpecError

from planner.machine import last_level_cache_bytes, require_torch
from planner.measure.tables.tbe import KernelTable, dense_kernels, kernel_backend, sparse_kernels

__all__ = ["KernelTiming", "RankKernels", "time_ranks", "time_shard_set", "make_flusher"]


@dataclass
class KernelTiming:
    """Medians (seconds) of one shard set's forward and backward, and every sample."""

    fwd_s: float
    bwd_s: float
    fwd_samples: tuple[float, ...] = ()
    bwd_samples: tuple[float, ...] = ()
    backend: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


class _Flusher:
    def __init__(self, nbytes: int) -> None:
        import torch
        self.buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)

    def __call__(self) -> None:
        self.buf.add_(1.0)


class RankKernels:
    """One rank's shard set built as fused kernels; :meth:`step` times one iteration.

    Sparse shards share one TBE per precision (they must all serve the same number of bags, the
    global batch); ``dense`` replicas share one dense TBE per precision (``EmbeddingBag``s with
    the torch backend) with the local batch.
    """

    def __init__(self, tables: Sequence[KernelTable], *, optimizer: str = "sgd",
                 backend: str = "auto", device: str = "cpu", grad_untimed: bool = False) -> None:
        torch = require_torch()
        self.grad_untimed = grad_untimed
        if device == "cuda" and not torch.cuda.is_available():
            raise SpecError("device cuda requested but torch sees no GPU", source="--device",
                            fix="use --device cpu")
        self.torch = torch
        self.backend = kernel_backend(backend)
        self.device = device
        sparse = [t for t in tables if not t.dense and t.rows > 0 and t.cols > 0]
        dense = [t for t in tables if t.dense and t.rows > 0 and t.cols > 0]
        self.parts = []
        if sparse:
            self.parts.append(sparse_kernels(sparse, optimizer, device, self.backend))
        if dense:
            self.parts.append(dense_kernels(dense, optimizer, device, self.backend))
        self._sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    @property
    def empty(self) -> bool:
        return not self.parts

    def step(self) -> tuple[float, float]:
        """Forward seconds, backward (with the fused update) seconds of one iteration. The
        backward makes its output gradient (ones) and frees the output inside the timing,
        unless the kernels were built with ``grad_untimed``: then the gradient is written
        between the two and the output freed after, untimed (freeing a large output can unmap
        it, which is the heap's cost, not the kernel's)."""
        if not self.parts:
            return 0.0, 0.0
        self._sync()
        t0 = time.perf_counter()
        for p in self.parts:
            p.forward()
        self._sync()
        t1 = t2 = time.perf_counter()
        if self.grad_untimed:
            for p in self.parts:
                p.prepare_backward()
            self._sync()
            t2 = time.perf_counter()
        for p in self.parts:
            p.backward()
            if not self.grad_untimed:
                p.release()
        self._sync()
        t3 = time.perf_counter()
        for p in self.parts:
            p.release()
        return t1 - t0, t3 - t2

    def close(self) -> None:
        self.parts = []


def make_flusher(flush: bool, device: str = "cpu"):
    """A callable that evicts the CPU caches (writes 2 × the last-level cache), or None."""
    if not flush or device != "cpu":
        return None
    require_torch()
    return _Flusher(2 * last_level_cache_bytes())


def time_ranks(rank_tables: Sequence[Sequence[KernelTable]], *, optimizer: str = "sgd",
               repeats: int = 5, warmup: int = 2, backend: str = "auto", device: str = "cpu",
               flush: bool = True, threads: int = 1, interleave: bool = True,
               grad_untimed: bool = False) -> list[KernelTiming]:
    """Time every rank's shard set in this process, one rank at a time.

    With ``interleave`` all ranks' kernels are built first and the iterations go round-robin
    over the ranks (rank 0 iteration 1, rank 1 iteration 1, …), so a burst of load from other
    processes hits every rank alike; otherwise ranks are built and timed one after another.
    Each rank's result is the median of ``repeats`` iterations after ``warmup``;
    ``grad_untimed``: as :class:`RankKernels`.
    """
    torch = require_torch()
    if repeats < 1 or warmup < 0:
        raise SpecError(f"repeats must be ≥ 1 and warmup ≥ 0, got {repeats}, {warmup}",
                        source="--repeats", fix="pass e.g. --repeats 5")
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    fl = make_flusher(flush, device)
    n = len(rank_tables)
    fw: list[list[float]] = [[] for _ in range(n)]
    bw: list[list[float]] = [[] for _ in range(n)]
    kind = kernel_backend(backend)
    try:
        if interleave:
            kernels = [RankKernels(t, optimizer=optimizer, backend=kind, device=device,
                                   grad_untimed=grad_untimed) for t in rank_tables]
            for it in range(warmup + repeats):
                for r, k in enumerate(kernels):
                    if k.empty:
                        continue
                    if fl is not None:
                        fl()
                    f, b = k.step()
                    if it >= warmup:
                        fw[r].append(f)
                        bw[r].append(b)
            for k in kernels:
                k.close()
        else:
            for r, tabs in enumerate(rank_tables):
                k = RankKernels(tabs, optimizer=optimizer, backend=kind, device=device,
                                grad_untimed=grad_untimed)
                if k.empty:
                    continue
                for it in range(warmup + repeats):
                    if fl is not None:
                        fl()
                    f, b = k.step()
                    if it >= warmup:
                        fw[r].append(f)
                        bw[r].append(b)
                k.close()
    finally:
        torch.set_num_threads(prev_threads)
    out = []
    for r in range(n):
        if not fw[r]:
            out.append(KernelTiming(0.0, 0.0, backend=kind))
        else:
            out.append(KernelTiming(statistics.median(fw[r]), statistics.median(bw[r]),
                                    tuple(fw[r]), tuple(bw[r]), backend=kind))
    return out


def time_shard_set(tables: Sequence[KernelTable], *, optimizer: str = "sgd", repeats: int = 5,
                   warmup: int = 2, backend: str = "auto", device: str = "cpu",
                   flush: bool = True, threads: int = 1, grad_untimed: bool = False
                   ) -> KernelTiming:
    """Median forward and backward seconds of one fused shard set (0 when it is empty);
    ``grad_untimed``: as :class:`RankKernels`."""
    return time_ranks([tables], optimizer=optimizer, repeats=repeats, warmup=warmup,
                      backend=backend, device=device, flush=flush, threads=threads,
                      grad_untimed=grad_untimed)[0]


