"""From a CPU measurement's timings to its efficiency file (``traces/efficiency/cpu.yaml``):
the peak rates, launch overhead and efficiency curves (:class:`CpuFit`), the ``measured``,
``source`` and ``notes`` sections that say how and where they were measured, and the YAML
writer (:func:`write_profile`). Timings come from :mod:`planner.measure.compute.cpu`; rates are
FLOP/s and bytes/s, times seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import yaml

from simulator.efficiency import monotone_time_points

__all__ = ["CpuFit", "measured_record", "profile_source", "profile_notes", "write_profile",
           "sig"]


def _curve(rows: Sequence[dict], work_key: str, launch_s: float, key: str
           ) -> tuple[float, list[list[float]], list[list[float]]]:
    """Peak rate (work/s, best achieved net of launch), the curve, and the raw efficiencies.

    The curve is the raw ``[[work, rate / peak], ...]`` with smaller sizes raised where needed so
    that predicted time never falls as the op grows (see ``monotone_time_points``).
    """
    rates = []
    for r in rows:
        net = max(r[key] - launch_s, 0.05 * r[key])
        rates.append(r[work_key] / net)
    peak = max(rates)
    raw = [[float(r[work_key]), max(0.001, round(rate / peak, 3))]
           for r, rate in zip(rows, rates)]
    return peak, monotone_time_points(raw), raw


def sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


class CpuFit:
    """The measured rows (times under ``key``, seconds) turned into the profile's figures:
    launch overhead (s), peak fp32 rate (FLOP/s) and memory bandwidth (bytes/s), both net of
    the launch and the best achieved, their efficiency curves and the sizes reaching them,
    the bandwidth at the largest array, and the samples' spreads ((max − min) / median)."""

    __slots__ = ("mm", "add_rows", "copy_rows", "launch_s", "peak_flops", "mm_points", "peak_bw",
                 "mem_points", "raised", "largest", "dram_bw", "spread_max", "spread_median",
                 "best_n", "best_mem")

    def __init__(self, mm: list[dict], mem_run: dict, key: str) -> None:
        launch, add_rows, copy_rows = mem_run["launch"], mem_run["add"], mem_run["copy"]
        self.mm, self.add_rows, self.copy_rows = mm, add_rows, copy_rows
        launch_s = self.launch_s = launch[key]
        self.peak_flops, self.mm_points, mm_raw = _curve(mm, "flops", launch_s, key)
        self.peak_bw, self.mem_points, mem_raw = _curve(add_rows, "bytes_moved", launch_s, key)
        self.raised = [f"matmul fp32 at {s:g} FLOP: {r:g} -> {e:g}"
                       for (s, e), (_, r) in zip(self.mm_points, mm_raw) if e != r]
        self.raised += [f"memory at {s:g} B: {r:g} -> {e:g}"
                        for (s, e), (_, r) in zip(self.mem_points, mem_raw) if e != r]
        largest = self.largest = add_rows[-1]
        self.dram_bw = largest["bytes_moved"] / max(largest[key] - launch_s, 1e-12)
        spreads = [r["spread"] for r in [*mm, *add_rows, launch]]
        self.spread_max, self.spread_median = max(spreads), float(np.median(spreads))
        self.best_n = mm[int(np.argmax([p[1] for p in self.mm_points]))]["n"]
        self.best_mem = add_rows[int(np.argmax([p[1] for p in self.mem_points]))]["array_bytes"]


def measured_record(fit: CpuFit, mm_run: dict, mem_run: dict, machine: dict, date: str,
                    method: str, contention_limit: float) -> dict[str, Any]:
    """The profile's ``measured`` section: how, where and what was measured (rates in FLOP/s
    and bytes/s, times in seconds), rounded to 4 significant digits."""
    return {
        "date": date,
        "tool": "planner/measure/compute/cpu.py (measure_cpu_profile)",
        "machine": machine,
        "method": method,
        "peak_fp32_flops": sig(fit.peak_flops),
        "peak_fp32_at_n": int(fit.best_n),
        "memory_bandwidth": sig(fit.peak_bw),
        "memory_bandwidth_at_array_bytes": int(fit.best_mem),
        "memory_bandwidth_largest_array": sig(fit.dram_bw),
        "launch_overhead_s": sig(fit.launch_s),
        "raised_for_monotone_time": fit.raised,
        "spread_max": round(fit.spread_max, 3),
        "spread_median": round(fit.spread_median, 3),
        "contention_limit": contention_limit,
        "rounds_discarded": {"matmul": mm_run["rounds_discarded"],
                             "memory": mem_run["rounds_discarded"]},
        "contended_rounds_kept": {"matmul": mm_run["contended_rounds_kept"],
                                  "memory": mem_run["contended_rounds_kept"]},
        "matmul_fp32": [{k: (sig(v) if isinstance(v, float) else v) for k, v in r.items()}
                        for r in fit.mm],
        "add": [{k: (sig(v) if isinstance(v, float) else v) for k, v in r.items()}
                for r in fit.add_rows],
        "copy": [{k: (sig(v) if isinstance(v, float) else v) for k, v in r.items()}
                 for r in fit.copy_rows],
    }


def profile_source(fit: CpuFit, machine: dict, date: str, statistic: str, repeats: int,
                    n_threads: str) -> str:
    """The profile's ``source`` line: where and how it was measured, peaks in GFLOP/s, GB/s."""
    largest = fit.largest
    return (f"Measured on this machine ({machine['cpu_model']}, {machine['cpu_count']} cores, "
            f"{machine['platform']}) on {date} by planner/measure/compute/cpu.py: numpy fp32 "
            f"matmul and add, {statistic} of {repeats} timings; peak fp32 "
            f"{fit.peak_flops / 1e9:.1f} GFLOP/s "
            f"(best achieved, n={fit.best_n}, {n_threads}), memory {fit.peak_bw / 1e9:.1f} GB/s "
            f"(best achieved by a single-thread add, {fit.best_mem} B per array; "
            f"{fit.dram_bw / 1e9:.1f} GB/s at {largest['array_bytes']} B per array)")


def profile_notes(fit: CpuFit) -> str:
    """The profile's ``notes``: what its efficiencies are relative to, and the spreads."""
    return ("Efficiencies are relative to the best rate achieved here, so they are <= 1 and the "
            "best size is exactly 1; they are not fractions of a theoretical peak. The memory "
            "peak is reached at in-cache sizes; DRAM-sized arrays get the lower efficiency "
            "listed at the largest sizes. Bytes moved count reads and writes (3 per add), not "
            "write-allocate traffic. Numpy elementwise ops use one core, BLAS matmul all of "
            f"them. Sample-to-sample spread (max-min)/median: median "
            f"{fit.spread_median:.1%}, largest {fit.spread_max:.1%}. "
            "Re-run 'python -m planner.measure.compute.cpu' to refresh.")


class _Dumper(yaml.SafeDumper):
    """Writes [size, efficiency] pairs on one line each."""


def _represent_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    pair = len(data) == 2 and all(isinstance(v, (int, float)) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=pair)


_Dumper.add_representer(list, _represent_list)


def write_profile(profile_dict: Mapping[str, Any], path: str | Path) -> Path:
    """Write a profile mapping (from :func:`measure_cpu_profile`) as an efficiency YAML file."""
    path = Path(path)
    header = ("# Compute-efficiency profile MEASURED by planner/measure/compute/cpu.py; "
              "see 'measured' for method and raw data.\n")
    text = yaml.dump(dict(profile_dict), Dumper=_Dumper, sort_keys=False, width=100,
                     allow_unicode=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header + text, encoding="utf-8")
    return path
