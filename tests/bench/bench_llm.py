"""LLM step-simulation speed (not part of the default test run).

Run:  python tests/bench/bench_llm.py [--repeats 3]

Wall time to simulate one training step of Llama-3 405B (seq 8,192, global batch 2,048
sequences, TP8 PP16 DP128 = 16,384 GPUs of ``llama3-h100-24k``) including the workload build,
and of GPT-3 175B on 512 A100 (TP8 PP8 DP8); medians of the repeats. Then a planner sweep for
Llama-3 70B on 1,024 H100 (``h100-ib``): layouts enumerated, estimated and simulated, and its
wall time. Last, the scale-across sweep: Llama-3 8B on two buildings of 64 H100, inter-building
bandwidth × latency, the axis the planner lets cross and its gain over "DP across buildings,
1F1B". Targets: 405B ≤ 5 s; a sweep of ≥ 500 configurations ≤ 60 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from simulator.topology import load_topology

from planner.llm.metrics import simulate_llm
from planner.model.llm.spec import load_llm_spec, parse_parallel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cases = [("llama3-405b", "llama3-h100-24k", 16384, "tp=8,cp=1,pp=16,dp=128,vpp=1"),
             ("gpt3-175b", "selene-a100", 512, "tp=8,pp=8,dp=8")]
    print(f"{'model':<14}{'topology':<18}{'GPUs':>7}{'wall s (median)':>17}{'events':>9}"
          f"{'step s':>9}{'MFU':>7}")
    for model, topo_name, gpus, par in cases:
        topo = load_topology(topo_name, gpus=gpus)
        spec = load_llm_spec(model)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = simulate_llm(spec, parse_parallel(par, spec.parallel), topo)
            walls.append(time.perf_counter() - t0)
        d = res.to_dict()
        print(f"{model:<14}{topo_name:<18}{gpus:>7}{statistics.median(walls):>17.2f}"
              f"{res.sim.events:>9}{d['step_time_s']:>9.2f}{d['mfu']:>7.1%}")
    from planner.llm.search import search
    t0 = time.perf_counter()
    results, stats = search(load_llm_spec("llama3-70b"), load_topology("h100-ib", gpus=1024))
    wall = time.perf_counter() - t0
    print(f"\nplanner sweep llama3-70b on 1,024 GPUs: {stats['enumerated']} layouts enumerated, "
          f"{stats['out_of_memory']} out of memory, {stats['estimated']} estimated, "
          f"{stats['simulated']} simulated, {wall:.1f} s wall (target ≥ 500 in ≤ 60 s: "
          f"{'met' if stats['estimated'] >= 500 and wall <= 60 else 'MISSED'})")

    print("\nscale-across: llama3-8b on 2 buildings × 64 H100, inter-building 400 Gb/s links")
    print(f"{'links':>6}{'Tb/s':>7}{'latency':>9}{'crosses':>9}{'step s':>9}{'baseline s':>12}"
          f"{'gain':>8}")
    for links in (1, 4, 16, 64):
        for lat in ("0.1ms", "1ms", "5ms"):
            topo = load_topology(f"two-buildings-h100:nodes=8,buildings.links={links},"
                                 f"buildings.link_bandwidth=400Gb/s,buildings.latency={lat}")
            _, st = search(load_llm_spec("llama3-8b"), topo, top=1)
            sa = st["scale_across"]
            print(f"{links:>6}{links * 0.4:>7.1f}{lat:>9}{'+'.join(sa['crossing_axes']):>9}"
                  f"{sa['step_time_s']:>9.3f}{sa['baseline_step_time_s']:>12.3f}{sa['gain']:>8.1%}")


if __name__ == "__main__":
    main()
