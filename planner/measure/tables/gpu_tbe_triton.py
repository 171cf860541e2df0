"""A fused table-batched lookup in Triton, shaped like FBGEMM's TBE, for measuring what a fused
kernel reaches on a GPU that has no FBGEMM (:mod:`planner.measure.tables.gpu_dlrm`).

Forward: a program takes a block of bags (as TBE's kernels give each warp bags of its own) and
gathers one row of each bag per step, a tile of rows in flight, then writes the pooled sums.
Backward with row-wise Adagrad, as TBE's fused backward does it: sort the ids (radix sort), find
each distinct row's run, and in one kernel per distinct row sum the gradients of the bags that
looked it up, update its one fp32 accumulator and write the row (a block of distinct rows per
program); nothing else of the table is touched. A hot row's run longer than ``chunk`` ids is first
summed in chunks by many programs (as TBE splits long segments), so one row looked up a million
times does not serialise the kernel.

Runs under ``TRITON_INTERPRET=1`` on CPU tensors too (Triton 3.6's interpreter needs NumPy < 2.4):
that is how it was checked against the PyTorch ops before any GPU run; on the GPU,
``gpu_dlrm --kernel triton`` checks it again before timing. CI has no Triton and skips it.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["TritonTables", "gather_sum"]


@triton.jit
def gather_sum(acc, src, idx, start, length, active, d, dm, D: tl.constexpr):
    """``acc`` plus, for each active lane ``i``, the rows ``src[idx[start[i] + j]]`` for
    ``j < length[i]`` (fp32 sums of ``D``-wide rows; ``d`` / ``dm`` the column lanes)."""
    for j in range(0, tl.max(length, axis=0)):
        jm = (active & (j < length))[:, None]
        r = tl.load(idx + (start + j)[:, None], mask=jm, other=0)
        acc += tl.load(src + r * D + d[None, :], mask=jm & dm[None, :], other=0.0).to(tl.float32)
    return acc


@triton.jit
def _bag_forward(W, ids, offsets, out, bags, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_B: tl.constexpr):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    bm = b < bags
    start = tl.load(offsets + b, mask=bm, other=0)
    length = (tl.load(offsets + b + 1, mask=bm, other=0) - start).to(tl.int32)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    acc = gather_sum(tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.float32), W, ids, start, length, bm,
                     d, dm, D)
    tl.store(out + b[:, None] * D + d[None, :], acc.to(out.dtype.element_ty),
             mask=bm[:, None] & dm[None, :])


@triton.jit
def _chunk_sum(G, chunk_start, chunk_end, bag_sorted, partial, D: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    c = tl.program_id(0)
    start = tl.load(chunk_start + c)
    end = tl.load(chunk_end + c)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for p0 in range(start, end, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        pm = p < end
        b = tl.load(bag_sorted + p, mask=pm, other=0)
        tile = tl.load(G + b[:, None] * D + d[None, :], mask=pm[:, None] & dm[None, :], other=0.0)
        acc += tl.sum(tile.to(tl.float32), axis=0)
    tl.store(partial + c * D + d, acc, mask=dm)


@triton.jit
def _row_adagrad(W, state, G, uniq, run_start, run_end, bag_sorted, chunk_first, chunk_count,
                 partial, runs, lr, eps, D: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rm = r < runs
    row = tl.load(uniq + r, mask=rm, other=0)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    m2 = rm[:, None] & dm[None, :]
    acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
    first = tl.load(chunk_first + r, mask=rm, other=0)
    nch = tl.load(chunk_count + r, mask=rm, other=0)
    start = tl.load(run_start + r, mask=rm, other=0)
    length = tl.where(nch > 0, 0, tl.load(run_end + r, mask=rm, other=0) - start).to(tl.int32)
    nch = nch.to(tl.int32)
    acc = gather_sum(acc, G, bag_sorted, start, length, rm, d, dm, D)   # short runs
    for c in range(0, tl.max(nch, axis=0)):             # hot rows: their chunks' partial sums
        cm = rm & (c < nch)
        acc += tl.load(partial + (first + c)[:, None] * D + d[None, :],
                       mask=cm[:, None] & dm[None, :], other=0.0)
    s = tl.load(state + row, mask=rm, other=0.0) + tl.sum(acc * acc, axis=1) / D
    tl.store(state + row, s, mask=rm)
    w = tl.load(W + row[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
    w = w - lr * acc / (tl.sqrt(s) + eps)[:, None]
    tl.store(W + row[:, None] * D + d[None, :], w.to(W.dtype.element_ty), mask=m2)


class TritonTables:
    """The Triton kernels over a :class:`~planner.measure.tables.gpu_fused.FusedTables`'s weight,
    state, ids and offsets (same inputs, same results as its PyTorch forward and backward)."""

    def __init__(self, ft, *, max_pooling: int, chunk: int = 64):
        import torch
        self.ft, self.chunk = ft, chunk
        self.block_d = triton.next_power_of_2(ft.dim)
        self.block_p = max(1, min(16, triton.next_power_of_2(max(1, max_pooling))))
        self.block_b = max(1, min(64, 4096 // self.block_d))    # bags or rows per program
        self.ends = torch.cat([ft.offsets, torch.tensor([ft.ids.numel()], device=ft.ids.device)])

    def forward(self):
        import torch
        ft = self.ft
        out = torch.empty(ft.bags, ft.dim, device=ft.ids.device, dtype=ft.weight.dtype)
        _bag_forward[(triton.cdiv(ft.bags, self.block_b),)](
            ft.weight, ft.ids, self.ends, out, ft.bags, D=ft.dim, BLOCK_D=self.block_d,
            BLOCK_B=self.block_b, num_stages=1)
        return out

    def sort(self):
        """(distinct rows, each run's first and past-last index, the sorted ids' bags, and the
        chunks of the hot rows' runs: each run's first chunk, its chunk count (0 for a run
        short enough for one program), every chunk's first and past-last index)."""
        import torch
        ft = self.ft
        sorted_ids, order = torch.sort(ft.ids)
        uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
        run_end = torch.cumsum(counts, 0)
        run_start = run_end - counts
        nch = torch.where(counts > self.chunk, (counts + self.chunk - 1) // self.chunk, 0)
        first = torch.cumsum(nch, 0) - nch
        run_of = torch.repeat_interleave(torch.arange(uniq.numel(), device=uniq.device), nch)
        k = torch.arange(run_of.numel(), device=uniq.device) - first.index_select(0, run_of)
        c_start = run_start.index_select(0, run_of) + k * self.chunk
        c_end = torch.minimum(c_start + self.chunk, run_end.index_select(0, run_of))
        return (uniq, run_start, run_end, ft.bag_of_id.index_select(0, order), first, nch,
                c_start, c_end)

    def update(self, grad, uniq, run_start, run_end, bag_sorted, first, nch, c_start, c_end,
               lr: float = 0.01, eps: float = 1e-8):
        import torch
        ft = self.ft
        partial = torch.empty(max(c_start.numel(), 1), ft.dim, device=grad.device,
                              dtype=torch.float32)
        if c_start.numel():
            _chunk_sum[(c_start.numel(),)](grad, c_start, c_end, bag_sorted, partial, D=ft.dim,
                                           BLOCK_D=self.block_d, BLOCK_P=self.block_p)
        runs = uniq.numel()
        _row_adagrad[(triton.cdiv(runs, self.block_b),)](
            ft.weight, ft.state, grad, uniq, run_start, run_end, bag_sorted, first, nch,
            partial, runs, lr, eps, D=ft.dim, BLOCK_D=self.block_d, BLOCK_R=self.block_b,
            num_stages=1)

    def backward(self, grad):
        self.update(grad.contiguous(), *self.sort())
