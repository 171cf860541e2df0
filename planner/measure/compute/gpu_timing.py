"""Timing on a GPU (or the CPU, for smoke runs) for the measurement scripts of
``planner/measure``: CUDA events around back-to-back calls, optionally replayed from a CUDA
graph (:func:`time_call`, :func:`auto_time`), the SDPA backend they run attention with
(:func:`flash_ctx`), and the ``meta.json`` and CSV files they write (:func:`run_meta`,
:func:`write_csv`). Needs only torch and the standard library; times are seconds.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import platform
import statistics
import subprocess
import time
from pathlib import Path

__all__ = ["torch_module", "sync", "time_call", "reps_for", "auto_time", "ATTENTION_BACKEND",
           "flash_ctx", "run_meta", "write_csv", "CsvRows", "first_call_s"]


def torch_module():
    import torch
    return torch


def sync(dev):
    torch = torch_module()
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, dev, *, reps: int, samples: int, warmup: int = 3,
               graph: bool = False) -> tuple[float, float]:
    """(median seconds per call, IQR / median) of ``fn`` run ``reps`` times per sample.

    ``graph=True`` (CUDA only) captures the ``reps`` calls in a CUDA graph and times its
    replay: the GPU's own time per kernel, without the host's dispatch (which eager calls
    issued back to back pay whenever a kernel is shorter than it).
    """
    torch = torch_module()
    calls = reps                       # calls of the original fn per timed sample
    if graph and dev.type == "cuda":
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        fn, reps = g.replay, 1
    for _ in range(warmup):
        fn()
    sync(dev)
    vals = []
    for _ in range(samples):
        if dev.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            vals.append(a.elapsed_time(b) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            vals.append((time.perf_counter() - t0) / calls)
    vals.sort()
    med = statistics.median(vals)
    q = statistics.quantiles(vals, n=4) if len(vals) >= 4 else [vals[0], med, vals[-1]]
    return med, (q[2] - q[0]) / med if med > 0 else 0.0


def first_call_s(fn, dev) -> float:
    """Wall seconds of ``fn``'s first call, to the GPU's end of it: compilation included."""
    t0 = time.monotonic()
    fn()
    sync(dev)
    return time.monotonic() - t0


def reps_for(est_s: float, target_s: float = 0.02, max_reps: int = 200) -> int:
    return max(1, min(max_reps, int(target_s / max(est_s, 1e-7))))


def auto_time(fn, dev, *, samples: int, graph: bool = False) -> tuple[float, float]:
    t, _ = time_call(fn, dev, reps=1, samples=2, warmup=2)
    return time_call(fn, dev, reps=reps_for(t), samples=samples, warmup=1, graph=graph)


#: SDPA backend the attention, block and step parts use (``--attention-backend``)
ATTENTION_BACKEND = "flash"


def flash_ctx():
    torch = torch_module()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        if torch.cuda.is_available():
            backend = {"flash": SDPBackend.FLASH_ATTENTION,
                       "cudnn": SDPBackend.CUDNN_ATTENTION,
                       "efficient": SDPBackend.EFFICIENT_ATTENTION}[ATTENTION_BACKEND]
            return lambda: sdpa_kernel([backend])
    except ImportError:
        pass
    return contextlib.nullcontext


def run_meta(dev, args, command: str) -> dict:
    """What a measurement ran on and how: ``command`` as typed, the machine, and ``args`` of
    the measurement script's parser (``samples``, ``quick``, ``attention_backend``)."""
    torch = torch_module()
    meta = {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "torch": torch.__version__, "python": platform.python_version(),
            "host": platform.node(), "cpu": platform.processor() or platform.machine(),
            "device": str(dev), "samples": args.samples, "quick": args.quick,
            "attention_backend": args.attention_backend}
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        meta |= {"gpu": p.name, "multiprocessors": p.multi_processor_count,
                 "memory_bytes": p.total_memory, "cuda": torch.version.cuda}
        try:
            q = "name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,clocks.sm"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            meta["nvidia_smi"] = {"query": q, "value": out}
        except (OSError, subprocess.TimeoutExpired):
            pass
    return meta


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` (dicts with the same keys) as CSV, floats to 6 significant digits; nothing
    when there are none."""
    if not rows:
        return
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


class CsvRows:
    """A CSV file written one row at a time (flushed), header from the first row."""

    def __init__(self, path: Path):
        self.path, self.fh, self.w = path, None, None

    def add(self, row: dict) -> None:
        if self.w is None:
            self.fh = self.path.open("w", newline="")
            self.w = csv.DictWriter(self.fh, fieldnames=list(row))
            self.w.writeheader()
        self.w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
