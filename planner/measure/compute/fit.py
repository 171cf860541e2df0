"""Efficiency curves from measured kernel timings (any GPU, or this CPU).

Input: a table of measurements, one row per timed op, with columns

========  =====================================================================
kind      ``matmul`` (compute-bound: a GEMM), ``memory`` (bandwidth-bound: a copy or
          elementwise op), ``launch`` (an empty kernel: the fixed per-op cost), or
          ``attention`` / ``attention_backward`` (a fused flash-attention kernel, charged the
          FLOPs :mod:`planner.model.llm.kernels` counts: forward ``2·b·s²·h`` causal, backward
          2.5 × that)
dtype     precision of a matmul (bf16, fp16, fp8, tf32, fp32 ...); ignored otherwise
flops     FLOPs of the op (matmul rows)
bytes     bytes the op moves to and from memory (memory rows)
seconds   measured time of one op (median of repeats, after warm-up)
========  =====================================================================

Output: the mapping of a ``traces/efficiency/<gpu>.yaml`` file. The launch overhead is the
median of the launch rows (or given); each size's efficiency is the median over its rows of
``work / (peak × (seconds − launch))`` against the catalog peak, so the roofline model
``launch + work / (peak × efficiency)`` reproduces the measured medians. Efficiencies above 1
mean the catalog peak is wrong for this part and are refused; curves are made monotone in time
(:func:`~simulator.efficiency.monotone_time_points`).
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.efficiency import monotone_time_points
from simulator.errors import SpecError
from simulator.fileio import check_input_file
from simulator.hardware import GPUSpec, gpu_spec

__all__ = ["read_measurements", "profile_from_measurements"]

_COLUMNS = ("kind", "dtype", "flops", "bytes", "seconds")


def read_measurements(path: str | Path) -> pd.DataFrame:
    """Read a measurement CSV (columns above; ``dtype``/``flops``/``bytes`` may be blank)."""
    path = check_input_file(path, field="--measurements")
    try:
        df = pd.read_csv(path)
    except FileNotFoundError:
        raise SpecError("file not found", source=str(path), fix="check the path") from None
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read the CSV: {exc}", source=str(path),
                        fix="write a CSV with columns kind,dtype,flops,bytes,seconds") from None
    missing = [c for c in ("kind", "seconds") if c not in df.columns]
    if missing:
        raise SpecError(f"missing column {missing[0]!r}", source=str(path), field=missing[0],
                        fix="write a CSV with columns kind,dtype,flops,bytes,seconds")
    for c in _COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    bad = ~df.kind.isin(["matmul", "memory", "launch", "attention", "attention_backward"])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise SpecError(f"row {i + 2}: unknown kind {df.kind.iloc[i]!r}", source=str(path),
                        field="kind",
                        fix="use matmul, memory, launch, attention or attention_backward")
    for c in ("flops", "bytes", "seconds"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    need = {"matmul": "flops", "memory": "bytes", "attention": "flops",
            "attention_backward": "flops"}
    for i, row in df.iterrows():
        if not row.seconds > 0:
            raise SpecError(f"row {i + 2}: seconds must be positive, got {row.seconds!r}",
                            source=str(path), field="seconds", fix="give the measured time")
        col = need.get(row.kind)
        if col and not row[col] > 0:
            raise SpecError(f"row {i + 2}: a {row.kind} row needs positive {col}",
                            source=str(path), field=col, fix=f"fill in {col}")
    df["dtype"] = df.dtype.fillna("bf16").astype(str)
    return df


def profile_from_measurements(gpu: str | GPUSpec, df: pd.DataFrame, *, source: str,
                              launch_overhead_s: float | None = None,
                              drop_cache_resident: bool = False) -> dict:
    """Build an efficiency-file mapping from measurements (see the module docstring).

    ``drop_cache_resident``: memory rows that moved bytes faster than the HBM peak were served
    by the on-chip cache (an op replayed on the same few-MB buffers stays in L2); they say
    nothing about HBM and are dropped, and the count is recorded in the source, instead of
    refusing the file.
    """
    spec = gpu if isinstance(gpu, GPUSpec) else gpu_spec(gpu)
    if launch_overhead_s is None:
        launch = df[df.kind == "launch"].seconds
        launch_overhead_s = float(launch.median()) if len(launch) else 0.0
    if drop_cache_resident:
        fast = (df.kind == "memory") & (
            df.bytes / (spec.hbm_bandwidth_Bps * (df.seconds - launch_overhead_s)) > 1.0)
        if fast.any():
            lo, hi = df.bytes[fast].min(), df.bytes[fast].max()
            source += (f"; {int(fast.sum())} memory rows faster than HBM ({lo:.3g}-{hi:.3g} "
                       "bytes moved: L2-resident) dropped")
            df = df[~fast]
    matmul = {}
    for dtype, g in df[df.kind == "matmul"].groupby("dtype"):
        peak = spec.peak(dtype)
        matmul[dtype] = _curve(g.flops.to_numpy(), g.seconds.to_numpy(), peak, launch_overhead_s,
                               f"matmul {dtype}")
    mem = df[df.kind == "memory"]
    if not matmul or mem.empty:
        raise SpecError("need matmul and memory rows", field="kind",
                        fix="time at least a few GEMM sizes and a few copy sizes")
    memory = _curve(mem.bytes.to_numpy(), mem.seconds.to_numpy(), spec.hbm_bandwidth_Bps,
                    launch_overhead_s, "memory")
    extra = {}
    for kind in ("attention", "attention_backward"):
        for dtype, g in df[df.kind == kind].groupby("dtype"):
            extra.setdefault(kind, {})[dtype] = _curve(
                g.flops.to_numpy(), g.seconds.to_numpy(), spec.peak(dtype), launch_overhead_s,
                f"{kind} {dtype}")
    return {"gpu": spec.name,
            "source": f"{source} (fitted by planner/measure/compute/fit.py on "
                      f"{datetime.date.today().isoformat()}, {len(df)} measurements)",
            "launch_overhead": float(launch_overhead_s),
            "matmul": matmul, "memory": memory, **extra,
            "notes": "efficiency = work / (catalog peak × (measured median − launch overhead))"}


def _curve(size: np.ndarray, seconds: np.ndarray, peak: float, launch: float, what: str
           ) -> list[list[float]]:
    work = seconds - launch
    if (work <= 0).any():
        raise SpecError(f"{what}: a measurement is not longer than the launch overhead "
                        f"({launch:g} s)", field="seconds",
                        fix="time larger ops or lower the launch overhead")
    eff = pd.Series(size / (peak * work)).groupby(size).median()
    if (eff > 1.0 + 1e-9).any():
        s = float(eff.idxmax())
        raise SpecError(f"{what}: size {s:g} ran at {eff.max():.2f}× the catalog peak "
                        f"({peak:g}/s)", field="seconds",
                        fix="check the measurement or correct the GPU's peak in the catalog")
    pts = [[float(s), round(float(e), 4)] for s, e in eff.items()]
    return monotone_time_points(pts, digits=4)
