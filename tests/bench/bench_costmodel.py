"""Benchmark of the learned cost model: weights load time, neuroshard search time per task, and
(with --measure) the measured cost of neuroshard's plans beside TorchRec's own planner,
size_lookup, greedy, and the analytic cost's local search and MIP: mean and median of the
per-task ratios of each neuroshard variant to each baseline (measured on the scaled tasks,
analytic on the full-size ones).

Neuroshard variants: ``neuroshard`` (shipped: grid + beam search, then the local search on the
full learned objective), ``neuroshard_paper`` (grid + beam, as NeuroShard publishes it) and
``neuroshard_tw`` (the table-wise grid search alone).

    python tests/bench/bench_costmodel.py [--tasks 8] [--measure] [--sharding-types LIST] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


#: planner name → (get_planner name, options); torchrec: TorchRec's own planner; mip and
#: local_search: on the analytic cost model
PLANNERS = {"neuroshard": ("neuroshard", {}),
            "neuroshard_paper": ("neuroshard", {"refine": False}),
            "neuroshard_tw": ("neuroshard", {"beam": 0, "refine": False}),
            "torchrec": ("torchrec", {}), "size_lookup": ("size_lookup", {}),
            "greedy": ("greedy", {}), "local_search": ("local_search", {}),
            "mip": ("mip", {})}
LEARNED = ("neuroshard", "neuroshard_paper", "neuroshard_tw")
BASELINES = ("torchrec", "size_lookup", "greedy", "local_search", "mip")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--measure", action="store_true", help="also measure the plans (slow)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sharding-types", default=None, metavar="LIST",
                    help="comma-separated types every planner may use (default: the tasks' "
                         "table_wise,column_wise, NeuroShard's action space)")
    ap.add_argument("--out")
    a = ap.parse_args()
    types = None
    if a.sharding_types:
        from planner.model.tables.shards import ShardingType
        try:
            types = tuple(ShardingType(t.strip()) for t in a.sharding_types.split(","))
        except ValueError as exc:
            ap.error(f"--sharding-types: {exc}")
    import torch  # noqa: F401  (import time is not the loader's)
    warnings.simplefilter("ignore")
    from planner.costmodel.weights import load_predictor
    loads = []
    for _ in range(5):
        t = time.perf_counter()
        load_predictor()
        loads.append(time.perf_counter() - t)
    from planner.costmodel.planner import learned_plan_cost_ms
    from planner.measure.tables.plans import cpu_topology_ref, measure_many, scale_model
    from planner.model.tables.generate import neuroshard_tasks
    from planner.model.tables.task import prepare
    from planner.sharding.planners import get_planner
    predictor = load_predictor(check_hardware=False)
    rows = []
    for i, bt in enumerate(neuroshard_tasks(a.seed, a.tasks)):
        for scaled in (True, False):
            model = scale_model(bt.model, 1 / 16) if scaled else bt.model
            extra = {} if types is None else {"sharding_types": types}
            task = bt.task(model=model, memory_bytes=bt.memory_bytes // (16 if scaled else 1),
                           **extra,
                           topology=cpu_topology_ref(4))
            prepare(task, 4)           # the shared problem set-up is not the search's time
            plans = {}
            for name in PLANNERS:
                t = time.perf_counter()
                planner = get_planner(PLANNERS[name][0], **PLANNERS[name][1])
                try:
                    plans[name] = planner.plan(task, 4, seed=0)
                except Exception as exc:          # e.g. TorchRec finds no plan: a result
                    print(f"task {i} {name}: {type(exc).__name__}: {str(exc)[:120]}",
                          file=sys.stderr)
                    continue
                wall = time.perf_counter() - t
                rows.append({"task": i, "tables": model.num_tables, "scaled": scaled,
                             "planner": name, "wall_s": wall, "valid": plans[name].valid,
                             "analytic_max_ms": plans[name].max_cost_s * 1e3,
                             "learned_max_ms": learned_plan_cost_ms(
                                 task, 4, plans[name].shardings, predictor=predictor)})
            if scaled and a.measure:
                ms = measure_many(prepare(task, 4), [p.shardings for p in plans.values()],
                                  repeats=a.repeats)
                for name, m in zip(plans, ms):
                    for r in rows:
                        if r["task"] == i and r["scaled"] and r["planner"] == name:
                            r["measured_max_ms"] = m.max_s * 1e3
    summary = {"weights_load_s": {"median": statistics.median(loads), "max": max(loads)}}
    for name in LEARNED:
        ns = [r["wall_s"] for r in rows if r["planner"] == name]
        summary[f"{name}_search_s"] = {"median": statistics.median(ns), "max": max(ns)}
    pairs = [(n, b) for n in LEARNED for b in BASELINES] + [
        ("neuroshard", "neuroshard_paper"), ("mip", "torchrec"), ("local_search", "torchrec")]
    for scaled in (True, False):
        for name, base_name in pairs:
            ratios = []
            for r in rows:
                if r["planner"] != name or r["scaled"] != scaled or not r["valid"]:
                    continue
                base = next((b for b in rows if b["planner"] == base_name and b["valid"]
                             and b["task"] == r["task"] and b["scaled"] == scaled), None)
                if base is None:
                    continue
                key = "measured_max_ms" if "measured_max_ms" in r else "analytic_max_ms"
                if key in base:
                    ratios.append(r[key] / base[key])
            if ratios:
                summary[f"{name}_vs_{base_name}_{'scaled' if scaled else 'full'}"] = {
                    "mean": round(statistics.mean(ratios), 4),
                    "median": round(statistics.median(ratios), 4),
                    "wins": sum(x < 1 for x in ratios), "tasks": len(ratios)}
    # plan rankings: per measured task, Kendall's tau of the learned and of the analytic cost
    # against the measured one, over the plans the learned model can cost (TW/CW only)
    from scipy.stats import kendalltau
    taus: dict[str, list] = {"learned": [], "analytic": []}
    for i in sorted({r["task"] for r in rows}):
        got = [r for r in rows if r["task"] == i and r["scaled"] and r["valid"]
               and "measured_max_ms" in r and r.get("learned_max_ms") is not None]
        if len(got) < 3:
            continue
        meas = [r["measured_max_ms"] for r in got]
        for key in taus:
            taus[key].append(float(kendalltau([r[f"{key}_max_ms"] for r in got],
                                              meas).statistic))
    for key, v in taus.items():
        v = [x for x in v if x == x]
        if v:
            summary[f"plan_ranking_tau_{key}_vs_measured"] = {
                "mean": round(statistics.mean(v), 3), "median": round(statistics.median(v), 3),
                "tasks": len(v)}
    print(json.dumps(summary, indent=1))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "rows.json").write_text(json.dumps(rows, indent=1))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
