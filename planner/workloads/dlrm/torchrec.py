"""The DLRM step of a sharding plan as TorchRec 1.8.0 runs it on CPU ranks (gloo).

:func:`build_torchrec_step_workload` places the collectives TorchRec issues
(:mod:`planner.workloads.dlrm.torchrec_comms`, one concrete batch) between the step's compute:
the lookups forward and backward from the cost model, the dense part op by op (a measured CPU's
linear-layer table where it has the shape, else the profile's curves and the new outputs' page
faults), and the pooled embeddings' reorders around the all-to-alls (:func:`pooled_moves`:
column-wise slices back into column order, :func:`cw_reorders`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from simulator.compute import op_time
from simulator.linear_table import LinearTable
from simulator.workload import Workload

from planner.model.tables.features import F_BWD, F_FWD
from planner.model.tables.dense import dense_op_list, fresh_alloc_s, weighted_sum_loss_ops
from planner.model.tables.shards import ShardingType, TableSharding
from planner.workloads.dlrm.dense import mlp_flops
from planner.workloads.dlrm.torchrec_comms import FLOAT_BYTES, CommOp

__all__ = ["build_torchrec_step_workload", "pooled_moves", "cw_reorders"]

#: forward and backward ``(s, s per byte, s per sample-slice)`` of TorchRec's column-wise reorder
Reorder = tuple[tuple[float, float, float], tuple[float, float, float]]


def _dense_op_time(op, compute, dtype: str, linear: LinearTable | None, fresh,
                   working_set: float | None) -> float:
    """Seconds of one dense op on a measured CPU: a linear layer's GEMM from ``linear`` where
    it has a rate for the shape (allocation included), else the profile's curves plus the new
    output's page faults."""
    if linear is not None and op.gemm is not None and dtype == "fp32":
        t = linear.seconds(*op.gemm)
        if t is not None:
            return t
    return op_time(compute, flops=op.flops, bytes_moved=op.bytes, dtype=dtype,
                   working_set=working_set) + fresh_alloc_s(op.out_bytes, fresh)


def _dense_durations(problem, compute, dtype: str, dense_op_s: float,
                     linear: LinearTable | None, fresh) -> dict[tuple[str, str], float]:
    """Seconds per (block, phase) of the dense part op by op on the measured CPU ``compute``
    (see :func:`build_torchrec_step_workload`)."""
    cm, d = problem.cost, problem.model.dense
    dims = [t.embedding_dim for t in problem.model.tables]
    dense_ops = (dense_op_list(d, dims, cm.local_batch) if d is not None
                 else weighted_sum_loss_ops(dims, cm.local_batch))
    # the loss walks the pooled embeddings feature by feature: each slice comes from DRAM
    walked: dict[str, float] = {}
    for op in dense_ops if d is None else ():
        walked[op.phase] = walked.get(op.phase, 0.0) + op.bytes
    dur: dict[tuple[str, str], float] = {}
    for op in dense_ops:
        dur[(op.block, op.phase)] = (dur.get((op.block, op.phase), 0.0) + dense_op_s
                                     + _dense_op_time(op, compute, dtype, linear, fresh,
                                                      walked.get(op.phase)))
    return dur


def _add_collective(w: Workload, op: CommOp, deps) -> int:
    """``op`` as a collective of ``w`` after ``deps``: an all-to-all with its byte matrix
    (the bytes each rank keeps left out), the others by size; their categories and streams."""
    if op.kind == "alltoall":
        m = op.matrix.astype(float) * (1.0 - np.eye(len(op.group)))
        return w.collective("alltoall", op.group, float(m.sum(axis=1).max()), name=op.name,
                            splits=m, deps=deps, stream="comm", category="a2a")
    cat = "dense_allreduce" if op.name.startswith("dense") else (
        "dp_allreduce" if op.kind == "allreduce" else "rw_comm")
    return w.collective(op.kind, op.group, float(op.size), name=op.name, deps=deps,
                        stream="comm:dp" if op.kind == "allreduce" else "comm", category=cat)


