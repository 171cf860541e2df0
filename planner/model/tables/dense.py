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
from typing import Sequence

from simulator.compute import ComputeProfile, op_time

from planner.model.llm.host import HostOverhead

__all__ = ["dense_op_list", "dense_pass_times", "DenseTimes", "optimizer_bytes_per_param",
           "ACTIVATION_BYTES"]

#: bytes per activation element the dense part moves, by its compute dtype
ACTIVATION_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0}

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


def dense_pass_times(d, dims: Sequence[int], batch: float, *, optimizer: str,
                     profile: ComputeProfile, host: HostOverhead | None) -> DenseTimes:
    """Time the dense part ``d`` (a :class:`~planner.model.tables.spec.DenseSpec` or None) on
    one rank of ``batch`` samples, op by op (see the module docstring): each op
    ``max(kernel, host dispatch)`` with the kernel from ``profile``'s curves at the dense
    dtype's element size; ``host=None``: no host floor (CUDA graphs, compiled)."""
    if d is None:
        return DenseTimes({}, 0.0, 0, 0)
    ops = dense_op_list(d, dims, batch, elem_bytes=ACTIVATION_BYTES.get(d.dtype, 4.0))
    passes: dict = {}
    bound = 0
    for block, phase, flops, nbytes in ops:
        kernel = op_time(profile, flops=flops, bytes_moved=nbytes, dtype=d.dtype)
        floor = 0.0 if host is None else (host.forward_op_s if phase == "fwd"
                                          else host.backward_op_s)
        bound += floor > kernel
        passes[(block, phase)] = passes.get((block, phase), 0.0) + max(kernel, floor)
    params = d.param_count(dims)
    opt = op_time(profile, flops=0.0,
                  bytes_moved=params * optimizer_bytes_per_param(optimizer))
    if host is not None:
        opt = max(opt, host.backward_op_s)
    return DenseTimes(passes, opt, int(bound), len(ops))


def dense_op_list(dense, dims: Sequence[int], batch: float, *, elem_bytes: float = 4.0
                  ) -> list[tuple[str, str, float, float]]:
    """The dense part's ops as the validation model (:mod:`planner.measure.validate.dlrm_worker`)
    runs them eagerly on ``batch`` samples per rank: ``(block, phase, flops, bytes)`` with
    ``block`` ``bottom`` or ``top`` (interaction and top MLP), ``phase`` ``fwd`` or ``bwd``:
    every GEMM with its real shape, and the elementwise ops around them (bias, ReLU and their
    backward, DCNv2's products and sums, the concatenation, the loss), fp32 bytes read and
    written at ``elem_bytes`` per element (4: fp32, as the CPU validation model runs; 2 for
    bf16/fp16 activations on a GPU). Empty without a dense part."""
    if dense is None:
        return []
    B, f4 = float(batch), float(elem_bytes)
    out: list[tuple[str, str, float, float]] = []
    ls = dense.layers(dims)

    def mlp(block, layers, first_needs_grad):
        for k, (i, o) in enumerate(layers):
            last = k == len(layers) - 1
            out.append((block, "fwd", 2 * B * i * o, f4 * (B * i + i * o + 2 * B * o)))
            if not last:
                out.append((block, "fwd", 0.0, f4 * 2 * B * o))                    # relu
                out.append((block, "bwd", 0.0, f4 * 3 * B * o))                    # relu bwd
            out.append((block, "bwd", 2 * B * i * o, f4 * (B * o + B * i + i * o)))   # dW
            out.append((block, "bwd", 0.0, f4 * (B * o + o)))                      # db
            if k > 0 or first_needs_grad:
                out.append((block, "bwd", 2 * B * i * o, f4 * (B * o + i * o + B * i)))  # dX
    mlp("bottom", ls["bottom"], False)
    f = len(dims) + 1
    if dense.interaction == "dot":
        d = ls["interaction"][0][0]
        top_in = ls["top"][0][0]
        out.append(("top", "fwd", 0.0, f4 * 2 * B * f * d))                        # stack
        out.append(("top", "fwd", 2 * B * f * f * d, f4 * (2 * B * f * d + B * f * f)))  # bmm
        out.append(("top", "fwd", 0.0, f4 * 2 * B * f * f))                        # triu gather
        out.append(("top", "fwd", 0.0, f4 * 2 * B * top_in))                       # cat
        out.append(("top", "bwd", 0.0, f4 * 2 * B * top_in))                       # cat bwd
        out.append(("top", "bwd", 0.0, f4 * 3 * B * f * f))                        # scatter
        out += [("top", "bwd", 2 * B * f * f * d, f4 * (2 * B * f * d + B * f * f))] * 2
        out.append(("top", "bwd", 0.0, f4 * 3 * B * f * d))                        # sum grads
        out.append(("top", "bwd", 0.0, f4 * 2 * B * f * d))                        # unstack
    else:
        top_in = ls["top"][0][0]
        p = dense.dcn_projection
        x = B * top_in
        out.append(("top", "fwd", 0.0, f4 * 2 * x))                                # cat
        out.append(("top", "bwd", 0.0, f4 * 2 * x))                                # cat bwd
        for _ in range(dense.dcn_layers):
            out.append(("top", "fwd", 2 * x * p, f4 * (x + top_in * p + B * p)))       # u
            out.append(("top", "fwd", 2 * x * p, f4 * (B * p + top_in * p + x)))       # v
            out += [("top", "fwd", 0.0, f4 * 2 * x)] + [("top", "fwd", 0.0, f4 * 3 * x)] * 2
            out += [("top", "bwd", 2 * x * p, f4 * (x + B * p + top_in * p))] * 4      # u, v
            out += [("top", "bwd", 0.0, f4 * 3 * x)] * 4                           # products
            out.append(("top", "bwd", 0.0, f4 * (x + top_in)))                     # db
    mlp("top", ls["top"], True)
    out.append(("top", "fwd", 0.0, f4 * 3 * B))                                    # loss
    out.append(("top", "bwd", 0.0, f4 * 3 * B))
    return out
