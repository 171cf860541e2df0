"""Timing one rank's embedding work for real: a fused table-batched EmbeddingBag, forward and
backward with the optimizer update fused into the backward, one thread.

A rank's *shard set* is a list of :class:`KernelTable` (rows, columns, precision, the ids of every
bag it serves). :func:`time_shard_set` builds the kernels once and times ``warmup + repeats``
iterations of forward, then backward (gradient of ones, fused SGD/Adagrad/Adam update), and
returns the medians.

Kernels, in order of preference (``backend="auto"``):

- ``fbgemm``: FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (what TorchRec's ``fused``
  kernel runs), ``EmbeddingLocation.HOST`` / ``ComputeDevice.CPU`` — or ``DEVICE`` / ``CUDA``
  when ``device="cuda"`` — one TBE per weight precision, exact optimizer (``EXACT_SGD`` …);
- ``torch``: one ``torch.nn.EmbeddingBag(mode="sum", sparse=True)`` per shard and a sparse SGD
  update (``index_add_``) — the fallback when fbgemm_gpu is missing.

Data-parallel replicas run as TorchRec's ``dense`` kernel does (``BatchedDenseEmbeddingBag``):
FBGEMM's ``DenseTableBatchedEmbeddingBagsCodegen``, one per weight precision, whose backward
makes a dense gradient of the whole table, then the whole table updated (SGD); with the
``torch`` backend an ``EmbeddingBag`` per replica with a dense gradient (about 5× slower
backward on CPU: 21 against 3.8 ms for four small replicas, 167k ids, on a 2-core EPYC VM).
Before every timed iteration a buffer twice the size of the last-level cache is written, so no
iteration starts with the previous one's rows in cache (NeuroShard flushes the GPU L2 the same
way); what is measured is a kernel whose first touch of a row goes to memory, with in-batch
repeats free to hit the cache.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from simulator.errors import SpecError

from planner.machine import INSTALL_HINT, last_level_cache_bytes, require_torch

__all__ = ["KernelTable", "KernelTiming", "RankKernels", "time_ranks", "time_shard_set",
           "kernel_backend", "make_flusher"]

LR = 0.01


def kernel_backend(backend: str = "auto") -> str:
    """``fbgemm`` when FBGEMM's TBE imports (and ``backend`` allows it), else ``torch``."""
    if backend not in ("auto", "fbgemm", "torch"):
        raise SpecError(f"unknown kernel backend {backend!r}", source="--kernel",
                        fix="use auto, fbgemm or torch")
    require_torch()
    if backend == "torch":
        return "torch"
    try:
        with warnings.catch_warnings():       # the CPU build warns of its absent SSD ops
            warnings.simplefilter("ignore", DeprecationWarning)
            import fbgemm_gpu  # noqa: F401
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (  # noqa: F401
                SplitTableBatchedEmbeddingBagsCodegen,
            )
        return "fbgemm"
    except Exception:
        if backend == "fbgemm":
            raise SpecError("fbgemm_gpu does not import", source="--kernel",
                            fix=INSTALL_HINT + ", or pass --kernel torch") from None
        return "torch"


@dataclass
class KernelTable:
    """One shard as one table of a fused kernel.

    ``indices`` are row ids local to the shard (``0 .. rows-1``), ``offsets`` the bag
    boundaries (``len = bags + 1``). ``dense`` marks a data-parallel replica.
    """

    rows: int
    cols: int
    precision: str
    indices: np.ndarray
    offsets: np.ndarray
    dense: bool = False
    name: str = ""

    @property
    def bags(self) -> int:
        return len(self.offsets) - 1

    @property
    def lookups(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])


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


