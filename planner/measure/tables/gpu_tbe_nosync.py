"""A fused lookup backward in Triton that never waits for the host, as FBGEMM's TBE backward
runs, for measuring a fused call's real fixed cost (:mod:`planner.measure.tables.gpu_dlrm`,
``--kernel triton-nosync``).

:mod:`planner.measure.tables.gpu_tbe_triton`'s backward sizes its launches by the number of
distinct rows and of hot-row chunks, which the host must read back first (``unique_consecutive``,
``repeat_interleave``): two device-to-host waits per call, and a call that cannot be captured in a
CUDA graph. FBGEMM's backward instead launches every kernel over an upper bound (the id count)
and reads the number of runs and of long runs from device memory
(``sorted_linear_indices_num_runs``, ``find_long_segments``), and sorts keys only as wide as the
table's row count. This module does the same:

1. sort the ids as 32-bit keys when every row index fits (FBGEMM sorts only the bits the row
   count needs), and mark each run's first id with a scan: the run count stays on the device;
2. sum the gradients of long runs (more than ``chunk`` ids: the hot rows) in windows of
   ``chunk`` sorted ids, many programs per run, into one fp32 partial sum per long run;
3. one program per block of run slots (an upper bound of runs; slots past the device's run count
   return at once) sums each short run's gradients, takes each long run's partial sum, and
   applies row-wise Adagrad to the distinct rows.

The forward is :mod:`~planner.measure.tables.gpu_tbe_triton`'s. Same inputs, same results as the
PyTorch ops (checked by :func:`~planner.measure.tables.gpu_fused.check_triton`); runs under
``TRITON_INTERPRET=1`` on CPU tensors too. CI has no Triton and skips it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from planner.measure.tables.gpu_tbe_triton import TritonTables, gather_sum

__all__ = ["TritonTablesNoSync"]


@triton.jit
def _long_window_sum(G, bag_sorted, run_of, run_start, slot, partial, n, chunk,
                     D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_P: tl.constexpr):
    """Adds the gradients of window ``program_id``'s sorted ids that belong to long runs into
    their run's partial sum: one atomic add per run if the window holds one run, else per id."""
    w = tl.program_id(0)
    p = w * BLOCK_P + tl.arange(0, BLOCK_P)
    pm = p < n
    run = tl.load(run_of + p, mask=pm, other=0)
    length = tl.load(run_start + run + 1, mask=pm, other=0) - tl.load(run_start + run, mask=pm,
                                                                       other=0)
    is_long = pm & (length > chunk)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    if tl.max(is_long.to(tl.int32), axis=0) > 0:
        first = tl.min(tl.where(pm, run, 2147483647), axis=0)
        last = tl.max(tl.where(pm, run, -1), axis=0)
        if first == last:                           # the window lies inside one long run
            b = tl.load(bag_sorted + p, mask=pm, other=0)
            tile = tl.load(G + b[:, None] * D + d[None, :], mask=pm[:, None] & dm[None, :],
                           other=0.0)
            s = tl.load(slot + first)
            tl.atomic_add(partial + s * D + d, tl.sum(tile.to(tl.float32), axis=0), mask=dm)
        else:                                       # a run boundary: id by id
            for j in range(0, BLOCK_P):
                q = w * BLOCK_P + j
                if q < n:
                    r = tl.load(run_of + q)
                    if tl.load(run_start + r + 1) - tl.load(run_start + r) > chunk:
                        g = tl.load(G + tl.load(bag_sorted + q) * D + d, mask=dm, other=0.0)
                        tl.atomic_add(partial + tl.load(slot + r) * D + d, g.to(tl.float32),
                                      mask=dm)


