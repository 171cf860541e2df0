"""Measure a CUDA GPU's kernels and transformer blocks with PyTorch, for calibration and validation.

Run on the GPU machine (needs only torch and the standard library, not the rest of clusterplan)::

    python -m planner.measure.compute.gpu --out DIR [--quick]

It writes, in ``DIR``:

``kernels.csv``
    The input of ``clusterplan calibrate compute --measurements`` (columns
    ``kind,dtype,flops,bytes,seconds`` plus ``shape`` and ``iqr_rel``): ``matmul`` rows are
    ``torch.matmul`` (bf16/fp16/fp8 via ``torch._scaled_mm``/tf32/fp32) of square and
    transformer-shaped operands, FLOPs ``2·m·n·k``; ``memory`` rows are ``Tensor.copy_`` (bytes =
    read + write) and ``torch.add(a, b, out=c)`` (3 × array bytes) from 8 KiB to 4 GiB arrays;
    ``launch`` rows are a one-element add issued back to back (the per-op cost a stream of tiny
    kernels pays: host dispatch plus launch).
``attention.csv``
    ``F.scaled_dot_product_attention`` (causal, bf16, flash backend) forward and backward per
    shape, as kernel rows (``attention``, ``attention_backward``) for ``calibrate compute``;
    FLOPs as the LLM model counts them (forward ``2·b·s²·h``, half of the full-score
    ``4·b·s²·h``; backward 2.5 × that). The backward time is forward+backward minus forward.
``blocks.csv``
    One Llama-style block (RMSNorm, fused QKV with grouped KV heads, causal flash SDPA, output
    projection, SwiGLU MLP, residuals) in bf16, eager, forward and backward seconds per shape.
``steps.csv``
    A whole small decoder (embedding, L blocks, norm, logits, cross-entropy) forward+backward and
    a fused AdamW step, per model and micro-batch.
``kernels_graph.csv``
    The same kernels captured in CUDA graphs and replayed: the GPU's time per kernel without
    host dispatch (the compute profile's ``launch_overhead`` is the GPU-side cost; the host
    side is modelled apart, :mod:`planner.model.llm.host`).
``host.csv``
    :func:`planner.measure.compute.host.measure_host_overhead` on this device: the host seconds per tiny
    transformer block, forward, backward and full-recompute extra.
``embedding.csv``
    ``torch.nn.EmbeddingBag`` (sum pooling, sparse gradients) forward and backward per table
    shape, pooling factor and batch; uniform ids.
``meta.json``
    GPU name, driver, torch and CUDA versions, clocks, date, command.

Timing: CUDA events around ``reps`` back-to-back calls after ``warmup`` calls; each sample
is the mean over its calls; the reported time is the median of ``samples`` samples and
``iqr_rel`` the inter-quartile range of the samples over the median (the run-to-run noise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from planner.measure.compute import gpu_timing
from planner.measure.compute.gpu_blocks import measure_blocks, measure_steps
from planner.measure.compute.gpu_timing import (
    auto_time,
    flash_ctx,
    run_meta,
    time_call,
    torch_module,
    write_csv,
)
from planner.measure.compute.host import measure_host_overhead

__all__ = ["main", "measure_kernels", "measure_attention", "attention_rows",
           "measure_embedding", "measure_host"]


# -- kernels ----------------------------------------------------------------------------------
def _gemm_shapes(quick: bool) -> list[tuple[int, int, int]]:
    sq = [256, 512, 1024, 2048, 4096, 8192] if not quick else [128, 256]
    shapes = [(n, n, n) for n in sq]
    if quick:
        return shapes + [(256, 384, 128)]
    # (m tokens, n out, k in) of transformer GEMMs: QKV, attn-out, MLP up/down, logits shards
    for tokens in (512, 2048, 8192, 32768):
        for h, f in ((1024, 2816), (2048, 5632), (4096, 14336), (8192, 28672)):
            if tokens * max(h, f) > 2**29:
                continue
            shapes += [(tokens, h + 2 * 1024, h), (tokens, h, h), (tokens, 2 * f, h),
                       (tokens, h, f)]
    shapes += [(8192, 16032, 4096), (4096, 128256 // 8, 8192), (16, 4096, 4096),
               (64, 8192, 8192)]
    return sorted(set(shapes), key=lambda s: s[0] * s[1] * s[2])


def measure_kernels(dev, *, quick: bool, samples: int, graph: bool = False) -> list[dict]:
    torch = torch_module()
    rows: list[dict] = []
    # launch: a one-element add issued back to back
    x = torch.zeros(1, device=dev)
    t, iqr = time_call(lambda: x.add_(1.0), dev, reps=2000 if not quick else 50,
                        samples=samples, graph=graph)
    rows.append(dict(kind="launch", dtype="", flops="", bytes="", seconds=t, shape="1",
                     iqr_rel=iqr))
    dtypes = ["bf16", "fp16", "tf32", "fp32", "fp8"] if dev.type == "cuda" else ["fp32"]
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
           "fp32": torch.float32}
    for dt in dtypes:
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
        for (m, n, k) in _gemm_shapes(quick):
            flops = 2.0 * m * n * k
            if dt in ("fp32", "tf32") and flops > 2e12:
                continue
            try:
                if dt == "fp8":
                    a = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
                    b = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()
                    one = torch.ones((), device=dev)
                    fn = (lambda a=a, b=b, one=one: torch._scaled_mm(
                        a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
                    nbytes = m * k + k * n + 2 * m * n
                else:
                    a = torch.randn(m, k, device=dev, dtype=tdt[dt])
                    b = torch.randn(k, n, device=dev, dtype=tdt[dt])
                    fn = (lambda a=a, b=b: a @ b)
                    nbytes = a.element_size() * (m * k + k * n + m * n)
                t, iqr = auto_time(fn, dev, samples=samples, graph=graph)
            except (RuntimeError, TypeError) as exc:  # a dtype/shape this build cannot run
                print(f"skip {dt} {m}x{n}x{k}: {str(exc).splitlines()[0]}", file=sys.stderr)
                continue
            finally:
                a = b = None
            rows.append(dict(kind="matmul", dtype=dt, flops=flops, bytes=nbytes, seconds=t,
                             shape=f"{m}x{n}x{k}", iqr_rel=iqr))
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    top = 4 * 2**30 if dev.type == "cuda" and not quick else 2**24
    nb = 2**13
    while nb <= top:
        n = nb // 2
        a = torch.empty(n, device=dev, dtype=torch.bfloat16).normal_()
        b = torch.empty_like(a)
        t, iqr = auto_time(lambda: b.copy_(a), dev, samples=samples, graph=graph)
        rows.append(dict(kind="memory", dtype="bf16", flops="", bytes=2 * nb, seconds=t,
                         shape=f"copy {nb}", iqr_rel=iqr))
        if nb <= top // 2:
            c = torch.empty_like(a)
            t, iqr = auto_time(lambda: torch.add(a, b, out=c), dev, samples=samples,
                                    graph=graph)
            rows.append(dict(kind="memory", dtype="bf16", flops="", bytes=3 * nb, seconds=t,
                             shape=f"add {nb}", iqr_rel=iqr))
        a = b = c = None
        nb *= 4
    return rows


# -- attention --------------------------------------------------------------------------------
def measure_attention(dev, *, quick: bool, samples: int) -> list[dict]:
    torch = torch_module()
    import torch.nn.functional as F
    rows = []
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = ([(1, 4, 256, 64)] if quick else
              [(1, 8, 1024, 128), (4, 16, 1024, 128), (1, 16, 2048, 128), (2, 32, 2048, 128),
               (1, 32, 4096, 128), (2, 32, 4096, 128), (1, 64, 4096, 128), (1, 32, 8192, 128),
               (1, 64, 8192, 128), (1, 16, 16384, 128), (8, 16, 2048, 64)])
    ctx = flash_ctx()
    for (b, heads, s, d) in shapes:
        q, k, v = (torch.randn(b, heads, s, d, device=dev, dtype=dt, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(b, heads, s, d, device=dev, dtype=dt)
        with ctx():
            def fwd():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            tf, iqr_f = auto_time(fwd, dev, samples=samples)

            def fwd_bwd():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                o.backward(g)
            tfb, iqr_fb = auto_time(fwd_bwd, dev, samples=samples)
        rows += attention_rows(b, heads, s, d, "bf16" if dt == torch.bfloat16 else "fp32",
                               forward_s=tf, backward_s=tfb - tf, iqr_fwd=iqr_f,
                               iqr_fwd_bwd=iqr_fb)
    return rows


def attention_rows(b: int, heads: int, s: int, d: int, dtype: str, *, forward_s: float,
                   backward_s: float, iqr_fwd: float, iqr_fwd_bwd: float) -> list[dict]:
    """Two kernel rows (``attention``, ``attention_backward``) of one causal SDPA shape, charged
    the FLOPs the LLM model counts (forward ``2·b·s²·h``, backward 2.5 × that) and the bytes of
    q, k, v and the output (forward; twice that and the gradients backward)."""
    h = heads * d
    e = 2 if dtype in ("bf16", "fp16") else 4
    f = 2.0 * b * s * s * h
    shape = f"b{b} heads{heads} s{s} d{d}"
    rows = [dict(kind="attention", dtype=dtype, flops=f, bytes=4.0 * e * b * s * h,
                 seconds=forward_s, shape=shape, iqr_rel=iqr_fwd),
            dict(kind="attention_backward", dtype=dtype, flops=2.5 * f,
                 bytes=8.0 * e * b * s * h, seconds=backward_s, shape=shape,
                 iqr_rel=iqr_fwd_bwd)]
    for r in rows:
        if not r["seconds"] > 0:        # a difference of two noisy timings (tiny CPU shapes)
            print(f"dropped {r['kind']} {shape}: non-positive time", file=sys.stderr)
    return [r for r in rows if r["seconds"] > 0]


def measure_embedding(dev, *, quick: bool, samples: int) -> list[dict]:
    """``nn.EmbeddingBag(mode="sum")`` forward and backward (dense fp32 gradients into a
    preallocated buffer are not what a fused TBE does, so backward uses ``sparse=True``);
    ids uniform over the rows (the worst case for caches)."""
    torch = torch_module()
    rows = []
    configs = ([(10_000, 16, 4, 256)] if quick else
               [(r, d, p, b) for r in (100_000, 10_000_000) for d in (16, 64, 256)
                for p in (1, 16, 64) for b in (4096, 32768)])
    for (nrows, dim, pool, batch) in configs:
        if nrows * dim * 4 > 8 * 2**30:
            continue
        emb = torch.nn.EmbeddingBag(nrows, dim, mode="sum", sparse=True).to(dev)
        ids = torch.randint(0, nrows, (batch * pool,), device=dev)
        offsets = torch.arange(0, batch * pool, pool, device=dev)
        tf, iqr_f = auto_time(lambda: emb(ids, offsets), dev, samples=samples)
        g = torch.randn(batch, dim, device=dev)

        def fb():
            emb.weight.grad = None          # sparse gradients would pile up across calls
            emb(ids, offsets).backward(g)
        tfb, iqr_fb = auto_time(fb, dev, samples=samples)
        rows.append(dict(rows=nrows, dim=dim, pooling=pool, batch=batch, dtype="fp32",
                         forward_s=tf, backward_s=tfb - tf,
                         gathered_bytes=4.0 * batch * pool * dim,
                         iqr_rel_fwd=iqr_f, iqr_rel_fwd_bwd=iqr_fb))
        del emb, ids, offsets, g
    return rows


def measure_host(dev, *, quick: bool, samples: int) -> list[dict]:
    """The host-overhead microbenchmark of :mod:`planner.model.llm.host` on this device."""
    doc = measure_host_overhead(device=dev.type, layers=4 if quick else 24,
                                repeats=5 if quick else 40, warmup=2 if quick else 10)
    return [{"pass": k, "seconds_per_block": v,
             "iqr_rel": doc["noise_iqr_over_median"].get(
                 {"backward": "forward_backward", "recompute_extra":
                  "recompute_forward_backward"}.get(k, k), "")}
            for k, v in doc["per_block_s"].items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.measure.compute.gpu", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="directory to write the CSVs to")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run, any device)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--samples", type=int, default=7, help="samples per measurement (median)")
    ap.add_argument("--attention-backend", default="flash",
                    choices=("flash", "cudnn", "efficient"),
                    help="PyTorch SDPA backend for attention, blocks and steps (default flash)")
    ap.add_argument("--only", default="kernels,kernels_graph,attention,blocks,steps,host,embedding",
                    help="comma-separated parts to run")
    args = ap.parse_args(argv)
    gpu_timing.ATTENTION_BACKEND = args.attention_backend
    torch = torch_module()
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    args.out.mkdir(parents=True, exist_ok=True)
    meta = run_meta(dev, args, " ".join([os.path.basename(sys.executable), "-m",
                                         "planner.measure.compute.gpu", *sys.argv[1:]]))
    parts = {"kernels": measure_kernels, "attention": measure_attention,
             "blocks": measure_blocks, "steps": measure_steps,
             "kernels_graph": lambda d, **kw: measure_kernels(d, graph=True, **kw),
             "host": measure_host, "embedding": measure_embedding}
    for part in args.only.split(","):
        t0 = time.perf_counter()
        rows = parts[part](dev, quick=args.quick, samples=args.samples)
        write_csv(args.out / f"{part}.csv", rows)
        meta[f"{part}_wall_s"] = round(time.perf_counter() - t0, 1)
        print(f"{part}: {len(rows)} rows in {meta[f'{part}_wall_s']} s", flush=True)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
