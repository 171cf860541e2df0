"""The dot interaction's own kernels on one GPU: ``interaction.csv`` of
``python -m planner.measure.tables.gpu_dlrm --only interaction``.

The dot interaction multiplies each sample's ``f`` feature vectors of width ``d`` with
themselves: a batched GEMM of ``f × d`` by ``d × f`` forward and of ``f × f`` by ``f × d`` twice
backward, tiny matrices whose sizes (``f`` = 27 for Criteo) are rarely multiples of 8 elements,
which tensor-core GEMM kernels want. It then gathers the pairs below the diagonal
(``z[:, li, lj]``), whose backward in eager PyTorch is an ``index_put_`` with accumulation.
Rows (``op``):

``bmm``
    ``torch.bmm`` of ``batch`` products ``m × k`` by ``k × n`` (``m, k, n`` columns), replayed
    from a CUDA graph, with ``flops`` and ``aligned`` (every size a multiple of 8);
``linear``
    the top MLP's first layer, ``batch × k`` by ``k × n`` forward and backward (``nn.Linear``),
    at ``k`` = 479 (Criteo's 351 pairs + 128) and 480;
``tril_bwd``
    the backward of the pair gather of ``f`` features (``m = n = f``) at ``batch`` samples:
    ``torch.autograd.grad`` through ``z[:, li, lj]``, launched eagerly.

``dtype`` is bf16, fp16 or tf32 (fp32 tensors with TF32 GEMMs); ``seconds`` the median of
``--samples`` samples.
"""

from __future__ import annotations

import time
from pathlib import Path

from planner.measure.compute.gpu_timing import CsvRows, auto_time, torch_module

__all__ = ["measure_interaction"]


def _bmm_shapes(quick: bool) -> list[tuple[int, int, int, int]]:
    """(batch, m, k, n): forward ``f × d · d × f`` and backward ``f × f · f × d`` products."""
    if quick:
        return [(16, 27, 8, 27)]
    out = []
    for batch in (8_192, 32_768):
        for f in (8, 16, 24, 26, 27, 32, 40, 48, 64):
            for d in (64, 128):
                out += [(batch, f, d, f), (batch, f, f, d)]
    return out


def measure_interaction(dev, *, quick: bool, samples: int, out: Path, deadline: float) -> int:
    """Times the rows of the module docstring; returns rows written."""
    torch = torch_module()
    rows, n = CsvRows(out / "interaction.csv"), 0
    graph = dev.type == "cuda"
    dtypes = ("tf32",) if quick else ("bf16", "tf32", "fp16")
    for dtype in dtypes:
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
        tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32}[dtype]
        for batch, m, k, nn in _bmm_shapes(quick):
            if time.monotonic() > deadline:
                break
            a = torch.randn(batch, m, k, device=dev, dtype=tdt)
            b = torch.randn(batch, k, nn, device=dev, dtype=tdt)
            t, iqr = auto_time(lambda: torch.bmm(a, b), dev, samples=samples, graph=graph)
            rows.add(dict(op="bmm", dtype=dtype, batch=batch, m=m, k=k, n=nn,
                          flops=2.0 * batch * m * k * nn,
                          aligned=int(m % 8 == k % 8 == nn % 8 == 0), seconds=t, iqr_rel=iqr))
            n += 1
        for batch in ((64,) if quick else (8_192, 32_768)):
            for k in (479, 480):
                lin = torch.nn.Linear(k, 1024, device=dev, dtype=tdt)
                x = torch.randn(batch, k, device=dev, dtype=tdt, requires_grad=True)
                g = torch.randn(batch, 1024, device=dev, dtype=tdt)
                t, iqr = auto_time(lambda: lin(x).backward(g), dev, samples=samples)
                rows.add(dict(op="linear", dtype=dtype, batch=batch, m=batch, k=k, n=1024,
                              flops=6.0 * batch * k * 1024, aligned=int(k % 8 == 0),
                              seconds=t, iqr_rel=iqr))
                n += 1
            for f in ((27,) if quick else (16, 27, 40)):
                li, lj = torch.tril_indices(f, f, offset=-1, device=dev)
                z = torch.randn(batch, f, f, device=dev, dtype=tdt, requires_grad=True)
                y = z[:, li, lj]
                gy = torch.randn_like(y)
                t, iqr = auto_time(lambda: torch.autograd.grad(y, z, gy, retain_graph=True),
                                   dev, samples=samples)
                rows.add(dict(op="tril_bwd", dtype=dtype, batch=batch, m=f, k=0, n=f,
                              flops=0.0, aligned=0, seconds=t, iqr_rel=iqr))
                n += 1
    torch.backends.cuda.matmul.allow_tf32 = False
    rows.close()
    return n
