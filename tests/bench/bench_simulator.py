"""Simulator speed benchmark (not part of the default test run).

Run:  python tests/bench/bench_simulator.py [--repeats 3]

Wall time to simulate a 1 GiB ring all-reduce over 8 / 64 / 512 / 4,096 / 16,384 GPUs (h100-ib
sized with --gpus) in both flow modes, a 1,024-rank all-to-all with explicit flows, and a
multi-op workload through the engine; simulated events per second for each. Medians of the
repeats, side by side in one run (the machines are shared and noisy). Targets from the issue:
16,384-GPU all-reduce ≤ 1 s, ≥ 200k events/s. Topology construction is timed separately.

Events are flow-level: each flow's start and its end, plus op starts and ends and phase
boundaries. The network solves all flows active at an instant together (vectorised), so a phase
of 131k flows that finish together costs one rate solve but counts 262k events; in symmetric
mode the flows a class row stands for are counted.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simulator.collectives import simulate_collective
from simulator.engine import simulate
from simulator.topology import load_topology
from simulator.workload_spec import load_workload

GiB = 2**30


def _median(fn, repeats):
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = []
    print(f"{'case':<44}{'mode':<10}{'build s':>9}{'sim s':>9}{'events':>10}{'events/s':>12}"
          f"{'sim time':>12}")
    for n in (8, 64, 512, 4096, 16384):
        t0 = time.perf_counter()
        topo = load_topology("h100-ib", gpus=n)
        build = time.perf_counter() - t0
        for mode in ("explicit", "symmetric"):
            wall, r = _median(lambda: simulate_collective(topo, "allreduce", range(n), GiB,
                                                          algo="ring", mode=mode), args.repeats)
            rows.append((f"ring all-reduce 1 GiB, {n} GPUs", mode, build, wall, r.events, r.time_s))
    topo = load_topology("h100-ib", gpus=1024)
    for mode in ("explicit", "symmetric"):
        wall, r = _median(lambda: simulate_collective(topo, "alltoall", range(1024), GiB,
                                                      mode=mode), args.repeats)
        rows.append(("all-to-all 1 GiB, 1,024 ranks", mode, 0.0, wall, r.events, r.time_s))
    topo = load_topology("h100-ib", gpus=256)
    w = load_workload("dp-step", num_gpus=256)
    wall, r = _median(lambda: simulate(topo, w), args.repeats)
    rows.append((f"dp-step workload, 256 GPUs ({len(w.ops)} ops)", "explicit", 0.0, wall,
                 r.events, r.step_time_s))
    for case, mode, build, wall, ev, sim in rows:
        print(f"{case:<44}{mode:<10}{build:>9.3f}{wall:>9.3f}{ev:>10}{ev / wall:>12,.0f}"
              f"{sim * 1e3:>10.3f}ms")
    big = [r for r in rows if r[0].endswith("16384 GPUs")]
    worst = max(r[3] for r in big)
    rate = min(r[4] / r[3] for r in big)
    print(f"\n16,384-GPU all-reduce: {worst:.3f} s worst mode (target ≤ 1 s: "
          f"{'met' if worst <= 1 else 'MISSED'}); {rate:,.0f} events/s (target ≥ 200,000: "
          f"{'met' if rate >= 2e5 else 'MISSED'})")


if __name__ == "__main__":
    main()
