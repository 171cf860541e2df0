"""Measure what activation offload costs on a CUDA GPU: host-device copies over PCIe, and how
copies on their own streams overlap with compute (the swap of MEMO-style long-context training).

Run on the GPU machine (needs only torch and the standard library)::

    python -m planner.measure.compute.gpu_offload --out DIR [--quick] [--budget-s S]

It writes, in ``DIR``:

``pcie.csv``
    One copy per row: ``direction`` ``h2d`` / ``d2h`` alone, or ``both`` (an H2D and a D2H of the
    same size on two streams at once, as a swap-in and a swap-out overlap); ``host`` memory
    ``pinned`` (page-locked, what an offload buffer uses) or ``pageable``; ``bytes`` per copy;
    ``seconds`` (wall of the copy, or of both); ``gbps`` (10⁹ bytes/s per direction); ``iqr_rel``.
``overlap.csv``
    A compute kernel (``gemm``: a bf16 8192³ matmul; ``attention``: causal flash SDPA of 16k tokens
    and 32 heads of 128) and a pinned D2H copy, each alone and then together on separate streams:
    ``compute_s`` / ``copy_s`` alone, ``compute_with_copy_s`` / ``copy_with_compute_s`` (each timed
    on its own stream while the other runs), ``both_s`` (wall of the pair). The ratio says how much
    a swap slows the compute it hides behind, and the copy's bandwidth under load.
``meta.json``
    GPU, driver, torch, CUDA, host memory (``/proc/meminfo`` MemTotal, bytes), date, command.

Timing: CUDA events; median of ``--samples`` samples; ``iqr_rel`` is the samples' inter-quartile
range over the median. A CPU run (``--device cpu``) has no copies to time and writes nothing but
``meta.json``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from planner.measure.compute.driver import open_driver, run_parts
from planner.measure.compute.gpu_timing import flash_ctx

__all__ = ["main", "copy_sizes"]


def _torch():
    import torch
    return torch


def copy_sizes(quick: bool) -> list[int]:
    """Bytes per copy: 1 MiB to 1 GiB by factors of 4 (``quick``: 1 and 4 MiB)."""
    return [2**20, 2**22] if quick else [2**20 * 4**k for k in range(6)]


def _event_time(launch, samples: int) -> tuple[float, float]:
    """(median seconds, IQR/median) of ``launch()``, which enqueues work and returns the events
    that bracket it (start, end), over ``samples`` runs after one warm-up."""
    torch = _torch()
    launch()
    torch.cuda.synchronize()
    vals = []
    for _ in range(samples):
        a, b = launch()
        b.synchronize()
        vals.append(a.elapsed_time(b) / 1e3)
    med = statistics.median(vals)
    q = statistics.quantiles(vals, n=4) if len(vals) >= 4 else [min(vals), med, max(vals)]
    return med, (q[2] - q[0]) / med


def _copy_launcher(dst, src, stream):
    torch = _torch()

    def launch():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record()
            dst.copy_(src, non_blocking=True)
            b.record()
        return a, b
    return launch


def _pair_launcher(jobs):
    """Launch every ``(stream, fn)`` at once: each stream waits on one start event; the end event
    waits on every stream (the wall of the whole pair)."""
    torch = _torch()

    def launch():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        main = torch.cuda.current_stream()
        a.record(main)
        for stream, fn in jobs:
            stream.wait_event(a)
            with torch.cuda.stream(stream):
                fn()
        for stream, _ in jobs:
            main.wait_stream(stream)
        b.record(main)
        return a, b
    return launch


def measure_pcie(dev, *, quick: bool, samples: int, deadline: float) -> list[dict]:
    """``pcie.csv`` rows: H2D, D2H and both at once, pinned and pageable, per size."""
    torch = _torch()
    rows = []
    s1, s2 = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    for host in ("pinned", "pageable"):
        for n in copy_sizes(quick):
            if time.monotonic() > deadline:
                return rows
            h_src = torch.empty(n, dtype=torch.uint8, pin_memory=host == "pinned")
            h_dst = torch.empty(n, dtype=torch.uint8, pin_memory=host == "pinned")
            d_src = torch.ones(n, dtype=torch.uint8, device=dev)
            d_dst = torch.empty(n, dtype=torch.uint8, device=dev)
            cases = {"h2d": _copy_launcher(d_dst, h_src, s1),
                     "d2h": _copy_launcher(h_dst, d_src, s1),
                     "both": _pair_launcher([(s1, lambda: d_dst.copy_(h_src, non_blocking=True)),
                                             (s2, lambda: h_dst.copy_(d_src, non_blocking=True))])}
            for direction, launch in cases.items():
                t, iqr = _event_time(launch, samples)
                rows.append(dict(direction=direction, host=host, bytes=n, seconds=t,
                                 gbps=n / t / 1e9, iqr_rel=iqr))
    return rows


def _compute_jobs(dev, quick: bool) -> dict:
    """name -> (function, bytes of the copy that runs beside it)."""
    torch = _torch()
    import torch.nn.functional as F
    n = 1024 if quick else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    s, heads = (1024, 4) if quick else (16384, 32)
    q, k, v = (torch.randn(1, heads, s, 128, device=dev, dtype=torch.bfloat16) for _ in range(3))
    ctx = flash_ctx()

    def attention():
        with ctx():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return {"gemm": (lambda: torch.matmul(a, a, out=c), 2**24 if quick else 2**30),
            "attention": (attention, 2**24 if quick else 2**30)}


def measure_overlap(dev, *, quick: bool, samples: int, deadline: float) -> list[dict]:
    """``overlap.csv`` rows: compute and a pinned D2H copy alone and together."""
    torch = _torch()
    rows = []
    comp, copy = torch.cuda.Stream(dev), torch.cuda.Stream(dev)
    for name, (fn, nbytes) in _compute_jobs(dev, quick).items():
        if time.monotonic() > deadline:
            break
        src = torch.ones(nbytes, dtype=torch.uint8, device=dev)
        dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        one = _event_time(_stream_launcher(comp, fn, 1), 2)[0]
        reps = max(1, round(_copy_time(dst, src, copy) / one))     # compute as long as the copy
        compute_alone, iqr_c = _event_time(_stream_launcher(comp, fn, reps), samples)
        copy_alone, iqr_k = _event_time(_copy_launcher(dst, src, copy), samples)
        with_copy, with_compute, both = _timed_together(comp, fn, reps, copy, dst, src, samples)
        rows.append(dict(compute=name, compute_calls=reps, copy_bytes=nbytes,
                         compute_s=compute_alone, copy_s=copy_alone,
                         compute_with_copy_s=with_copy, copy_with_compute_s=with_compute,
                         both_s=both, compute_slowdown=with_copy / compute_alone,
                         copy_gbps_alone=nbytes / copy_alone / 1e9,
                         copy_gbps_with_compute=nbytes / with_compute / 1e9,
                         iqr_rel=max(iqr_c, iqr_k)))
        del src, dst
    return rows


def _copy_time(dst, src, stream) -> float:
    return _event_time(_copy_launcher(dst, src, stream), 2)[0]


def _stream_launcher(stream, fn, reps: int):
    torch = _torch()

    def launch():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            a.record()
            for _ in range(reps):
                fn()
            b.record()
        return a, b
    return launch


def _timed_together(comp, fn, reps, copy, dst, src, samples) -> tuple[float, float, float]:
    """Median (compute seconds, copy seconds, wall of both) with both started together."""
    torch = _torch()
    vals = []
    for i in range(samples + 1):
        start = torch.cuda.Event(enable_timing=True)
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        start.record(torch.cuda.current_stream())
        for s in (comp, copy):
            s.wait_event(start)
        with torch.cuda.stream(comp):
            ev[0].record()
            for _ in range(reps):
                fn()
            ev[1].record()
        with torch.cuda.stream(copy):
            ev[2].record()
            dst.copy_(src, non_blocking=True)
            ev[3].record()
        torch.cuda.synchronize()
        if i:                                       # the first pair is a warm-up
            end = max(ev[1], ev[3], key=lambda e: start.elapsed_time(e))
            vals.append((ev[0].elapsed_time(ev[1]) / 1e3, ev[2].elapsed_time(ev[3]) / 1e3,
                         start.elapsed_time(end) / 1e3))
    return tuple(statistics.median(v[j] for v in vals) for j in range(3))


def _host_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main(argv: list[str] | None = None) -> int:
    args, dev, meta = open_driver("planner.measure.compute.gpu_offload", __doc__, argv, samples=7,
                                  budget_s=120.0, attention_backend="flash")
    meta["host_memory_bytes"] = _host_memory_bytes()
    if dev.type != "cuda":
        meta["note"] = "no CUDA device: nothing to copy over PCIe"
    run_parts(dev, args, meta, (("pcie", measure_pcie, 0.6), ("overlap", measure_overlap, 1.0))
              if dev.type == "cuda" else ())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
