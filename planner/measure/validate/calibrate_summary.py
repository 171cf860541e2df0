"""The lines ``clusterplan calibrate gloo`` prints about a profile it measured: latency and
bandwidth per collective, one core's compute, the linear layers by shape, the lookup and
contention probes, the host time per block."""

from __future__ import annotations

from simulator.linear_table import linear_flops
from simulator.units import format_time

from planner.measure.validate.dlrm_probes import predicted_lookup_s

__all__ = ["summary_lines"]


def summary_lines(doc: dict) -> list[str]:
    """A few lines a person reads: latency and bandwidth per kind, compute, noise, load."""
    m, c, n = doc["measured"], doc["compute"], doc["noise"]
    mach = m["machine"]
    lines = [f"gloo on {mach.get('cpu_model', mach['platform'])} ({mach['cpu_count']} cores), "
             f"{m['processes']} processes × 1 thread, {m['rounds']} rounds, {m['wall_s']:.0f} s; "
             f"other processes used {m.get('other_cores', 0):.2f} cores"]
    for key, rows in doc["comm"].items():
        kind = key.split("@")[0]
        small, big = rows[0], rows[-1]
        lines.append(f"  {kind:13s} {format_time(small[1])} at {int(small[0])} B, "
                     f"{big[0] / big[1] / 1e9:.2f} GB/s at {big[0] / 2**20:.0f} MiB "
                     f"(round-to-round spread median {n['comm'][kind]['median']:.0%})")
    wake = doc.get("wake_penalty_s") or []
    if wake:
        lines.append("  after compute: +" + ", +".join(
            f"{format_time(e)} after {format_time(g)}" for g, e in wake))
    lines.append(f"  one core: matmul {c['peak_fp32_flops'] / 1e9:.0f} GFLOP/s peak, memory "
                 f"{c['memory_bandwidth_Bps'] / 1e9:.0f} GB/s peak, dispatch "
                 f"{format_time(c['launch_overhead_s'])} per op (spread {n['matmul']['median']:.0%})")
    lin = (doc.get("linear_layers") or {}).get("points")
    if lin:
        rates = sorted(linear_flops(b, i, o) / s for _, b, i, o, s in lin)
        lines.append(f"  linear layers by shape: {len(lin)} GEMMs, "
                     f"{rates[0] / 1e9:.1f}-{rates[-1] / 1e9:.0f} GFLOP/s (median "
                     f"{rates[len(rates) // 2] / 1e9:.0f})")
    hb = doc["host_block_s"]
    lk = doc.get("lookup")
    if lk:
        lines.append(f"  lookups on every rank at once: {format_time(lk['measured_s'])} for the "
                     f"probe, {lk['measured_s'] / predicted_lookup_s():.2f}x the CPU embedding "
                     "profile's prediction" + _readings(lk))
    ct = doc.get("contention")
    if ct and ct.get("alone_s"):
        lines.append(f"  the probe on one rank alone: {format_time(ct['alone_s'])}; a core alone "
                     f"computes {ct['alone_speedup']:.2f}x as fast as with every rank busy")
    hn = n.get("host", {}).get("swiglu")
    lines.append(f"  host per block: forward {format_time(hb['forward'])}, backward "
                 f"{format_time(hb['backward'])}"
                 + (f" (round-to-round spread {hn['forward']:.0%} / {hn['backward']:.0%})"
                    if hn else ""))
    return lines


def _readings(lk: dict) -> str:
    """How much the probe's readings over the calibration varied (the host's speed), when the
    profile kept them: their range and its width over the mean."""
    xs = lk.get("readings_s") or []
    if len(xs) < 2:
        return ""
    lo, hi = min(xs), max(xs)
    return (f" (mean of {len(xs)} readings, {format_time(lo)}-{format_time(hi)}: the host's "
            f"speed varied {(hi - lo) / lk['measured_s']:.0%} during the calibration)")
