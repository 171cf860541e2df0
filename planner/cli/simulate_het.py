"""``clusterplan simulate HET.yaml``: parameter-server training with per-worker embedding caches
(``kind: het``, planner/workloads/het.py) on a topology."""

from __future__ import annotations

from simulator.units import format_bytes, format_time

from planner.workloads.het import load_het_spec, run_het

__all__ = ["simulate_het"]


def simulate_het(args, topo, emit) -> int:
    """Run the caches and every iteration's step; print the summary (``--json``: one object)."""
    spec = load_het_spec(args.workload)
    out = run_het(spec, topo)
    d = out["summary"] | {"topology": topo.name}
    if args.trace:
        out["last"].write_chrome_trace(args.trace, max_ranks=args.trace_ranks)
        d["trace"] = args.trace
    servers = ", ".join(format_bytes(b) for b in d["server_bytes_per_iteration"])
    lines = [f"HET on {topo.name}: {spec.workers} workers, {spec.servers} servers, "
             f"{spec.rows:,} rows of dim {spec.dim}, access {spec.access} (zipf {spec.zipf:g}), "
             f"cache {spec.cache_ratio:.1%} {spec.policy}, staleness pull {spec.pull_bound} / "
             f"push {spec.push_bound}",
             f"  hit rate {d['hit_rate']:.1%} (stale refreshes {d['stale_refresh_rate']:.1%} of "
             f"pulls); per iteration pulled {format_bytes(d['pulled_bytes_per_iteration'])}, "
             f"pushed {format_bytes(d['pushed_bytes_per_iteration'])}; per server {servers}",
             f"  step time mean {format_time(d['step_time_mean_s'])}, max "
             f"{format_time(d['step_time_max_s'])} over {spec.iterations} iterations, "
             f"{d['samples_per_s']:,.0f} samples/s",
             f"  steady state (iterations {d['steady']['iterations']}): hit rate "
             f"{d['steady']['hit_rate']:.1%}, pulled "
             f"{format_bytes(d['steady']['pulled_bytes_per_iteration'])}, pushed "
             f"{format_bytes(d['steady']['pushed_bytes_per_iteration'])} per iteration, step "
             f"{format_time(d['steady']['step_time_mean_s'])}"]
    emit(args, d, "\n".join(lines))
    return 0
