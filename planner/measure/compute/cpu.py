"""Measure this machine's CPU as a compute profile (``traces/efficiency/cpu.yaml``).

The ``cpu`` catalog entry stands for the small x86-64 VMs used for gloo validation runs. Its
peak fp32 rate and memory bandwidth are not published figures but measurements taken here:

* matmul: numpy fp32 ``a @ b`` of n×n matrices (2·n³ FLOPs each) for several n, with the BLAS
  numpy ships using all cores (or ``threads`` of them);
* memory: numpy fp32 ``np.add(a, b, out=c)`` (3 arrays of n bytes → 3·n bytes moved) for array
  sizes from 64 KiB (smaller ops are dominated by the launch overhead) to 64 MiB (far past the
  last-level cache), single-threaded as numpy elementwise ops are; plain copies are recorded
  for reference;
* launch overhead: the same add on 1-element arrays (numpy's per-call cost).

Each size's time is the fastest (``statistic="min"``, the default) or the median of ``repeats``
samples after a warm-up; a sample repeats the call enough times to last ``min_sample_s``. The
fastest is the default because interference from other tenants only ever slows a timing down, so
the fastest sample is the better estimate of what the machine can do (on the 2-core VM this was
written on, medians of a 2048² matmul ranged 93-131 ms between runs, fastest samples 86-105 ms);
medians and spreads are recorded next to it. Samples are taken in rounds over all sizes, and a
round during which other processes used more than :data:`CONTENTION_LIMIT` of the CPUs (from
``/proc/stat``) is retaken: on a shared 2-core VM one busy neighbour makes a 2-thread matmul up
to 100x slower. Times are converted to rates after subtracting the launch overhead (so the model
``launch + work / (peak · eff)`` reproduces each measurement), and the peak is the best rate
achieved, so efficiencies are ≤ 1 by construction and the best size is exactly 1.

Run ``python -m planner.measure.compute.cpu`` to rewrite the shipped file, on an idle machine:
on the VMs this was written on, a process that has just freed a few GB slows every core for
seconds afterwards (the guest returns the pages to the host), halving small-matmul rates.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from simulator.errors import SpecError
from simulator.units import format_time

from planner.measure.compute.cpu_profile_file import (
    CpuFit,
    measured_record,
    profile_notes,
    profile_source,
    sig,
    write_profile,
)

__all__ = ["measure_cpu_profile", "main", "machine_busy_s"]

DEFAULT_SIZES = (64, 128, 256, 512, 1024, 2048)
#: the matmul measurement runs in a child process; it is ended after this many seconds
SUBPROCESS_TIMEOUT_S = 900.0
DEFAULT_ARRAY_BYTES = tuple(2**k for k in range(16, 27, 2))  # 64 KiB .. 64 MiB per array
#: A round of samples is retaken when other processes used more than this share of all cores.
CONTENTION_LIMIT = 0.05


def machine_busy_s() -> float | None:
    """Busy CPU-seconds of the whole machine since boot, all cores (steal time counts as
    busy: another VM used the core); None off Linux."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:9]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / hz  # all but idle and iowait


