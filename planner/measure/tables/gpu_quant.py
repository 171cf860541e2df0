"""Measure how fast a CUDA GPU compresses and decompresses pooled embeddings with quantizers: the
compute ops a compressed embedding all-to-all adds on each side of the wire.

Run on the GPU machine (needs only torch and the standard library)::

    python -m planner.measure.tables.gpu_quant --out DIR [--quick]

Codecs (each turns a ``(rows, dim)`` fp32 tensor into codes and back):

``fp16`` / ``bf16``
    A cast (2 bytes per value on the wire).
``int8_rowwise``
    Per row: min and max, scale ``(max − min)/255``, codes ``round((x − min)/scale)`` as uint8,
    plus the fp32 scale and min per row (FBGEMM's fused 8-bit row-wise form).
``uniform_eb``
    Error-bounded linear quantization (the quantization step of SZ-style compressors): codes
    ``round(x / (2·eb))`` as int16 with ``eb`` = 1e-3 (absolute); every value comes back within
    ``eb``. The entropy coding a real compressor adds after it is not timed here.

It writes ``quant.csv`` (``codec, rows, dim, bytes_in`` (fp32), ``bytes_out`` (codes and
per-row parameters), ``compress_s, decompress_s, compress_gbps, decompress_gbps`` (10⁹ fp32
bytes/s), ``max_abs_error, iqr_rel``) and ``meta.json``. Timing as
:mod:`planner.measure.compute.gpu`.
"""

from __future__ import annotations

import time

from planner.measure.compute.driver import open_driver, run_parts
from planner.measure.compute.gpu_timing import auto_time

__all__ = ["main", "CODECS"]

#: absolute error bound of ``uniform_eb``
EB = 1e-3


def _torch():
    import torch
    return torch


def _fp(dtype):
    def enc(x):
        return (x.to(dtype),)

    def dec(codes):
        return codes[0].float()
    return enc, dec


def _int8_rowwise():
    torch = _torch()

    def enc(x):
        lo, hi = x.aminmax(dim=1, keepdim=True)
        scale = ((hi - lo) / 255.0).clamp_min(1e-12)
        return torch.round((x - lo) / scale).to(torch.uint8), scale, lo

    def dec(codes):
        q, scale, lo = codes
        return q.float() * scale + lo
    return enc, dec


def _uniform_eb():
    torch = _torch()

    def enc(x):
        return (torch.round(x / (2 * EB)).clamp_(-32768, 32767).to(torch.int16),)

    def dec(codes):
        return codes[0].float() * (2 * EB)
    return enc, dec


def _codecs() -> dict:
    torch = _torch()
    return {"fp16": _fp(torch.float16), "bf16": _fp(torch.bfloat16),
            "int8_rowwise": _int8_rowwise(), "uniform_eb": _uniform_eb()}


CODECS = ("fp16", "bf16", "int8_rowwise", "uniform_eb")


def shapes(quick: bool) -> list[tuple[int, int]]:
    """(rows, dim) of pooled-embedding blocks: 16k–512k rows of dim 64–256."""
    if quick:
        return [(256, 16)]
    return [(r, d) for d in (64, 128, 256) for r in (16384, 65536, 262144, 524288)]


def measure_quant(dev, *, quick: bool, samples: int, deadline: float) -> list[dict]:
    torch = _torch()
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for r, d in shapes(quick):
        if time.monotonic() > deadline:
            break
        x = torch.randn(r, d, device=dev, generator=gen) * 0.05    # pooled-embedding scale
        for name, (enc, dec) in _codecs().items():
            codes = enc(x)
            err = float((dec(codes) - x).abs().max())
            out_bytes = sum(c.numel() * c.element_size() for c in codes)
            tc, iqr_c = auto_time(lambda: enc(x), dev, samples=samples)
            td, iqr_d = auto_time(lambda: dec(codes), dev, samples=samples)
            n = x.numel() * 4
            rows.append(dict(codec=name, rows=r, dim=d, bytes_in=n, bytes_out=out_bytes,
                             compress_s=tc, decompress_s=td, compress_gbps=n / tc / 1e9,
                             decompress_gbps=n / td / 1e9, max_abs_error=err,
                             iqr_rel=max(iqr_c, iqr_d)))
    return rows


def main(argv: list[str] | None = None) -> int:
    args, dev, meta = open_driver("planner.measure.tables.gpu_quant", __doc__, argv, samples=5,
                                  budget_s=60.0, attention_backend="n/a")
    meta["uniform_eb_bound"] = EB
    run_parts(dev, args, meta, (("quant", measure_quant, 1.0),))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