def build_torchrec_step_workload(problem, shardings: Sequence[TableSharding], ops: Sequence[CommOp],
                                 *, compute=None, host_s: Sequence[float] | None = None,
                                 dense_op_s: float = 0.0,
                                 fresh: tuple[float, float] | None = None,
                                 reorder: Reorder | None = None,
                                 linear: LinearTable | None = None) -> Workload:
    """The step's :class:`Workload` with ``ops`` as its collectives and the compute of
    :func:`planner.workloads.dlrm.step.build_step_workload` (lookups, MLPs) between them.

    With ``compute`` (a measured :class:`simulator.compute.ComputeProfile`) the dense part is
    timed op by op (:func:`dense_op_list`: each GEMM at its own size on the matmul curve, the
    elementwise ops on the memory curve, each op's dispatch, plus ``dense_op_s`` of eager host
    time per op; without a dense part, the validation model's loss,
    :func:`~planner.model.tables.dense.weighted_sum_loss_ops`); ``host_s`` (seconds per
    rank): TorchRec's host work per step, run before the input dist
    (:mod:`planner.measure.validate.calibrate_dlrm`); ``fresh`` (threshold bytes,
    bytes per second): what a new tensor above glibc's mmap threshold costs in page faults on a
    CPU (:func:`~planner.model.tables.dense.fresh_alloc_s`), charged to every op that allocates
    one, and, with ``compute``, the copies TorchRec makes of the pooled embeddings
    (:func:`pooled_moves`; ``reorder``: its permute of column-wise slices); ``linear``: the
    profile's linear-layer GEMMs timed by shape, which price the dense part's GEMMs in place of
    the matmul curve where they cover them (their times hold the new output's allocation)."""
    cm = problem.cost
    F = cm.plan_features(shardings)
    d = problem.model.dense
    dtype = d.dtype if d is not None else "fp32"
    fl = mlp_flops(problem)
    ranks = list(range(problem.devices))
    w = Workload(name=f"dlrm-torchrec-step:{problem.model.name}")
    hbm = cm.hbm_Bps
    fixed_fwd, fixed_bwd = cm.call_s(F)          # each rank's fused lookup calls
    dur = _dense_durations(problem, compute, dtype, dense_op_s, linear, fresh) \
        if compute is not None else {}
    moves = pooled_moves(problem, shardings, compute, fresh, reorder)

    def mlp_op(r, name, block, phase, flops, deps=None):
        cat = "mlp_fwd" if phase == "fwd" else "mlp_bwd"
        if dur:
            return w.compute(r, name, duration_s=dur.get((block, phase), 0.0), deps=deps,
                             category=cat)
        return w.compute(r, name, flops=flops, dtype=dtype, deps=deps, category=cat)
    host = None
    if host_s is not None and any(h > 0 for h in host_s):
        host = [w.compute(r, "torchrec_host", duration_s=float(host_s[r]), category="host")
                for r in ranks]

    fwd_ops = [op for op in ops if op.phase == "fwd"]
    bwd_ops = [op for op in ops if op.phase == "bwd"]
    ids_ops = [op for op in fwd_ops if "pooled" not in op.name]
    out_ops = [op for op in fwd_ops if "pooled" in op.name]
    last: int | None = None
    ids_done = []
    for op in ids_ops:
        last = _add_collective(w, op, [last] if last is not None else host)
        ids_done.append(last)
    bottom = [mlp_op(r, "bottom_mlp_fwd", "bottom", "fwd", fl["bottom"])
              if fl["bottom"] else None for r in ranks]
    fwd = [w.compute(r, "lookups_fwd",
                     duration_s=float(F[r, F_FWD] + fixed_fwd[r] + moves[r][0]),
                     bytes_moved=float(F[r, F_FWD] * hbm), deps=ids_done[-1:] or None,
                     category="emb_fwd") for r in ranks]
    outs = []
    for op in out_ops:
        outs.append(_add_collective(w, op, [fwd[r] for r in op.group] + outs[-1:]))
    recat = [w.compute(r, "pooled_recat", duration_s=moves[r][1], deps=[fwd[r]] + outs,
                       category="emb_fwd") for r in ranks]
    top_fwd = [mlp_op(r, "interaction_top_mlp_fwd", "top", "fwd", fl["top"],
                      deps=[recat[r]] + [x for x in (bottom[r],) if x is not None])
               for r in ranks]
    top_bwd = [mlp_op(r, "top_mlp_interaction_bwd", "top", "bwd", 2 * fl["top"],
                      deps=[top_fwd[r]]) for r in ranks]
    top_bwd = [w.compute(r, "grad_cat", duration_s=moves[r][2], deps=[top_bwd[r]],
                         category="emb_bwd") for r in ranks]
    bottom_bwd = [mlp_op(r, "bottom_mlp_bwd", "bottom", "bwd", 2 * fl["bottom"],
                         deps=[top_bwd[r]]) if fl["bottom"] else top_bwd[r] for r in ranks]
    grads, dense_ar = [], []
    for op in bwd_ops:
        if op.name.startswith("dense"):
            dense_ar.append(_add_collective(w, op, bottom_bwd + dense_ar[-1:]))
        elif not op.name.startswith("data-parallel"):
            grads.append(_add_collective(w, op, [top_bwd[r] for r in op.group] + grads[-1:]))
    # measured profile: the autograd engine's order (the bottom MLP's nodes are newer than the
    # lookups', and the DDP hook's all-reduce blocks the backward thread), not any ready order
    after = dense_ar[-1:] if compute is not None else []
    bwd = [w.compute(r, "lookups_bwd",
                     duration_s=float(F[r, F_BWD] + fixed_bwd[r] + moves[r][3]),
                     bytes_moved=float(F[r, F_BWD] * hbm), deps=[bottom_bwd[r]] + grads + after,
                     category="emb_bwd") for r in ranks]
    dp_ar: list[int] = []
    for op in bwd_ops:
        if op.name.startswith("data-parallel"):
            dp_ar.append(_add_collective(w, op, bwd + dp_ar[-1:]))
    return w


