"""``clusterplan gpus``: the GPU catalog with a source for every number."""

from __future__ import annotations

import argparse

from simulator.hardware import gpu_names, gpu_spec
from simulator.units import format_bytes

from planner.cli.output import emit

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    rows = []
    for n in gpu_names():
        g = gpu_spec(n)
        rows.append({"name": n, "vendor_name": g.vendor_name, "peak_flops": dict(g.peak_flops),
                     "hbm_bytes": g.hbm_bytes, "hbm_bandwidth_Bps": g.hbm_bandwidth_Bps,
                     "nvlink_bandwidth_Bps": g.nvlink_bandwidth_Bps, "sources": dict(g.sources)})
    lines = [f"{'kind':<11}{'bf16 TFLOP/s':>13}{'fp32 TFLOP/s':>13}{'memory':>12}{'HBM GB/s':>10}"
             f"{'NVLink GB/s':>12}"]
    for r in rows:
        pf = r["peak_flops"]
        lines.append(f"{r['name']:<11}{_tflops(pf, 'bf16', 1):>13}{_tflops(pf, 'fp32', 2):>13}"
                     f"{format_bytes(r['hbm_bytes']):>12}"
                     f"{r['hbm_bandwidth_Bps'] / 1e9:>10.0f}{r['nvlink_bandwidth_Bps'] / 1e9:>12.0f}")
    emit(args, {"gpus": rows}, "\n".join(lines))
    return 0


def _tflops(peaks: dict, dtype: str, digits: int) -> str:
    """The peak in TFLOP/s, or "—" where the catalog has none for this dtype."""
    return f"{peaks[dtype] / 1e12:.{digits}f}" if dtype in peaks else "—"
