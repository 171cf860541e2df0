"""Embedding tables laid out as a fused table-batched lookup (FBGEMM's TBE) does it, for the GPU
microbenchmark :mod:`planner.measure.tables.gpu_dlrm`: every table's rows in one weight, bags
table-major, one ``F.embedding_bag`` call forward; the backward by hand as TBE's fused backward
runs (sort the ids, sum each distinct row's gradients, row-wise Adagrad on the distinct rows);
ids uniform or Zipf-distributed. Needs only torch (Triton for the fused kernels).
"""

from __future__ import annotations

import math

__all__ = ["FusedTables", "draw_ids", "table_bags", "lookup_kernels", "check_triton"]

_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _torch():
    import torch
    return torch


# -- ids ---------------------------------------------------------------------------------------
def draw_ids(rows: int, n: int, dist: str, dev, gen):
    """``n`` int64 row ids in ``[0, rows)``: ``uniform`` or ``zipfA`` (power law of exponent A
    over ranks, drawn by the continuous inverse CDF, ranks scattered by a multiplicative hash)."""
    torch = _torch()
    if dist == "uniform" or rows <= 1:
        return torch.randint(0, max(rows, 1), (n,), device=dev, generator=gen)
    a = float(dist.removeprefix("zipf"))
    u = torch.rand(n, device=dev, generator=gen, dtype=torch.float64)
    if abs(a - 1.0) < 1e-9:
        rank = torch.exp(u * math.log(rows + 1.0)) - 1.0
    else:
        top = (rows + 1.0) ** (1.0 - a) - 1.0
        rank = (u * top + 1.0) ** (1.0 / (1.0 - a)) - 1.0
    rank = rank.clamp_(0, rows - 1).to(torch.int64)
    return (rank * 2_654_435_761 + 97) % rows


def table_bags(tables: list[tuple[int, int]], batch: int, dist: str, dev, gen) -> tuple:
    """``(ids, lengths, offsets)`` of ``batch`` bags per table, table-major, as one fused lookup
    takes them: each ``(rows, pooling)`` table's ids offset by the rows before it in the joint
    weight, ``pooling`` ids a bag, drawn by :func:`draw_ids` from ``gen``."""
    torch = _torch()
    ids, lengths, base = [], [], 0
    for rows, pool in tables:
        ids.append(draw_ids(rows, batch * pool, dist, dev, gen) + base)
        lengths.append(torch.full((batch,), pool, device=dev, dtype=torch.int64))
        base += rows
    lengths = torch.cat(lengths)
    offsets = torch.zeros(lengths.numel(), device=dev, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)[:-1]
    return torch.cat(ids), lengths, offsets


class FusedTables:
    """All tables in one weight (row offset per table), bags table-major, one ``embedding_bag``
    call; backward and row-wise Adagrad by hand (see the module docstring)."""

    def __init__(self, tables: list[tuple[int, int]], dim: int, batch: int, dtype: str,
                 dist: str, dev, seed: int = 0):
        torch = _torch()
        self.dev, self.dim, self.batch = dev, dim, batch
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        total = sum(r for r, _ in tables)
        self.weight = torch.empty(total, dim, device=dev, dtype=getattr(torch, _DTYPES[dtype]))
        self.weight.uniform_(-0.01, 0.01, generator=gen)
        self.state = torch.zeros(total, device=dev, dtype=torch.float32)
        self.ids, lengths, self.offsets = table_bags(tables, batch, dist, dev, gen)
        self.bag_of_id = torch.repeat_interleave(torch.arange(lengths.numel(), device=dev),
                                                 lengths)
        self.bags = lengths.numel()
        self.distinct = int(torch.unique(self.ids).numel())

    def forward(self):
        import torch.nn.functional as F
        return F.embedding_bag(self.ids, self.weight, self.offsets, mode="sum")

    def sort(self):
        torch = _torch()
        return torch.unique(self.ids, return_inverse=True)

    def reduce(self, grad, uniq, inv):
        torch = _torch()
        acc = torch.zeros(uniq.numel(), self.dim, device=self.dev, dtype=torch.float32)
        acc.index_add_(0, inv, grad.index_select(0, self.bag_of_id).float())
        return acc

    def update(self, uniq, acc, lr: float = 0.01, eps: float = 1e-8):
        s = self.state.index_select(0, uniq) + acc.pow(2).mean(1)
        self.state.index_copy_(0, uniq, s)
        step = acc.mul_((lr / (s.sqrt() + eps)).unsqueeze(1))
        self.weight.index_add_(0, uniq, step.to(self.weight.dtype), alpha=-1.0)

    def backward(self, grad):
        uniq, inv = self.sort()
        self.update(uniq, self.reduce(grad, uniq, inv))


def lookup_kernels(ft, kernel: str, max_pooling: int):
    """The object whose ``forward``/``backward`` time ``ft``'s lookups: ``ft`` itself (PyTorch
    ops) or the fused Triton kernels (:mod:`planner.measure.tables.gpu_tbe_triton`)."""
    if kernel == "torch":
        return ft
    if kernel == "triton-nosync":
        from planner.measure.tables.gpu_tbe_nosync import TritonTablesNoSync
        return TritonTablesNoSync(ft, max_pooling=max_pooling)
    from planner.measure.tables.gpu_tbe_triton import TritonTables
    return TritonTables(ft, max_pooling=max_pooling)


def check_triton(dev, kernel: str = "triton") -> str:
    """'ok' when ``kernel``'s Triton kernels give PyTorch's results on a small mixed case (hot
    rows longer than a chunk, rows looked up once), else why not. On CUDA a ``triton-nosync``
    backward must also replay from a CUDA graph with the same result ('ok, but ...' when it
    cannot be captured at all)."""
    torch = _torch()
    tables = [(5000, 3), (70, 1), (20000, 40)]
    a, b = (FusedTables(tables, 96, 256, "fp32", "zipf1.2", dev, seed=5) for _ in range(2))
    tt = lookup_kernels(b, kernel, 40)
    if not torch.allclose(a.forward(), tt.forward(), atol=1e-5):
        return "forward differs"
    g = torch.randn(a.bags, 96, device=dev)
    a.backward(g)
    tt.backward(g)
    if not torch.allclose(a.weight, b.weight, atol=1e-6):
        return "backward differs"
    if not torch.allclose(a.state, b.state, rtol=1e-4, atol=1e-9):   # fp32 sums, any order
        return "optimizer state differs"
    if kernel == "triton-nosync" and dev.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                tt.backward(g)
        except RuntimeError as exc:                 # still a valid eager kernel
            return f"ok, but the backward cannot be captured in a CUDA graph: {exc!r}"[:300]
        a.backward(g)
        graph.replay()
        if not torch.allclose(a.weight, b.weight, atol=1e-6):
            return "backward differs when replayed from a CUDA graph"
    return "ok"
