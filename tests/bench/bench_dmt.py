"""DMT benchmark: simulated DMT-vs-flat speedup over 8–512 GPUs, and the Tower Partitioner.

Run:  python tests/bench/bench_dmt.py [--sizes 8,16,...] [--topologies selene-a100,h100-ib]
                                       [--small-topologies dgx-a100,dgx-h100] [--out FILE.json]

Task ("dmt-bench", seeded): 512 synthetic tables calibrated to dlrm_datasets
(:func:`planner.model.tables.generate.synthesize_tables`, seed 1, dim 64, pooling log-sd 0.5, rows
capped at 2M), a DCNv2 dense part (bottom 512-256-64, 2 low-rank cross layers of rank 128 on
the concatenation, top 512-256-1, bf16), SGD, fp32 pooled embeddings, 512 samples per GPU (weak
scaling: global batch 512·N).

For every topology and size: the flat plan (greedy over all N GPUs, any sharding type) and its
simulated step; towers = one per host (Tower Partitioner: affinity, ε = 5%); each host's tables
sharded by the same planner inside the host; the SPTT step simulated with identity modules
(SPTT alone) and with feature-mixing modules at c = 4 and c = 16 (``mix``: a tower's F vectors
mixed into F/c). The simulator runs ``explicit`` up to
64 GPUs and ``symmetric`` above (both steps of a row in the same mode).

1. Speedup table: flat step, the flat all-to-all's share of it, DMT steps and speedups, cross-host
   bytes flat → DMT (c = 4), tower-cost imbalance and affinity kept of the partition.
2. Partitioner comparison on the 64-GPU H100 row (8 towers): random, cost-balanced (LPT) and
   affinity: imbalance, affinity kept and the simulated DMT step (c = 4) of each.
3. Latency sensitivity (``--pairwise-sizes``): the simulator's all-to-all sends all pairs at once
   and pays one latency per collective; run instead as ``p − 1`` pairwise rounds it pays
   ``(p − 1)·α``, the per-peer term of the volume model (papers.md §3.3). Both steps of a row
   use the same algorithm; the truth for NCCL lies between the two.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.dmt.partition import partition_layout  # noqa: E402
from planner.dmt.towers import shard_hosts  # noqa: E402
from planner.model.dmt.layout import with_module  # noqa: E402
from planner.model.dmt.module import TowerModuleSpec  # noqa: E402
from planner.model.tables.generate import synthesize_tables  # noqa: E402
from planner.model.tables.spec import DenseSpec, ModelSpec  # noqa: E402
from planner.model.tables.task import ShardingTask, prepare  # noqa: E402
from planner.sharding.planners import get_planner  # noqa: E402
from planner.workloads.dlrm.step import build_step_workload, simulate_step  # noqa: E402
from planner.workloads.dmt.step import cross_host_bytes, simulate_flat, simulate_sptt  # noqa: E402

LOCAL_BATCH = 512
MODULES = {"sptt": TowerModuleSpec(), "c4": TowerModuleSpec(kind="mix", ratio=4),
           "c16": TowerModuleSpec(kind="mix", ratio=16)}


def bench_model(n: int) -> ModelSpec:
    tabs = synthesize_tables(512, seed=1, dim=64, pooling_sigma=0.5)
    tabs = tuple(replace(t, num_embeddings=min(t.num_embeddings, 2_000_000)) for t in tabs)
    dense = DenseSpec(num_dense_features=13, bottom_mlp=(512, 256, 64), top_mlp=(512, 256, 1),
                      interaction="dcnv2", dcn_layers=2, dcn_projection=128, dtype="bf16")
    return ModelSpec(name="dmt-bench", tables=tabs, dense=dense, batch_size=LOCAL_BATCH * n,
                     optimizer="sgd", source="tests/bench/bench_dmt.py")


def run_row(topo: str, n: int, *, seed: int = 0, partitioner: str = "affinity") -> dict:
    ref = f"{topo}:nodes={max(1, n // 8)}"
    task = ShardingTask(model=bench_model(n), topology=ref)
    mode = "explicit" if n <= 64 else "symmetric"
    t0 = time.perf_counter()
    problem = prepare(task, n)
    flat_plan = get_planner("greedy").plan(task, n, seed=seed)
    flat = simulate_step(problem, flat_plan.shardings, mode=mode)
    _, mats = build_step_workload(problem, flat_plan.shardings)
    part = partition_layout(task, n, method=partitioner, seed=seed)
    hps = shard_hosts(task, part.layout, seed=seed)
    row = {"topology": ref, "gpus": n, "hosts": part.layout.hosts,
           "towers": len(part.layout.towers), "mode": mode,
           "flat_step_s": flat.step_time_s, "flat_a2a_s": flat.breakdown_s["a2a"],
           "flat_a2a_share": flat.breakdown_s["a2a"] / flat.step_time_s,
           "flat_cross_host_bytes": cross_host_bytes(problem, mats),
           "imbalance": part.imbalance, "affinity_kept": part.affinity_kept,
           "partition_notes": {k: v for k, v in part.notes.items() if k != "wall_s"}}
    for key, mod in MODULES.items():
        step = simulate_sptt(task, n, with_module(part.layout, mod), hps, mode=mode)
        row[f"{key}_step_s"] = step.step_time_s
        row[f"{key}_speedup"] = flat.step_time_s / step.step_time_s
        row[f"{key}_cross_host_bytes"] = step.bytes["cross_host"]
        row[f"{key}_breakdown_s"] = step.breakdown_s
    row["flat_breakdown_s"] = flat.breakdown_s
    row["wall_s"] = time.perf_counter() - t0
    return row


def partitioner_rows(topo: str, n: int, seed: int = 0) -> list[dict]:
    ref = f"{topo}:nodes={max(1, n // 8)}"
    task = ShardingTask(model=bench_model(n), topology=ref)
    mode = "explicit" if n <= 64 else "symmetric"
    problem = prepare(task, n)
    flat_plan = get_planner("greedy").plan(task, n, seed=seed)
    flat = simulate_step(problem, flat_plan.shardings, mode=mode)
    from planner.dmt.partition import affinity_kept, affinity_matrix, synthetic_coaccess
    a = affinity_matrix(synthetic_coaccess(task.model, seed=seed))
    out = []
    for method in ("random", "balanced", "affinity"):
        part = partition_layout(task, n, method=method, seed=seed,
                                module=MODULES["c4"])
        hps = shard_hosts(task, part.layout, seed=seed)
        step = simulate_sptt(task, n, part.layout, hps, mode=mode)
        out.append({"method": method, "imbalance": part.imbalance,
                    "affinity_kept": affinity_kept(a, part.labels),
                    "dmt_step_s": step.step_time_s,
                    "speedup": flat.step_time_s / step.step_time_s})
    return out


def pairwise_row(topo: str, n: int, seed: int = 0) -> dict:
    ref = f"{topo}:nodes={max(1, n // 8)}"
    task = ShardingTask(model=bench_model(n), topology=ref)
    mode = "explicit" if n <= 64 else "symmetric"
    problem = prepare(task, n)
    flat_plan = get_planner("greedy").plan(task, n, seed=seed)
    part = partition_layout(task, n, seed=seed)
    hps = shard_hosts(task, part.layout, seed=seed)
    row = {"topology": ref, "gpus": n}
    for algo in ("direct", "pairwise"):
        flat = simulate_flat(problem, flat_plan.shardings, mode=mode, a2a_algo=algo)
        row[f"{algo}_flat_s"] = flat.step_time_s
        for key in ("sptt", "c4"):
            st = simulate_sptt(task, n, with_module(part.layout, MODULES[key]), hps, mode=mode,
                               a2a_algo=algo)
            row[f"{algo}_{key}_speedup"] = flat.step_time_s / st.step_time_s
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,16,32,64,128,256,512")
    ap.add_argument("--topologies", default="selene-a100,h100-ib")
    ap.add_argument("--small-topologies", default="dgx-a100,dgx-h100",
                    help="run only for sizes ≤ 64")
    ap.add_argument("--pairwise-sizes", default="16,64,256",
                    help="sizes of the latency-sensitivity table ('' to skip)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write all rows as JSON here")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    jobs = [(t, n) for t in args.small_topologies.split(",") if t for n in sizes if n <= 64]
    jobs += [(t, n) for t in args.topologies.split(",") if t for n in sizes]
    print(f"dmt-bench: 512 tables (dim 64), DCNv2 dense part, {LOCAL_BATCH} samples/GPU; "
          "flat = greedy plan; DMT = one tower per host (affinity partitioner, ε 5%)")
    hdr = (f"{'topology':<22} {'GPUs':>5} {'towers':>6} {'flat ms':>8} {'a2a %':>6} "
           f"{'SPTT ms':>8} {'×':>5} {'c=4 ms':>8} {'×':>5} {'c=16 ms':>8} {'×':>5} "
           f"{'xhost GB':>13} {'imbal':>6} {'aff':>5} {'wall s':>6}")
    print(hdr)
    rows = []
    for topo, n in jobs:
        r = run_row(topo, n, seed=args.seed)
        rows.append(r)
        print(f"{r['topology']:<22} {n:>5} {r['towers']:>6} {1e3 * r['flat_step_s']:>8.2f} "
              f"{100 * r['flat_a2a_share']:>5.1f}% {1e3 * r['sptt_step_s']:>8.2f} "
              f"{r['sptt_speedup']:>5.2f} {1e3 * r['c4_step_s']:>8.2f} {r['c4_speedup']:>5.2f} "
              f"{1e3 * r['c16_step_s']:>8.2f} {r['c16_speedup']:>5.2f} "
              f"{r['flat_cross_host_bytes'] / 1e9:>6.2f}→{r['c4_cross_host_bytes'] / 1e9:<6.2f} "
              f"{r['imbalance']:>6.3f} {r['affinity_kept']:>5.2f} {r['wall_s']:>6.0f}",
              flush=True)
    imb = [r["imbalance"] for r in rows if r["towers"] > 1]
    if imb:
        print(f"partitioner imbalance (max/mean - 1) over {len(imb)} multi-tower rows: max "
              f"{max(imb):.4f}, mean {sum(imb) / len(imb):.4f} (target ≤ 0.05)")
    best = max(rows, key=lambda r: r["c4_speedup"]) if rows else None
    if best:
        print(f"best c=4 speedup {best['c4_speedup']:.2f}× ({best['topology']}, {best['gpus']} "
              "GPUs); "
              f"SPTT alone up to {max(r['sptt_speedup'] for r in rows):.2f}×; paper: up to "
              "1.9×")
    prow = []
    if "h100-ib" in args.topologies.split(",") and 64 in sizes:
        print("\npartitioners on h100-ib, 64 GPUs (8 towers), module c=4:")
        print(f"{'method':<10} {'imbalance':>9} {'affinity kept':>13} {'DMT ms':>8} {'×':>5}")
        prow = partitioner_rows("h100-ib", 64, seed=args.seed)
        for p in prow:
            print(f"{p['method']:<10} {p['imbalance']:>9.3f} {p['affinity_kept']:>13.3f} "
                  f"{1e3 * p['dmt_step_s']:>8.2f} {p['speedup']:>5.2f}")
    pw = []
    psizes = [int(x) for x in args.pairwise_sizes.split(",") if x]
    if psizes:
        print("\nlatency sensitivity: all-to-alls as one direct exchange (1 latency) vs pairwise "
              "rounds ((p-1) latencies):")
        print(f"{'topology':<22} {'GPUs':>5} {'flat ms':>8} {'SPTT ×':>7} {'c=4 ×':>6}   "
              f"{'flat ms':>8} {'SPTT ×':>7} {'c=4 ×':>6}")
        print(f"{'':<28} {'---------- direct ----------':>23}   "
              f"{'--------- pairwise ---------':>23}")
        for topo in args.topologies.split(","):
            for n in psizes:
                r = pairwise_row(topo, n, seed=args.seed)
                pw.append(r)
                print(f"{r['topology']:<22} {n:>5} {1e3 * r['direct_flat_s']:>8.2f} "
                      f"{r['direct_sptt_speedup']:>7.2f} {r['direct_c4_speedup']:>6.2f}   "
                      f"{1e3 * r['pairwise_flat_s']:>8.2f} {r['pairwise_sptt_speedup']:>7.2f} "
                      f"{r['pairwise_c4_speedup']:>6.2f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"rows": rows, "partitioners": prow,
                                              "latency_sensitivity": pw}, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