def cw_reorders(shardings: Sequence[TableSharding], n: int) -> list[tuple[int, int]]:
    """``(slices, columns)`` of the column-wise group when its pooled embeddings TorchRec must
    reorder after the output all-to-all (``PermutePooledEmbeddingsSplit``, forward and, on the
    gradient, backward): the all-to-all returns every rank's slices rank by rank, TorchRec
    wants each table's slices together in column order, and skips the reorder only when the
    two orders agree (one table split over the ranks, say)."""
    group = [ts for ts in shardings if ts.sharding_type == ShardingType.COLUMN_WISE]
    arrived = [(ts.table, s.col_offset, s.cols) for r in range(n) for ts in group
               for s in ts.shards if s.rank == r]
    first = {t: i for i, (t, _, _) in reversed(list(enumerate(arrived)))}
    order = sorted(range(len(arrived)), key=lambda i: (first[arrived[i][0]], arrived[i][1]))
    if order == list(range(len(arrived))):
        return []
    return [(len(arrived), sum(c for _, _, c in arrived))]


def _reorder_s(coef: tuple[float, float, float], samples: float, slices: int, cols: int
               ) -> float:
    a, per_byte, per_block = coef
    return a + per_byte * FLOAT_BYTES * samples * cols + per_block * samples * slices


def pooled_moves(problem, shardings: Sequence[TableSharding], compute,
                 fresh: tuple[float, float] | None, reorder: Reorder | None = None
                 ) -> list[tuple[float, float, float, float]]:
    """Per rank, seconds of the memory traffic around the pooled embeddings that no kernel
    curve holds, as TorchRec 1.8's pooled all-to-all (``All2All_Pooled_Req`` / ``_Wait``) and
    a model reading its output per feature (``KeyedTensor.to_dict``) run it:
    ``(lookup output, forward recat, backward cat, gradient receive)``.

    - forward: the fused lookup's output (global batch × the rank's pooled columns) is a new
      tensor, copied whole into the all-to-all's registered send buffer (table- and
      column-wise columns); the receive buffer is reordered into a new local batch × every
      table's columns (the recat);
    - backward: the per-feature gradients are concatenated into one local batch × columns
      tensor (the backward of ``to_dict``'s split), split by source rank with each part made
      contiguous, and concatenated again (``_recat_pooled_embedding_grad_out``); the gradient
      received for the lookup output is a new tensor, divided in place by the world size.

    Each copy reads and writes its bytes on ``compute``'s memory curve, plus the page faults of
    a new tensor above glibc's threshold (``fresh``). With ``reorder`` (forward and backward
    ``(s, s per byte, s per block)`` of FBGEMM's permute on this host,
    :mod:`planner.measure.validate.dlrm_permute`, timed as a step runs it, page faults
    included) the reorder of column-wise slices (:func:`cw_reorders`) is added to the forward
    recat and the backward cat. Zeros without ``compute``."""
    n = problem.devices
    if compute is None:
        return [(0.0, 0.0, 0.0, 0.0)] * n
    extra_f = extra_b = 0.0
    if reorder is not None:
        b = problem.cost.local_batch
        for slices, cols in cw_reorders(shardings, n):
            extra_f += _reorder_s(reorder[0], b, slices, cols)
            extra_b += _reorder_s(reorder[1], b, slices, cols)
    B, b = float(problem.model.batch_size), problem.cost.local_batch
    cols, sent = [0.0] * n, [0.0] * n
    for ts in shardings:
        if ts.sharding_type != ShardingType.DATA_PARALLEL:
            for sh in ts.shards:
                cols[sh.rank] += sh.cols
                if ts.sharding_type in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
                    sent[sh.rank] += sh.cols
    dims = float(sum(t.embedding_dim for t in problem.model.tables))
    local = FLOAT_BYTES * b * dims

    def copy(nbytes: float) -> float:
        return op_time(compute, flops=0.0, bytes_moved=2 * nbytes) + fresh_alloc_s(nbytes, fresh)

    def in_place(nbytes: float) -> float:
        return op_time(compute, flops=0.0, bytes_moved=2 * nbytes)
    out = []
    for c, s in zip(cols, sent):
        mine, send = FLOAT_BYTES * B * c, FLOAT_BYTES * B * s
        out.append((fresh_alloc_s(mine, fresh) + (copy(send) if s else 0.0),
                    copy(local) + fresh_alloc_s(local, fresh) + extra_f,
                    3 * copy(local) + extra_b,
                    fresh_alloc_s(mine, fresh) + (in_place(send) if s else 0.0)))
    return out