_OPTIM = {"sgd": "EXACT_SGD", "adagrad": "EXACT_ADAGRAD",
          "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}


def _touched_grads(torch, outs, grads):
    """An output gradient per output (ones; made once, kept while the shapes hold), each
    written again now, as a step's gradient arrives just written by the collective before it
    (in cache as far as it fits)."""
    if len(grads) != len(outs) or any(g.shape != o.shape for g, o in zip(grads, outs)):
        grads = [torch.empty_like(o) for o in outs]
    for g in grads:
        g.fill_(1.0)
    return grads


class _Outputs:
    """The outputs of a forward and the gradients its backward is given (ones, made in the
    backward unless :meth:`prepare_backward` wrote them first)."""

    torch: object
    outs: list
    grads: list

    def prepare_backward(self) -> None:
        self.grads = _touched_grads(self.torch, self.outs, self.grads)

    def out_grads(self) -> list:
        if len(self.grads) == len(self.outs):
            return self.grads
        return [self.torch.ones_like(o) for o in self.outs]

    def release(self) -> None:
        self.outs = []


class _Fbgemm(_Outputs):
    """One TBE per weight precision, bags of equal count per table."""

    def __init__(self, tables: Sequence[KernelTable], optimizer: str, device: str) -> None:
        import torch
        with warnings.catch_warnings():       # the CPU build warns of its absent SSD ops
            warnings.simplefilter("ignore", DeprecationWarning)
            from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
                EmbeddingLocation,
                PoolingMode,
            )
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                ComputeDevice,
                SplitTableBatchedEmbeddingBagsCodegen,
            )
        self.torch = torch
        cuda = device == "cuda"
        loc = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
        cdev = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        self.groups = []
        for half, group in _precision_groups(tables):
            emb = SplitTableBatchedEmbeddingBagsCodegen(
                [(int(t.rows), int(t.cols), loc, cdev) for t in group],
                optimizer=getattr(EmbOptimType, _OPTIM[optimizer]), learning_rate=LR,
                weights_precision=SparseType.FP16 if half else SparseType.FP32,
                output_dtype=SparseType.FP32, pooling_mode=PoolingMode.SUM,
                device=torch.device(device))
            self.groups.append((emb, *_inputs(torch, group, device)))
        self.outs = []
        self.grads = []

    def forward(self) -> None:
        self.outs = [emb(idx, off) for emb, idx, off in self.groups]

    def backward(self) -> None:
        for out, g in zip(self.outs, self.out_grads()):
            out.backward(g)


class _TorchBags(_Outputs):
    """``nn.EmbeddingBag`` per table; sparse gradients with an in-place SGD step (dense for DP)."""

    def __init__(self, tables: Sequence[KernelTable], optimizer: str, device: str) -> None:
        import torch
        self.torch = torch
        dev = torch.device(device)
        self.items = []
        for t in tables:
            dtype = torch.float16 if t.precision in ("fp16", "bf16") and device == "cuda" \
                else torch.float32
            bag = torch.nn.EmbeddingBag(int(t.rows), int(t.cols), mode="sum",
                                        sparse=not t.dense, device=dev, dtype=dtype)
            idx = torch.from_numpy(t.indices.astype(np.int64)).to(dev)
            off = torch.from_numpy(t.offsets[:-1].astype(np.int64)).to(dev)
            self.items.append((bag, idx, off, t.dense))
        self.outs = []
        self.grads = []

    def forward(self) -> None:
        self.outs = [bag(idx, off) for bag, idx, off, _ in self.items]

    def backward(self) -> None:
        torch = self.torch
        for (bag, _, _, dense), out, og in zip(self.items, self.outs, self.out_grads()):
            out.backward(og)
            w = bag.weight
            g = w.grad
            with torch.no_grad():
                if g is None:
                    continue
                if g.is_sparse:
                    g = g.coalesce()
                    w.index_add_(0, g.indices()[0], g.values(), alpha=-LR)
                else:
                    w.add_(g, alpha=-LR)
            w.grad = None


class _DenseReplicas(_TorchBags):
    """Data-parallel replicas without FBGEMM: an ``EmbeddingBag`` each, dense gradient,
    whole-table step."""


