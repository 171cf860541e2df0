"""Measure attention over packed documents on a CUDA GPU: the cost of one causal document by its
length, and of the query chunks context parallelism gives each rank (WLB-LLM-style packing and
per-document CP sharding).

Run on the GPU machine (needs only torch and the standard library)::

    python -m planner.measure.compute.gpu_doc_attention --out DIR [--quick] [--budget-s S]

Packed sequences use document masks, so a micro-batch's attention is the sum of its documents'
causal attentions; a variable-length kernel runs them in one call. Here ``docs`` documents of
the same length run as one batched causal ``F.scaled_dot_product_attention`` call (flash
backend, bf16, 32 heads of 128), which does the same work in one launch.

It writes, in ``DIR``:

``docs.csv``
    ``doc_len`` tokens, ``docs`` per call, ``forward_s`` / ``backward_s`` per call (backward =
    forward+backward minus forward), ``flops`` of the forward as the LLM model counts it
    (``2·docs·doc_len²·hidden``: half the full score matrix), ``forward_tflops`` /
    ``backward_tflops`` (backward charged 2.5× the forward FLOPs), ``iqr_rel``.
``chunks.csv``
    The shapes of per-document CP sharding: a query chunk of ``q_len`` tokens against ``kv_len``
    keys. ``mask`` ``full`` (the chunk attends to every earlier chunk of its document: no mask) or
    ``causal`` (the chunk's own diagonal block, ``q_len == kv_len``). ``batch`` chunks per call;
    times and TFLOP/s as above, FLOPs ``4·batch·q_len·kv_len·hidden`` for ``full`` and half that
    for ``causal``. Short chunks show the flash kernel's 128-query tile padding.
``meta.json``
    GPU, driver, torch, CUDA, date, command, wall time per part.

Timing as :mod:`planner.measure.compute.gpu` (CUDA events, median of ``--samples`` samples).
"""

from __future__ import annotations

import time

from planner.measure.compute.driver import open_driver, run_parts
from planner.measure.compute.gpu_timing import auto_time, flash_ctx

__all__ = ["main", "doc_lengths", "chunk_shapes"]

HEADS, HEAD_DIM = 32, 128


def _torch():
    import torch
    return torch


def doc_lengths(quick: bool) -> list[int]:
    """Document lengths in tokens: 128 to 131,072 by doubling (``quick``: 64 and 128)."""
    return [64, 128] if quick else [128 * 2**k for k in range(11)]


def chunk_shapes(quick: bool) -> list[tuple[int, int, str]]:
    """(q_len, kv_len, mask): chunks of 16–4,096 queries, their own causal block and 4 or 16
    times as many earlier keys."""
    qs = [16, 64] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    return [(q, q * r, "causal" if r == 1 else "full") for q in qs for r in (1, 4, 16)]


def _time_attention(dev, b: int, q_len: int, kv_len: int, causal: bool, heads: int,
                    samples: int) -> tuple[float, float, float]:
    """(forward s, backward s, IQR/median) of one SDPA call of ``b`` sequences."""
    torch = _torch()
    import torch.nn.functional as F
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    q = torch.randn(b, heads, q_len, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
    k, v = (torch.randn(b, heads, kv_len, HEAD_DIM, device=dev, dtype=dt, requires_grad=True)
            for _ in range(2))
    g = torch.randn(b, heads, q_len, HEAD_DIM, device=dev, dtype=dt)
    ctx = flash_ctx()
    with ctx():
        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def fwd_bwd():
            fwd().backward(g)
        tf, iqr_f = auto_time(fwd, dev, samples=samples)
        tfb, iqr_fb = auto_time(fwd_bwd, dev, samples=samples)
    return tf, max(tfb - tf, 0.0), max(iqr_f, iqr_fb)


def _row(flops: float, tf: float, tb: float, iqr: float) -> dict:
    return dict(forward_s=tf, backward_s=tb, flops=flops,
                forward_tflops=flops / tf / 1e12 if tf > 0 else 0.0,
                backward_tflops=2.5 * flops / tb / 1e12 if tb > 0 else 0.0, iqr_rel=iqr)


def measure_docs(dev, *, quick: bool, samples: int, deadline: float) -> list[dict]:
    """``docs.csv`` rows, shortest documents first, until ``deadline`` (monotonic seconds)."""
    heads = 4 if quick else HEADS
    tokens = 256 if quick else 32768
    rows = []
    for d in doc_lengths(quick):
        if time.monotonic() > deadline:
            break
        b = max(1, tokens // d)
        tf, tb, iqr = _time_attention(dev, b, d, d, True, heads, samples if d < 32768 else 3)
        flops = 2.0 * b * d * d * heads * HEAD_DIM
        rows.append(dict(doc_len=d, docs=b, heads=heads, head_dim=HEAD_DIM)
                    | _row(flops, tf, tb, iqr))
        print(f"  doc {d}: fwd {tf * 1e3:.3f} ms, bwd {tb * 1e3:.3f} ms", flush=True)
    return rows


def measure_chunks(dev, *, quick: bool, samples: int, deadline: float) -> list[dict]:
    """``chunks.csv`` rows, until ``deadline``; about 64k keys per call."""
    heads = 4 if quick else HEADS
    keys = 1024 if quick else 65536
    rows = []
    for q_len, kv_len, mask in chunk_shapes(quick):
        if time.monotonic() > deadline:
            break
        b = max(1, keys // kv_len)
        causal = mask == "causal"
        tf, tb, iqr = _time_attention(dev, b, q_len, kv_len, causal, heads, samples)
        flops = (2.0 if causal else 4.0) * b * q_len * kv_len * heads * HEAD_DIM
        rows.append(dict(q_len=q_len, kv_len=kv_len, mask=mask, batch=b, heads=heads,
                         head_dim=HEAD_DIM) | _row(flops, tf, tb, iqr))
    return rows


def main(argv: list[str] | None = None) -> int:
    args, dev, meta = open_driver("planner.measure.compute.gpu_doc_attention", __doc__, argv, samples=5,
                                  budget_s=150.0, attention_backend="flash")
    run_parts(dev, args, meta, (("chunks", measure_chunks, 0.35), ("docs", measure_docs, 1.0)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