@triton.jit
def _run_adagrad(W, state, G, keys, bag_sorted, run_start, slot, partial, num_runs, chunk, lr,
                 eps, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    """Row-wise Adagrad on the distinct rows of run slots ``[pid·BLOCK_R, (pid+1)·BLOCK_R)``;
    slots at or past the device's run count do nothing."""
    runs = tl.load(num_runs)
    if tl.program_id(0) * BLOCK_R < runs:
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = r < runs
        start = tl.load(run_start + r, mask=rm, other=0)
        length = tl.load(run_start + r + 1, mask=rm, other=0) - start
        is_long = rm & (length > chunk)
        short = tl.where(is_long, 0, length).to(tl.int32)
        row = tl.load(keys + start, mask=rm, other=0).to(tl.int64)
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        acc = tl.zeros([BLOCK_R, BLOCK_D], dtype=tl.float32)
        acc = gather_sum(acc, G, bag_sorted, start, short, rm, d, dm, D)
        s_long = tl.load(slot + r, mask=is_long, other=0)
        acc += tl.load(partial + s_long[:, None] * D + d[None, :],
                       mask=is_long[:, None] & dm[None, :], other=0.0)
        m2 = rm[:, None] & dm[None, :]
        s = tl.load(state + row, mask=rm, other=0.0) + tl.sum(acc * acc, axis=1) / D
        tl.store(state + row, s, mask=rm)
        w = tl.load(W + row[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
        w = w - lr * acc / (tl.sqrt(s) + eps)[:, None]
        tl.store(W + row[:, None] * D + d[None, :], w.to(W.dtype.element_ty), mask=m2)


class TritonTablesNoSync(TritonTables):
    """:class:`~planner.measure.tables.gpu_tbe_triton.TritonTables` with the host-free backward
    of the module docstring (the forward is the parent's)."""

    def __init__(self, ft, *, max_pooling: int, chunk: int = 64):
        import torch
        super().__init__(ft, max_pooling=max_pooling, chunk=chunk)
        n = ft.ids.numel()
        self.key_dtype = torch.int32 if ft.weight.shape[0] < 2**31 else torch.int64
        self.bag_of_id = ft.bag_of_id.to(torch.int32)
        self.positions = torch.arange(n, device=ft.ids.device, dtype=torch.int32)

    def sort(self):
        """(sorted keys, each sorted id's bag, each sorted id's run, every run slot's first
        index with the slots from the run count on at ``n``, the run count as a 1-element
        device tensor, each run's long-run slot, the zeroed long-run partial sums)."""
        import torch
        ft, n = self.ft, self.ft.ids.numel()
        keys, order = torch.sort(ft.ids.to(self.key_dtype))
        head = torch.ones(n, device=keys.device, dtype=torch.bool)
        torch.ne(keys[1:], keys[:-1], out=head[1:])
        run_of = torch.cumsum(head, 0, dtype=torch.int32) - 1
        run_start = torch.full((n + 2,), n, device=keys.device, dtype=torch.int32)
        run_start.scatter_(0, torch.where(head, run_of, n + 1).long(), self.positions)
        num_runs = run_of[-1:] + 1
        is_long = (run_start[1:n + 1] - run_start[:n]) > self.chunk
        slot = torch.cumsum(is_long, 0, dtype=torch.int32) - 1
        partial = torch.zeros(n // (self.chunk + 1) + 1, ft.dim, device=keys.device,
                              dtype=torch.float32)
        return (keys, self.bag_of_id.index_select(0, order), run_of, run_start, num_runs, slot,
                partial)

    def update(self, grad, keys, bag_sorted, run_of, run_start, num_runs, slot, partial,
               lr: float = 0.01, eps: float = 1e-8):
        ft, n = self.ft, self.ft.ids.numel()
        _long_window_sum[(triton.cdiv(n, self.chunk),)](
            grad, bag_sorted, run_of, run_start, slot, partial, n, self.chunk, D=ft.dim,
            BLOCK_D=self.block_d, BLOCK_P=self.chunk)
        _run_adagrad[(triton.cdiv(n, self.block_b),)](
            ft.weight, ft.state, grad, keys, bag_sorted, run_start, slot, partial, num_runs,
            self.chunk, lr, eps, D=ft.dim, BLOCK_D=self.block_d, BLOCK_R=self.block_b,
            num_stages=1)
