"""The fused embedding kernels one rank's shard set is built as, on CPU or GPU.

A shard is a :class:`KernelTable` (rows, columns, precision, the ids of every bag it serves).
Sparse shards run as FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (what TorchRec's
``fused`` kernel runs; ``EmbeddingLocation.HOST`` / ``ComputeDevice.CPU``, or ``DEVICE`` /
``CUDA`` on a GPU), one TBE per weight precision, exact optimizer (``EXACT_SGD`` …);
data-parallel replicas as TorchRec's ``dense`` kernel runs them
(``DenseTableBatchedEmbeddingBagsCodegen``: a dense gradient of all its tables, then one SGD
step). Without fbgemm_gpu (:func:`kernel_backend`) each shard is a
``torch.nn.EmbeddingBag(mode="sum")`` with a sparse SGD update (``index_add_``), each replica
one with a dense gradient. Each kernel has ``forward``, ``backward`` (the optimizer fused in)
and ``release``; :class:`planner.measure.tables.kernels.RankKernels` times them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from simulator.errors import SpecError

from planner.machine import INSTALL_HINT, require_torch

__all__ = ["KernelTable", "kernel_backend", "LR", "sparse_kernels", "dense_kernels"]

#: the optimizers' learning rate (the timing does not depend on it)
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


def sparse_kernels(tables: Sequence[KernelTable], optimizer: str, device: str, backend: str):
    """The sparse shards as one fused kernel per precision (``backend`` ``fbgemm``), or an
    ``EmbeddingBag`` each (``torch``)."""
    return _Fbgemm(tables, optimizer, device) if backend == "fbgemm" \
        else _TorchBags(tables, optimizer, device)


def dense_kernels(tables: Sequence[KernelTable], optimizer: str, device: str, backend: str):
    """The data-parallel replicas as TorchRec's dense kernel (``fbgemm``), or an
    ``EmbeddingBag`` each with a dense gradient (``torch``)."""
    return _FbgemmDense(tables, device) if backend == "fbgemm" \
        else _DenseReplicas(tables, optimizer, device)