class _FbgemmDense(_Fbgemm):
    """Data-parallel replicas as TorchRec's ``dense`` kernel runs them: one FBGEMM
    ``DenseTableBatchedEmbeddingBagsCodegen`` per weight precision, a dense gradient of all its
    tables, then one SGD step over all of them."""

    def __init__(self, tables: Sequence[KernelTable], device: str) -> None:
        import torch
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from fbgemm_gpu.split_embedding_configs import SparseType
            from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
                DenseTableBatchedEmbeddingBagsCodegen,
            )
        self.torch = torch
        self.groups = []
        for half, group in _precision_groups(tables):
            emb = DenseTableBatchedEmbeddingBagsCodegen(
                [(int(t.rows), int(t.cols)) for t in group],
                weights_precision=SparseType.FP16 if half else SparseType.FP32,
                output_dtype=SparseType.FP32, use_cpu=device != "cuda").to(torch.device(device))
            self.groups.append((emb, *_inputs(torch, group, device)))
        self.outs = []
        self.grads = []

    def backward(self) -> None:
        torch = self.torch
        for (emb, _, _), out, og in zip(self.groups, self.outs, self.out_grads()):
            with warnings.catch_warnings():
                # torch warns that FBGEMM's CPU op has no autograd kernel registered; its
                # backward is FBGEMM's own and its gradient exact (checked in the tests)
                warnings.filterwarnings("ignore", message=".*autograd kernel was not registered")
                out.backward(og)
            w = emb.weights
            with torch.no_grad():
                if w.grad is not None:
                    w.add_(w.grad.to(w.dtype), alpha=-LR)
            w.grad = None


def _precision_groups(tables: Sequence[KernelTable]):
    """The tables of one fused kernel per weight precision, in precision order: yields
    ``(half, group)``, ``half`` True for fp16/bf16 rows; every table of a group serves the
    same number of bags."""
    by_prec: dict[str, list[KernelTable]] = {}
    for t in tables:
        by_prec.setdefault(t.precision, []).append(t)
    for prec, group in sorted(by_prec.items()):
        if len({t.bags for t in group}) != 1:
            raise ValueError("tables of one fused kernel must serve the same number of bags")
        yield prec in ("fp16", "bf16"), group


def _inputs(torch, group: Sequence[KernelTable], device: str) -> tuple:
    """One fused kernel's ids and offsets (:func:`_concat`) as tensors on ``device``."""
    idx, off = _concat(group)
    dev = torch.device(device)
    return torch.from_numpy(idx).to(dev), torch.from_numpy(off).to(dev)


def _concat(group: Sequence[KernelTable]) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate tables' bags into one TBE input (offsets over tables × bags, plus one)."""
    idx = np.concatenate([t.indices.astype(np.int64, copy=False) for t in group]) \
        if group else np.zeros(0, dtype=np.int64)
    offs = [np.zeros(1, dtype=np.int64)]
    base = 0
    for t in group:
        o = t.offsets.astype(np.int64) - int(t.offsets[0])
        offs.append(o[1:] + base)
        base += int(o[-1])
    return idx, np.concatenate(offs)


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
            self.parts.append(_Fbgemm(sparse, optimizer, device) if self.backend == "fbgemm"
                              else _TorchBags(sparse, optimizer, device))
        if dense:
            self.parts.append(_FbgemmDense(dense, device) if self.backend == "fbgemm"
                              else _DenseReplicas(dense, optimizer, device))
        self._sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    @property
    def empty(self) -> bool:
        return not self.parts

    def step(self) -> tuple[float, float]:
        """Forward seconds, backward (with the fused update) seconds of one iteration. The
        backward makes its output gradient (ones) and frees the output inside the timing,
        unless the kernels were built with ``grad_untimed``: then the gradient is written
        between the two and the output freed after, untimed (:func:`_touched_grads`; freeing
        a large output can unmap it, which is the heap's cost, not the kernel's)."""
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


