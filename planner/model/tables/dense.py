"""The dense part of a DLRM step (bottom MLP, interaction, top MLP): the ops an eager trainer
runs and their time on a device.

A GPU step's dense part is not one roofline op per MLP: at a few thousand samples per GPU the
eager elementwise ops around the GEMMs (bias, ReLU, DCNv2's products and sums, the
concatenation) move as many bytes as the GEMMs do FLOPs, and at a few hundred samples every op
is shorter than the host's time to issue it. :func:`dense_pass_times` therefore times the ops
of :func:`dense_op_list` one by one on the device's measured GEMM and memory curves
(``traces/efficiency/``), each no faster than the host's dispatch of one eager aten op
(:mod:`planner.model.llm.host`; ``host=None`` models CUDA graphs or a compiled trainer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from simulator.compute import ComputeProfile, op_time

from planner.model.llm.host import HostOverhead

__all__ = ["dense_op_list", "weighted_sum_loss_ops", "dense_pass_times", "DenseOp", "DenseTimes",
           "optimizer_bytes_per_param", "fresh_alloc_s", "ACTIVATION_BYTES", "INDEX_PUT_BYTES"]

#: bytes per activation element the dense part moves, by its compute dtype
ACTIVATION_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0}

#: HBM byte-equivalents per index of eager PyTorch's ``index_put_`` with accumulation (the
#: backward of the dot interaction's pair gather): it sorts the int64 indices, then sums the
#: values of each target in order. ``(per index, per value byte)``, least squares over 18 rows
#: measured on an H200 (``traces/measured/h200/dlrm-nosync/interaction.csv``, ``tril_bwd``:
#: 16–40 features, 8,192 and 32,768 samples, bf16 / fp16 / fp32 values; within 20% at 32,768
#: samples, 30% at 8,192):
#: 0.20 ns per index in bf16 at 4.8 TB/s. Transferred to other GPUs by their HBM bandwidth.
INDEX_PUT_BYTES = (629.0, 74.0)

#: fp32 bytes read and written per dense parameter by one optimizer step (weights, gradient,
#: state): SGD reads w, g and writes w; Adagrad adds its accumulator (read, write); Adam two.
_OPTIMIZER_BYTES = {"sgd": 12.0, "adagrad": 20.0, "rowwise_adagrad": 20.0, "adam": 28.0}


def optimizer_bytes_per_param(optimizer: str) -> float:
    """Bytes one dense optimizer step moves per fp32 parameter (fused multi-tensor update)."""
    return _OPTIMIZER_BYTES.get(optimizer, 12.0)


@dataclass(frozen=True)
class DenseTimes:
    """Seconds of the dense part on one rank: ``passes[(block, phase)]`` with block ``bottom``
    or ``top`` and phase ``fwd`` or ``bwd``; ``optimizer_s`` one optimizer step over the dense
    parameters; ``host_bound_ops``: ops whose host dispatch outlasts their kernel."""

    passes: dict
    optimizer_s: float
    host_bound_ops: int
    ops: int


def fresh_alloc_s(nbytes: float, fresh: tuple[float, float] | None) -> float:
    """Seconds a CPU spends giving a new tensor of ``nbytes`` its pages: ``fresh`` is
    ``(threshold bytes, bytes per second)`` as :mod:`planner.measure.validate.calibrate`
    measures it (glibc returns allocations above its mmap threshold to the kernel when freed,
    so each new one page-faults all its pages); 0 below the threshold or without ``fresh``."""
    if fresh is None or nbytes < fresh[0]:
        return 0.0
    return nbytes / fresh[1]


def dense_pass_times(d, dims: Sequence[int], batch: float, *, optimizer: str,
                     profile: ComputeProfile, host: HostOverhead | None,
                     fresh: tuple[float, float] | None = None,
                     elementwise_bytes: float | None = None, fused: bool = False,
                     gemm_interaction: bool = False,
                     sorted_index_put: bool = False,
                     a2a_copy_bytes: float = 0.0) -> DenseTimes:
    """Time the dense part ``d`` (a :class:`~planner.model.tables.spec.DenseSpec` or None) on
    one rank of ``batch`` samples, op by op (see the module docstring): each op
    ``max(kernel, host dispatch)`` with the kernel from ``profile``'s curves at the dense
    dtype's element size (``elementwise_bytes`` for the ops without FLOPs when given: 4 under
    autocast); ``host=None``: no host floor (CUDA graphs, compiled); ``fused``: the fused
    trainer's ops (``gemm_interaction``: a compiled one's, whose dot interaction keeps its
    batched GEMMs); ``sorted_index_put``: a GPU's sort-based gather backward;
    ``a2a_copy_bytes``: bytes per sample of the pooled all-to-all's pieces that are copied
    into one tensor forward and out of the gradient backward (:func:`dense_op_list`)."""
    if d is None:
        return DenseTimes({}, 0.0, 0, 0)
    ops = dense_op_list(d, dims, batch, elem_bytes=ACTIVATION_BYTES.get(d.dtype, 4.0),
                        elementwise_bytes=elementwise_bytes, fused=fused,
                        gemm_interaction=gemm_interaction, sorted_index_put=sorted_index_put,
                        a2a_copy_bytes=a2a_copy_bytes)
    passes: dict = {}
    bound = 0
    for op in ops:
        kernel = op_time(profile, flops=op.flops, bytes_moved=op.bytes, dtype=d.dtype,
                         aligned=op.aligned) + fresh_alloc_s(op.out_bytes, fresh)
        floor = 0.0 if host is None else (host.forward_op_s if op.phase == "fwd"
                                          else host.backward_op_s)
        bound += floor > kernel
        key = (op.block, op.phase)
        passes[key] = passes.get(key, 0.0) + max(kernel, floor)
    params = d.param_count(dims)
    opt = op_time(profile, flops=0.0,
                  bytes_moved=params * optimizer_bytes_per_param(optimizer))
    if host is not None:
        opt = max(opt, host.backward_op_s)
    return DenseTimes(passes, opt, int(bound), len(ops))


class DenseOp(NamedTuple):
    """One eager op of the dense part: ``block`` (``bottom`` or ``top``), ``phase`` (``fwd``
    or ``bwd``), its FLOPs, the bytes it reads and writes, and the bytes of the new tensor it
    allocates for its output (0 when it writes a view or in place); a linear layer's GEMM also
    names itself as ``gemm`` = ``(pass, batch, in, out)`` (pass ``fwd``, ``dx`` or ``dw``;
    :mod:`simulator.linear_table`), so that a profile that timed such GEMMs by shape can
    price it. ``aligned`` is False for a GEMM whose rows are not a multiple of 16 bytes (a
    479-wide layer, the dot interaction's 27 × 27 products), which the profile may slow."""

    block: str
    phase: str
    flops: float
    bytes: float
    out_bytes: float
    gemm: tuple | None = None
    aligned: bool = True


def weighted_sum_loss_ops(dims: Sequence[int], batch: float) -> list[DenseOp]:
    """The loss the validation model runs when a spec has no dense part
    (:mod:`planner.measure.validate.dlrm_worker`: ``Σ_tables (pooled · c).sum()``), fp32 on
    ``batch`` samples per rank, one table at a time: forward a product into a new tensor and its
    sum, backward the product's gradient (``c`` times the upstream scalar) into a new tensor.
    Memory-bound: in a profiled step of 24 tables × 3,744 samples (1,744 columns) the 48 products
    took 10.4 ms of a 144 ms step."""
    out = []
    for d in dims:
        e = 4.0 * float(batch) * d
        out.append(DenseOp("top", "fwd", 0.0, 3 * e, e))                  # pooled · c
        out.append(DenseOp("top", "fwd", 0.0, e, 0.0))                    # .sum()
        out.append(DenseOp("top", "bwd", 0.0, 2 * e, e))                  # grad · c
    return out


def dense_op_list(dense, dims: Sequence[int], batch: float, *, elem_bytes: float = 4.0,
                  elementwise_bytes: float | None = None, fused: bool = False,
                  gemm_interaction: bool = False,
                  sorted_index_put: bool = False,
                  a2a_copy_bytes: float = 0.0) -> list[DenseOp]:
    """The dense part's ops on ``batch`` samples per rank (:class:`DenseOp`): every GEMM with its
    real shape, and the elementwise ops around them, bytes read and written at ``elem_bytes``
    per element (4: fp32, as the CPU validation model runs; 2 for bf16/fp16 activations on a
    GPU). ``elementwise_bytes`` (default ``elem_bytes``) sizes the ops without FLOPs apart: 4
    under autocast, where only GEMMs run in half precision; then autocast's casts are ops too
    (each weight and bias, and each fp32 input of a GEMM, copied to the GEMM dtype forward and
    its gradient copied back). Empty without a dense part.

    ``fused=False``: the ops as the validation model
    (:mod:`planner.measure.validate.dlrm_worker`) runs them eagerly: bias, ReLU and their
    backward, DCNv2's products and sums, the concatenation, the loss, one kernel each.
    ``fused=True``: the same GEMMs, with bias, ReLU, ReLU's gradient and the bias gradient in
    their epilogues, DCNv2's ``x0 ⊙ v + x`` one kernel forward and its three gradients one
    backward, the dot interaction one kernel each way, and no cast ops (they fold into the
    kernels that produce their inputs); with ``gemm_interaction`` (TorchInductor) the dot
    interaction's products stay batched GEMMs around one gather kernel each way.
    ``sorted_index_put``: the dot interaction's gather backward as PyTorch runs it on a GPU, a
    sort of its indices (:data:`INDEX_PUT_BYTES`); else one pass over the pairs (as priced on
    the CPU, where it was never measured apart).
    ``a2a_copy_bytes`` (bytes per sample, the trainer's ``output_dist: per_peer``): the pooled
    all-to-all's received pieces concatenated into the interaction's input forward, and the
    gradient's per-peer slices copied contiguous before the backward all-to-all, one copy each
    way (read and write)."""
    if dense is None:
        return []
    B = float(batch)
    e_gemm = float(elem_bytes)
    e_ew = float(elementwise_bytes if elementwise_bytes is not None else elem_bytes)
    out: list[DenseOp] = []
    ls = dense.layers(dims)

    def op(block, phase, flops, elems, new, gemm=None, rows=(), raw=None):
        """One op of ``elems`` elements read and written (``raw`` bytes instead when given);
        ``rows``: the widths of a GEMM's operand rows, for its alignment (a width of 1 is a
        matrix-vector product, which no tensor-core kernel runs either way)."""
        e = e_gemm if flops else e_ew
        aligned = all(w == 1 or w * e % 16 == 0 for w in rows)
        out.append(DenseOp(block, phase, float(flops), e * elems if raw is None else raw,
                           e * new, gemm, aligned))

    def casts(block, *elems, grad=True):
        """Autocast's copies into the GEMM dtype before a GEMM (weights, bias, an fp32 input)
        and their backward copies of the gradients back to fp32; none when nothing is mixed
        or when they are fused."""
        if e_ew == e_gemm or fused:
            return
        for n in elems:
            out.append(DenseOp(block, "fwd", 0.0, n * (e_ew + e_gemm), n * e_gemm))
            if grad:
                out.append(DenseOp(block, "bwd", 0.0, n * (e_ew + e_gemm), n * e_ew))

    def mlp(block, layers, first_needs_grad):
        for k, (i, o) in enumerate(layers):
            last = k == len(layers) - 1
            casts(block, i * o, o)
            if k == 0:
                casts(block, B * i, grad=first_needs_grad)
            op(block, "fwd", 2 * B * i * o, B * i + i * o + 2 * B * o, B * o, ("fwd", B, i, o),
               (i, o))
            if not last and not fused:
                op(block, "fwd", 0.0, 2 * B * o, B * o)                             # relu
                op(block, "bwd", 0.0, 3 * B * o, B * o)                             # relu bwd
            op(block, "bwd", 2 * B * i * o, B * o + B * i + i * o, i * o, ("dw", B, i, o),
               (i, o))
            if not fused:
                op(block, "bwd", 0.0, B * o + o, o)                                 # db
            if k > 0 or first_needs_grad:
                op(block, "bwd", 2 * B * i * o, B * o + i * o + B * i, B * i, ("dx", B, i, o),
                   (i, o))
    mlp("bottom", ls["bottom"], False)
    if a2a_copy_bytes > 0:
        x = B * float(a2a_copy_bytes)
        out.append(DenseOp("top", "fwd", 0.0, 2 * x, x))                            # cat pieces
        out.append(DenseOp("top", "bwd", 0.0, 2 * x, x))                            # contiguous
    top_in = ls["top"][0][0]
    if dense.interaction == "dot":
        mode = ("gemm" if gemm_interaction else "kernel") if fused else "eager"
        _dot_interaction(op, B, len(dims) + 1, ls["interaction"][0][0], top_in, mode,
                         e_ew if sorted_index_put else None)
    else:
        x = B * top_in
        op("top", "fwd", 0.0, 2 * x, x)                                             # cat
        op("top", "bwd", 0.0, 2 * x, 0.0)                                           # cat bwd
        for _ in range(dense.dcn_layers):
            casts("top", top_in * dense.dcn_projection, top_in * dense.dcn_projection, top_in, x)
            _cross_layer(op, B, top_in, dense.dcn_projection, fused)
    mlp("top", ls["top"], True)
    op("top", "fwd", 0.0, 3 * B, B)                                                 # loss
    op("top", "bwd", 0.0, 3 * B, B)
    return out


def _dot_interaction(op, B: float, f: int, d: int, top_in: int, mode: str,
                     value_bytes: float | None) -> None:
    """The dot interaction of ``f`` features of width ``d`` into ``top_in`` columns (the pairs
    below the diagonal and the bottom MLP's output). ``mode`` ``eager``: a stack, a batched
    GEMM, a gather and a concatenation forward and their gradients, the gather's as PyTorch
    runs it on a GPU (a sort of the ``B·f(f−1)/2`` indices, :data:`INDEX_PUT_BYTES`, given
    ``value_bytes``; else one pass over the pairs); ``kernel``: one hand-written kernel each way
    that reads the features and writes the output (forward) or reads both and writes the
    features' gradients (backward); ``gemm`` (TorchInductor): the stack, the three batched GEMMs,
    the gather and concatenation as one kernel forward, the gradient's scatter as one and the
    two products' sum as one backward. The batched GEMMs' rows are ``f`` and ``d`` wide."""
    if mode == "kernel":
        op("top", "fwd", 2 * B * f * f * d, B * f * d + B * top_in, B * top_in)
        op("top", "bwd", 4 * B * f * f * d, B * top_in + 2 * B * f * d, B * f * d)
        return
    bmm = (2 * B * f * f * d, 2 * B * f * d + B * f * f)
    if mode == "gemm":
        op("top", "fwd", 0.0, 2 * B * f * d, B * f * d)                             # stack
        op("top", "fwd", bmm[0], bmm[1], B * f * f, rows=(f, d))                    # bmm
        op("top", "fwd", 0.0, B * f * f + B * d + B * top_in, B * top_in)           # gather, cat
        op("top", "bwd", 0.0, B * top_in + B * f * f, B * f * f)                    # scatter
        for _ in range(2):
            op("top", "bwd", bmm[0], bmm[1], B * f * d, rows=(f, d))                # bmm
        op("top", "bwd", 0.0, 3 * B * f * d, B * f * d)                             # sum grads
        return
    pairs = B * f * (f - 1) / 2
    op("top", "fwd", 0.0, 2 * B * f * d, B * f * d)                                 # stack
    op("top", "fwd", bmm[0], bmm[1], B * f * f, rows=(f, d))                        # bmm
    op("top", "fwd", 0.0, 2 * B * f * f, B * f * f / 2)                             # tril gather
    op("top", "fwd", 0.0, 2 * B * top_in, B * top_in)                               # cat
    op("top", "bwd", 0.0, 2 * B * top_in, 0.0)                                      # cat bwd
    if value_bytes is None:
        op("top", "bwd", 0.0, 3 * B * f * f, B * f * f)                             # scatter
    else:
        op("top", "bwd", 0.0, B * f * f, B * f * f)                                 # zeros
        op("top", "bwd", 0.0, 0.0, 0.0,                                             # index_put_
           raw=pairs * (INDEX_PUT_BYTES[0] + INDEX_PUT_BYTES[1] * value_bytes))
    for _ in range(2):
        op("top", "bwd", bmm[0], bmm[1], B * f * d, rows=(f, d))                    # bmm
    op("top", "bwd", 0.0, 3 * B * f * d, B * f * d)                                 # sum grads
    op("top", "bwd", 0.0, 2 * B * f * d, 0.0)                                       # unstack


def _cross_layer(op, B: float, w: int, p: int, fused: bool) -> None:
    """One low-rank DCNv2 cross layer on ``w``-wide rows, projection ``p``:
    ``x' = x0 ⊙ (V(U x) + b) + x``. Its four GEMMs forward and backward either way; eager, the
    bias, the product and the sum forward and the four products and the bias gradient backward
    are kernels of their own; fused, the bias rides the second GEMM, ``x0 ⊙ v + x`` is one
    kernel (reads three rows, writes one) and backward one kernel reads the output gradient,
    ``x0``, ``v`` and the running ``x0`` gradient and writes ``v``'s gradient (with the bias
    gradient) and the ``x0`` gradient."""
    x = B * w
    op("top", "fwd", 2 * x * p, x + w * p + B * p, B * p, ("fwd", B, w, p))         # u
    op("top", "fwd", 2 * x * p, B * p + w * p + x, x, ("fwd", B, p, w))             # v
    if fused:
        op("top", "fwd", 0.0, 4 * x, x)
    else:
        op("top", "fwd", 0.0, 2 * x, x)
        op("top", "fwd", 0.0, 3 * x, x)
        op("top", "fwd", 0.0, 3 * x, x)
    for new, gemm in ((w * p, ("dw", B, p, w)), (B * p, ("dx", B, p, w)),           # v grads
                      (w * p, ("dw", B, w, p)), (x, ("dx", B, w, p))):              # u grads
        op("top", "bwd", 2 * x * p, x + B * p + w * p, new, gemm)
    if fused:
        op("top", "bwd", 0.0, 6 * x + w, x)
        return
    for _ in range(4):
        op("top", "bwd", 0.0, 3 * x, x)                                             # products
    op("top", "bwd", 0.0, x + w, w)                                                 # db
