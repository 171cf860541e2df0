"""Sharding-planner benchmark (not part of the default test run).

Run:  python tests/bench/bench_sharding.py [--tasks 30] [--mip-limit 3] [--seed 0]

1. Plan time for 60 tables × 8 devices (NeuroShard-shaped tables, 8 × 4 GiB): greedy cold
   (topology load and collective calibration included) and warm, and the MIP at its default
   time limit. Targets from the issue: greedy ≤ 2 s, MIP ≤ 30 s; the MIP must stay within 110%
   of its limit and report its gap.
2. Planner comparison on ``--tasks`` NeuroShard-shaped tasks (4 devices × 4 GiB, table- and
   column-wise; T ~ U{10..59}): mean analytic step cost (each phase's slowest rank, summed)
   per planner, its ratio to size-lookup greedy, valid plans, mean plan time, and the MIP's
   mean gap and status counts (MIP at ``--mip-limit`` seconds per task).
"""

from __future__ import annotations

import argparse
import statistics
import time

from planner.model.tables.generate import neuroshard_tasks
from planner.model.tables.task import prepare
from planner.sharding.planners import get_planner


def plan_time_60x8(seed: int) -> None:
    bt = neuroshard_tasks(seed + 100, 1, devices=8, table_range=(60, 60))[0]
    task = bt.task(sharding_types=None)
    print(f"60 tables × 8 devices ({bt.model.total_weight_bytes / 2**30:.1f} GiB fp32, "
          f"8 × 4 GiB; all sharding types allowed)")
    t0 = time.perf_counter()
    g = get_planner("greedy").plan(task, 8, seed=seed)
    cold = time.perf_counter() - t0
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        g = get_planner("greedy").plan(task, 8, seed=seed)
        walls.append(time.perf_counter() - t0)
    warm = statistics.median(walls)
    print(f"  greedy        cold {cold:7.3f} s   warm {warm:7.3f} s   step cost "
          f"{g.step_cost_s * 1e3:.4f} ms   (target ≤ 2 s: {'met' if cold <= 2 else 'MISSED'})")
    t0 = time.perf_counter()
    ls = get_planner("local_search").plan(task, 8, seed=seed)
    print(f"  local_search  {time.perf_counter() - t0:7.3f} s   step cost "
          f"{ls.step_cost_s * 1e3:.4f} ms   ({ls.step_cost_s / g.step_cost_s:.4f} × greedy)")
    mip = get_planner("mip")
    limit = mip.default_time_limit_s
    t0 = time.perf_counter()
    m = mip.plan(task, 8, seed=seed)
    wall = time.perf_counter() - t0
    st = m.stats
    print(f"  mip           {wall:7.3f} s   step cost {m.step_cost_s * 1e3:.4f} ms   "
          f"({m.step_cost_s / g.step_cost_s:.4f} × greedy)   status {st.status}, gap "
          f"{100 * (st.gap or 0):.2f}%, limit {limit:g} s → {wall / limit:.0%} of it "
          f"(≤ 110%: {'met' if wall <= 1.1 * limit else 'MISSED'}; ≤ 30 s: "
          f"{'met' if wall <= 30 else 'MISSED'})   types {m.type_counts()}")
    print(f"  mip timings   {dict(st.timings_s)}")


def compare(n_tasks: int, mip_limit: float, seed: int) -> None:
    names = ["random", "size", "dim", "lookup", "size_lookup", "greedy", "local_search", "mip"]
    tasks = neuroshard_tasks(seed, n_tasks)
    cost = {n: [] for n in names}
    valid = {n: 0 for n in names}
    wall = {n: [] for n in names}
    gaps, status = [], {}
    for bt in tasks:
        task = bt.task()
        prepare(task, bt.devices)
        for n in names:
            t0 = time.perf_counter()
            p = get_planner(n).plan(task, bt.devices, seed=seed,
                                    time_limit_s=mip_limit if n == "mip" else None)
            wall[n].append(time.perf_counter() - t0)
            cost[n].append(p.step_cost_s)
            valid[n] += p.valid
            if n == "mip":
                gaps.append(p.stats.gap or 0.0)
                status[p.stats.status] = status.get(p.stats.status, 0) + 1
    base = statistics.fmean(cost["size_lookup"])
    print(f"\n{n_tasks} NeuroShard-shaped tasks (seed {seed}; 4 × 4 GiB; TW + CW; "
          f"{min(bt.model.num_tables for bt in tasks)}–"
          f"{max(bt.model.num_tables for bt in tasks)} tables), analytic step cost (each "
          "phase's slowest rank, summed):")
    print(f"  {'planner':<14}{'mean ms':>10}{'÷ size_lookup':>15}{'per-task ratio':>16}"
          f"{'valid':>8}{'mean s':>9}")
    for n in names:
        ratios = [a / b for a, b in zip(cost[n], cost["size_lookup"])]
        print(f"  {n:<14}{statistics.fmean(cost[n]) * 1e3:>10.4f}"
              f"{statistics.fmean(cost[n]) / base:>15.4f}{statistics.fmean(ratios):>16.4f}"
              f"{valid[n]:>5}/{n_tasks:<3}{statistics.fmean(wall[n]):>8.3f}")
    print(f"  mip: limit {mip_limit:g} s, gap mean {100 * statistics.fmean(gaps):.2f}% "
          f"max {100 * max(gaps):.2f}%, status {status}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--mip-limit", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    plan_time_60x8(args.seed)
    compare(args.tasks, args.mip_limit, args.seed)


if __name__ == "__main__":
    main()