def _cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU-seconds of the whole machine, CPU-seconds of this process); None off Linux."""
    busy = machine_busy_s()
    return None if busy is None else (busy, time.process_time())


def _time_interleaved(fns: Sequence[Callable[[], object]], *, repeats: int, min_sample_s: float,
                      max_other: float = CONTENTION_LIMIT
                      ) -> tuple[list[list[float]], int, int]:
    """Per-call seconds of each of ``fns``, ``repeats`` samples each, taken in rounds.

    Each sample repeats its call enough times to last ``min_sample_s``; a round takes one sample
    of every call, so slow spells hit every size alike. A round during which other processes
    used more than ``max_other`` of the machine's CPU capacity (read from ``/proc/stat``) is
    discarded and taken again, up to ``2 * repeats`` extra rounds. Returns the samples, the
    number of rounds discarded and the number of contended rounds kept once retries ran out.
    """
    inner = []
    for fn in fns:
        fn()  # warm-up: page faults, caches
        t0 = time.perf_counter()
        fn()
        once = max(time.perf_counter() - t0, 1e-9)
        inner.append(max(1, min(100_000, int(min_sample_s / once))))
    ncpu = os.cpu_count() or 1
    out: list[list[float]] = [[] for _ in fns]
    discarded = kept_contended = 0
    while len(out[0]) < repeats:
        before, w0 = _cpu_seconds(), time.perf_counter()
        sample = []
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(inner[k]):
                fn()
            sample.append((time.perf_counter() - t0) / inner[k])
        after, wall = _cpu_seconds(), time.perf_counter() - w0
        if before is not None and after is not None:
            other = (after[0] - before[0]) - (after[1] - before[1])
            # /proc/stat counts in clock ticks: allow 2 ticks per CPU of rounding
            if other > (max_other * wall + 2.0 / os.sysconf("SC_CLK_TCK")) * ncpu:
                if discarded < 2 * repeats:
                    discarded += 1
                    continue
                kept_contended += 1
        for k, t in enumerate(sample):
            out[k].append(t)
    return out, discarded, kept_contended


def _stats(times: Sequence[float]) -> dict[str, float]:
    med = float(np.median(times))
    return {"median_s": med, "min_s": float(min(times)), "max_s": float(max(times)),
            "spread": float((max(times) - min(times)) / med)}


def _warm_up(seconds: float = 0.5) -> None:
    """Busy the BLAS threads for a while: the first ~0.2 s of a run are slow on this VM."""
    a = np.ones((512, 512), dtype=np.float32)
    c = np.empty_like(a)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.matmul(a, a, out=c)


def _measure_matmul(sizes: Sequence[int], repeats: int, min_sample_s: float,
                    warm_up_s: float = 0.5) -> dict:
    rng = np.random.default_rng(0)
    _warm_up(warm_up_s)
    mats = []
    for n in sizes:
        a = rng.random((n, n), dtype=np.float32)
        b = rng.random((n, n), dtype=np.float32)
        mats.append((a, b, np.empty_like(a)))
    fns = [lambda a=a, b=b, c=c: np.matmul(a, b, out=c) for a, b, c in mats]
    times, discarded, kept = _time_interleaved(fns, repeats=repeats, min_sample_s=min_sample_s)
    return {"rows": [{"n": int(n), "flops": 2.0 * n**3, **_stats(t)}
                     for n, t in zip(sizes, times)],
            "rounds_discarded": discarded, "contended_rounds_kept": kept}


def _measure_matmul_threads(sizes: Sequence[int], repeats: int, min_sample_s: float,
                            threads: int, warm_up_s: float = 0.5) -> dict:
    """Run :func:`_measure_matmul` in a child whose BLAS is limited to ``threads`` threads."""
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    code = ("import json; from planner.measure.compute.cpu import _measure_matmul; "
            f"print(json.dumps(_measure_matmul({list(sizes)!r}, {repeats}, {min_sample_s!r}, "
            f"{warm_up_s!r})))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, check=True, timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SpecError(f"the matmul measurement did not finish in {SUBPROCESS_TIMEOUT_S:g} s",
                        field="--measure-cpu",
                        fix="run it on an idle machine, or with fewer sizes") from None
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or "").strip().splitlines()[-1:] or ["no output"]
        raise SpecError(f"the matmul measurement failed: {tail[0]}", field="--measure-cpu",
                        fix="check that numpy works in this environment") from None
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_memory(array_bytes: Sequence[int], repeats: int, min_sample_s: float) -> dict:
    """Launch overhead (1-element add), adds and copies, timed in the same rounds."""
    arrays = [(np.ones(1, dtype=np.float32), np.ones(1, dtype=np.float32),
               np.empty(1, dtype=np.float32))]
    for nb in array_bytes:
        n = max(1, int(nb) // 4)
        arrays.append((np.ones(n, dtype=np.float32), np.ones(n, dtype=np.float32),
                       np.empty(n, dtype=np.float32)))
    adds = [lambda a=a, b=b, c=c: np.add(a, b, out=c) for a, b, c in arrays]
    copies = [lambda a=a, c=c: np.copyto(c, a) for a, _, c in arrays[1:]]
    times, discarded, kept = _time_interleaved([*adds, *copies], repeats=repeats,
                                               min_sample_s=min_sample_s)
    k = len(arrays)
    add_rows = [{"array_bytes": a.nbytes, "bytes_moved": 3.0 * a.nbytes, **_stats(t)}
                for (a, _, _), t in zip(arrays[1:], times[1:k])]
    copy_rows = [{"array_bytes": a.nbytes, "bytes_moved": 2.0 * a.nbytes, **_stats(t)}
                 for (a, _, _), t in zip(arrays[1:], times[k:])]
    return {"launch": _stats(times[0]), "add": add_rows, "copy": copy_rows,
            "rounds_discarded": discarded, "contended_rounds_kept": kept}


def _machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    blas = "unknown"
    try:
        cfg = np.show_config(mode="dicts")
        info = cfg["Build Dependencies"]["blas"]
        blas = f"{info.get('name')} {info.get('version')}"
    except Exception:  # noqa: BLE001 - numpy < 1.26 or a different layout: leave it unknown
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {"platform": platform.platform(), "machine": platform.machine(), "cpu_model": model,
            "cpu_count": os.cpu_count(), "memory_bytes": mem,
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas}


def measure_cpu_profile(*, sizes: Sequence[int] = DEFAULT_SIZES,
                        array_bytes: Sequence[int] = DEFAULT_ARRAY_BYTES, repeats: int = 5,
                        threads: int | None = None, single_thread: bool = True,
                        min_sample_s: float = 1e-2, statistic: str = "min",
                        warm_up_s: float = 0.5, date: str | None = None) -> dict:
    """Measure fp32 matmul and memory efficiency curves of this CPU.

    Parameters
    ----------
    sizes:
        Matrix orders n of the fp32 n×n matmuls (2·n³ FLOPs each).
    array_bytes:
        Bytes per array of the memory-bound add (3× that is moved per op).
    repeats:
        Timed samples per size; (max − min) / median is reported as their spread.
    statistic:
        ``"min"`` (fastest sample, robust to interference from other tenants) or ``"median"``.
    warm_up_s:
        Seconds of busy matmuls before timing (the first ~0.2 s of a process run slow here).
    threads:
        BLAS threads for the matmuls; None uses the library default (all cores).
    single_thread:
        Also time the largest matmul on one thread (a note, not part of the curve).
    min_sample_s:
        Minimum duration of one timed sample, seconds (short calls are repeated inside it).
    date:
        ISO date recorded as the measurement date; today by default.

    Returns
    -------
    dict
        The efficiency-file mapping (``gpu``, ``source``, ``launch_overhead``, ``matmul``,
        ``memory``, ``measured``, ``notes``) ready for :func:`write_profile`. Rates in it are
        FLOP/s and bytes/s, times in seconds.
    """
    if repeats < 1 or not sizes or not array_bytes:
        raise ValueError("need repeats >= 1 and at least one matmul size and one array size")
    if statistic not in ("min", "median"):
        raise ValueError(f"statistic must be 'min' or 'median', got {statistic!r}")
    key = f"{statistic}_s"
    date = date or datetime.date.today().isoformat()
    started = time.perf_counter()

    mm_run, one_thread = _run_matmuls(sizes, repeats, min_sample_s, threads, single_thread,
                                      warm_up_s)
    mem_run = _measure_memory(array_bytes, repeats, min_sample_s)
    fit = CpuFit(mm_run["rows"], mem_run, key)
    machine = _machine()
    n_threads = "all cores" if threads is None else f"{threads} thread(s)"
    method = (f"numpy fp32 n x n matmul ({n_threads}) for n in {list(sizes)}; numpy fp32 "
              f"add of 3 arrays of {array_bytes[0]}..{array_bytes[-1]} bytes (single "
              f"thread); launch = add on 1-element arrays; {statistic} of {repeats} "
              f"samples of >= {min_sample_s * 1e3:g} ms after a warm-up, taken in rounds "
              f"over all sizes, rounds where other processes used > {CONTENTION_LIMIT:.0%} "
              "of the CPUs retaken; rates net of launch; efficiency = rate / best rate")
    measured = measured_record(fit, mm_run, mem_run, machine, date, method, CONTENTION_LIMIT)
    if one_thread is not None:
        net = max(one_thread[key] - fit.launch_s, 1e-12)
        measured["fp32_flops_1_thread"] = sig(one_thread["flops"] / net)
        measured["fp32_flops_1_thread_at_n"] = one_thread["n"]
    measured["duration_s"] = round(time.perf_counter() - started, 2)
    kept = mm_run["contended_rounds_kept"] + mem_run["contended_rounds_kept"]
    if kept:
        warnings.warn(f"{kept} rounds were timed while other processes kept the CPUs busy; "
                      "the profile understates this machine. Re-run on an idle machine.",
                      RuntimeWarning, stacklevel=2)
    return {
        "gpu": "cpu",
        "source": profile_source(fit, machine, date, statistic, repeats, n_threads),
        "launch_overhead": f"{fit.launch_s * 1e6:.3g} us",
        "matmul": {"fp32": fit.mm_points},
        "memory": fit.mem_points,
        "measured": measured,
        "notes": profile_notes(fit),
    }


def _run_matmuls(sizes: Sequence[int], repeats: int, min_sample_s: float, threads: int | None,
                 single_thread: bool, warm_up_s: float) -> tuple[dict, dict | None]:
    """The matmul timings (on ``threads`` BLAS threads, or the library default), and the
    largest size's row on one thread when ``single_thread`` asks for it (else None)."""
    if threads is None:
        mm_run = _measure_matmul(sizes, repeats, min_sample_s, warm_up_s)
    else:
        mm_run = _measure_matmul_threads(sizes, repeats, min_sample_s, threads, warm_up_s)
    one_thread = None
    if single_thread and threads != 1:
        one_thread = _measure_matmul_threads([max(sizes)], repeats, min_sample_s, 1,
                                             warm_up_s)["rows"][0]
    return mm_run, one_thread


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m planner.measure.compute.cpu [--out PATH] [--repeats N] [--threads N]``."""

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="output file (default traces/efficiency/cpu.yaml)")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--statistic", choices=("min", "median"), default="min")
    args = ap.parse_args(argv)
    prof = measure_cpu_profile(repeats=args.repeats, threads=args.threads,
                               statistic=args.statistic)
    out = args.out or Path(__file__).resolve().parents[3] / "traces" / "efficiency" / "cpu.yaml"
    write_profile(prof, out)
    m = prof["measured"]
    print(f"wrote {out}: peak fp32 {m['peak_fp32_flops'] / 1e9:.1f} GFLOP/s, memory "
          f"{m['memory_bandwidth'] / 1e9:.1f} GB/s (largest array "
          f"{m['memory_bandwidth_largest_array'] / 1e9:.1f} GB/s), launch "
          f"{format_time(m['launch_overhead_s'])}, spread {m['spread_max']:.1%}, "
          f"{m['duration_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
