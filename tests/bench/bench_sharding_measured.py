"""Measured sharding benchmark: every planner's plan run for real, TorchRec's planner as baseline.

Run (not part of the default test run; needs ``make setup-torchrec``)::

    python tests/bench/bench_sharding_measured.py --out bench-out/        # 32 tasks, ~6 min
    python tests/bench/bench_sharding_measured.py --quick --out /tmp/q     # 4 tasks, ~1 min
    python tests/bench/bench_sharding_measured.py --families any --tasks 24 --out DIR # ~8 min

Tasks: ``--tasks`` seeded synthetic tasks (half on 4 devices, half on 8), alternating the
``--families``: the NeuroShard shape (``neuroshard``: ``neuroshard_tasks``, 10–59 tables, dims
4–128, table- and column-wise allowed, 4 GiB per device), the DreamShard shape (``dreamshard``:
``dreamshard_tasks``, 40 tables, dim 16, fp16, table-wise only, 5 GiB per device) — the default
pair — and ``any``: the NeuroShard family's tables with every sharding type allowed, as a
TorchRec user leaves its planner and as ``bench_vs_torchrec.py`` plans (task i of ``any`` has
the tables of task i of ``neuroshard``). All scaled by ``--scale`` (default 1/16: rows, global
batch and memory per device shrink alike, so lookups, distinct rows and memory keep their
ratios; batch 65,536 → 4,096) to fit this machine and measure in seconds. Every task targets
this machine (``localhost-gloo`` with N processes), so every planner plans with the calibrated
CPU profile and TorchRec plans for ``compute_device="cpu"`` with the same memory cap.

Planners: ``torchrec`` (TorchRec 1.8.0's EmbeddingShardingPlanner), ``size_lookup`` (NeuroShard's
strongest greedy baseline), ``greedy``, ``local_search`` and ``mip`` (``--mip-limit`` seconds);
``lowest`` is, per task, the one of our three plans with the lowest *predicted* step cost;
``best`` is what ``--planner best`` returns (:mod:`planner.sharding.best`): ``lowest``, unless
it beats TorchRec's plan with probability below 0.9 under the lookup fit's own error, and then
TorchRec's plan (both chosen before anything is measured, as a user would pick; ``chosen``
in the CSV names the plan). Each valid plan of a task is MEASURED
(``planner.measure.tables.plans``: fused FBGEMM TBE forward + backward per rank on one thread,
data-parallel replicas in FBGEMM's dense TBE as TorchRec runs them, median of ``--repeats``;
the all-to-alls with gloo across N processes, median of ``--comm-repeats``; identical plans
measured once; every process with the ``--heap`` policy, ``retain`` by default as in
``validate``); cost = the step cost,
each phase's slowest rank summed (lookups forward, backward, each collective: the ranks wait
for each other at every collective; the slowest rank's own sum is in the CSV as
``measured_max_s``). TorchRec's plan is measured a second time in the same paired run as
``torchrec_again``: its ratio to ``torchrec`` is the noise floor of a per-task ratio. Prints per
planner: mean measured step cost over the tasks where it is valid, the mean of its per-task
ratio to TorchRec's plan and to size-lookup's (on the tasks both are valid), the median ratio,
``valid x/N`` (invalid plans are counted, never averaged), the tasks it beats TorchRec's plan
on and its worst ratio to it, ``sure -/+``: the tasks where the paired-bootstrap 95% interval
of that ratio (:mod:`planner.measure.tables.paired`; ``ratio_lo``/``ratio_hi`` in the CSV) lies
wholly below / above 1, the prediction error of the step cost, and the mean plan time; then
the same split by device count and by family. The noise row's intervals check the method:
TorchRec's plan against itself should exclude 1 on about 5% of tasks. ``--out DIR`` writes
``results.csv`` (one row per task × planner) and ``summary.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from planner.measure.heap import DEFAULT_HEAP, HEAP_HELP, HEAP_POLICIES  # noqa: E402
from planner.measure.tables.paired import step_ratio_interval  # noqa: E402
from planner.measure.tables.plans import cpu_topology_ref, measure_many, scale_model  # noqa: E402
from planner.model.tables.generate import dreamshard_tasks, neuroshard_tasks  # noqa: E402
from planner.model.tables.ids import model_ids  # noqa: E402
from planner.model.tables.task import prepare  # noqa: E402
from planner.sharding.best import lowest, pick_plan  # noqa: E402
from planner.sharding.planners import BEST_CANDIDATES, get_planner  # noqa: E402
from sharding_summary import NOISE, print_summary, summarise  # noqa: E402  (beside this file)

PLANNERS = ("torchrec", "size_lookup", "greedy", "local_search", "mip")
#: our planners; ``lowest`` is the one of their plans with the lowest predicted step cost
OURS = BEST_CANDIDATES
LOWEST = "lowest"
#: ``lowest``, or TorchRec's plan when the model is not sure ``lowest`` beats it
BEST = "best"
FAMILIES = ("neuroshard", "dreamshard", "any")
GiB = 1024 ** 3


def _family_tasks(family: str, seed: int, n: int, devices: int) -> list:
    """``n`` generated :class:`~planner.model.tables.generate.BenchmarkTask` of ``family``."""
    if family == "dreamshard":
        return dreamshard_tasks(seed, n, num_tables=40, devices=devices, memory_bytes=5 * GiB)
    tasks = neuroshard_tasks(seed, n, devices=devices, memory_bytes=4 * GiB)
    if family == "any":
        # the same tables as the neuroshard family, every sharding type allowed
        tasks = [replace(bt, sharding_types=None) for bt in tasks]
    return tasks


def make_tasks(n: int, seed: int, scale: float,
               families: Sequence[str] = ("neuroshard", "dreamshard")) -> list[dict]:
    """``n`` scaled tasks: half on 4 devices, half on 8; ``families`` alternating within each
    half (task i of a family has the same tables whatever the other families)."""
    out = []
    per = {4: n // 2 + n % 2, 8: n // 2}
    for devices, count in per.items():
        made = {f: _family_tasks(f, seed * 1000 + devices,
                                 len(range(i, count, len(families))), devices)
                for i, f in enumerate(families)}
        for k in range(count):
            family = families[k % len(families)]
            bt = made[family][k // len(families)]
            suffix = "-any" if family == "any" else ""
            model = scale_model(bt.model, scale, name=bt.model.name + f"{suffix}-x{scale:g}")
            task = bt.task(model=model, memory_bytes=int(bt.memory_bytes * scale),
                           topology=cpu_topology_ref(devices))
            out.append({"name": model.name, "family": family, "devices": devices,
                        "task": task, "tables": model.num_tables,
                        "weight_bytes": model.total_weight_bytes, "batch": model.batch_size})
    return out


def _plan_row(info: dict, name: str, plan, err: str, plan_s: float) -> dict:
    """The CSV row of one planner's plan of a task (measured columns filled later)."""
    row = {"task": info["name"], "family": info["family"], "devices": info["devices"],
           "tables": info["tables"], "planner": name, "plan_s": round(plan_s, 3),
           "valid": bool(plan is not None and plan.valid), "error": err,
           "predicted_step_s": plan.step_cost_s if plan is not None else None,
           "measured_step_s": None,
           "predicted_max_s": plan.max_cost_s if plan is not None else None,
           "measured_max_s": None, "measured_lookup_max_s": None,
           "measured_comm_mean_s": None, "types": "", "distinct_plans": None,
           "chosen": "", "ratio_lo": None, "ratio_hi": None,
           "load_avg": round(os.getloadavg()[0], 2)}
    if plan is not None:
        row["types"] = " ".join(f"{k}:{v}" for k, v in plan.type_counts().items())
        if not plan.valid and not err:
            row["error"] = "; ".join(plan.problems[:2])
    return row


def _plan_task(info: dict, order: Sequence[str], args) -> tuple[dict, dict]:
    """Every planner's plan of one task: (rows by planner, valid plans by planner), with the
    ``lowest`` row (our plan with the lowest predicted step cost) and ``best`` row (what
    ``--planner best`` picks), chosen as a user would."""
    task, n = info["task"], info["devices"]
    task_rows, plans = {}, {}
    for name in order:
        opts = {"solver": "cbc"} if name == "mip" else {}
        t0 = time.perf_counter()
        try:
            plan = get_planner(name, **opts).plan(
                task, n, seed=args.seed,
                time_limit_s=args.mip_limit if name in ("mip", "local_search") else None)
            err = ""
        except Exception as exc:              # an infeasible plan is a result, not a crash
            plan, err = None, f"{type(exc).__name__}: {str(exc)[:160]}"
        task_rows[name] = _plan_row(info, name, plan, err, time.perf_counter() - t0)
        if plan is not None and plan.valid:
            plans[name] = plan
    ours = {p: plans[p].step_cost_s for p in OURS if p in plans}
    if ours:
        low = lowest(ours)
        task_rows[LOWEST] = dict(task_rows[low], planner=LOWEST, chosen=low)
        pick, _ = pick_plan(plans, OURS, "torchrec", prepare(task, n).cost, seed=args.seed)
        task_rows[BEST] = dict(task_rows[pick], planner=BEST, chosen=pick)
    return task_rows, plans


def _fill(row: dict, m, distinct: int | None = None) -> None:
    """A row's measured columns from its plan's :class:`Measurement`."""
    row.update(measured_step_s=m.step_s, measured_max_s=m.max_s,
               measured_lookup_max_s=max(m.lookup_s),
               measured_comm_mean_s=sum(m.comm_s) / m.devices)
    if distinct is not None:
        row.update(predicted_step_s=m.predicted_step_s, predicted_max_s=m.predicted_max_s,
                   distinct_plans=distinct)


def _measure_task(info: dict, task_rows: dict, plans: dict, group, args) -> None:
    """Measure a task's distinct valid plans together (paired), TorchRec's once more as the
    noise row; fill the rows and their intervals against TorchRec's plan."""
    task, n = info["task"], info["devices"]
    keys: dict = {}
    for name, plan in plans.items():
        keys.setdefault(tuple(ts.key() for ts in plan.shardings), []).append(name)
    uniq = list(keys)
    batch = [plans[keys[kk][0]].shardings for kk in uniq]
    noise = args.noise and "torchrec" in plans
    if noise:
        batch.append(plans["torchrec"].shardings)
    ms = measure_many(prepare(task, n), batch, ids=model_ids(task.model, seed=args.seed),
                      repeats=args.repeats, comm_repeats=args.comm_repeats, group=group,
                      seed=args.seed, heap=args.heap)
    if args.noise and "torchrec" in task_rows:
        task_rows[NOISE] = dict(task_rows["torchrec"], planner=NOISE)
        if noise:
            _fill(task_rows[NOISE], ms[-1])
    meas = {NOISE: ms[-1]} if noise else {}
    for kk, m in zip(uniq, ms):
        picks = [x for x in (LOWEST, BEST)
                 if x in task_rows and task_rows[x]["chosen"] in keys[kk]]
        for name in keys[kk] + picks:
            meas[name] = m
            _fill(task_rows[name], m, len(uniq))
    _intervals(task_rows, meas)


def run(args) -> dict:
    from planner.measure.tables.comm import GlooGroup
    t_start = time.perf_counter()
    planners = [p.strip() for p in args.planners.split(",") if p.strip()]
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise SystemExit(f"--families: unknown {bad or families}; choose from {FAMILIES}")
    tasks = make_tasks(args.tasks, args.seed, args.scale, families)
    print(f"{len(tasks)} tasks (scale {args.scale:g}), planners {', '.join(planners)}; "
          f"kernels median of {args.repeats}, collectives median of {args.comm_repeats}; "
          f"{os.cpu_count()} cores", flush=True)
    rows = []
    groups: dict[int, GlooGroup] = {}
    try:
        for k, info in enumerate(tasks):
            n = info["devices"]
            if n not in groups:
                for g in groups.values():
                    g.close()
                groups = {n: GlooGroup(n, heap=args.heap)}
            order = planners[k % len(planners):] + planners[:k % len(planners)]
            task_rows, plans = _plan_task(info, order, args)
            _measure_task(info, task_rows, plans, groups[n], args)
            shown = planners + [x for x in (LOWEST, BEST, NOISE) if x in task_rows]
            rows += [task_rows[name] for name in shown]
            line = "  ".join(
                f"{p} {task_rows[p]['measured_step_s'] * 1e3:7.2f}" if task_rows[p]["valid"]
                else f"{p} invalid" for p in shown)
            print(f"[{k + 1:>2}/{len(tasks)}] {info['name']:<34} {n} dev {info['tables']:>2} tab "
                  f"(ms) {line}   {time.perf_counter() - t_start:6.0f} s", flush=True)
    finally:
        for g in groups.values():
            g.close()
    if any(p in planners for p in OURS):
        planners = planners + [LOWEST, BEST]
    if args.noise and "torchrec" in planners:
        planners = planners + [NOISE]
    summary = summarise(rows, planners)
    summary["wall_s"] = time.perf_counter() - t_start
    summary["settings"] = {"tasks": len(tasks), "families": families, "heap": args.heap,
                           "scale": args.scale, "seed": args.seed, "repeats": args.repeats,
                           "comm_repeats": args.comm_repeats, "mip_limit_s": args.mip_limit,
                           "planners": planners, "cores": os.cpu_count()}
    print_summary(summary, planners)
    if args.out:
        _write(Path(args.out), rows, summary)
    return summary


def _write(out: Path, rows: list[dict], summary: dict) -> None:
    """``results.csv`` (one row per task and planner) and ``summary.json`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'results.csv'} and {out / 'summary.json'}")


def _intervals(task_rows: dict, meas: dict) -> None:
    """Each row's paired-bootstrap 95% interval of its measured step over TorchRec's plan's
    (``ratio_lo``, ``ratio_hi``; TorchRec's own plan and identical plans: exactly 1)."""
    base = meas.get("torchrec")
    for name, m in meas.items():
        if base is None:
            return
        iv = (1.0, 1.0) if m is base else step_ratio_interval(m, base)
        if iv is not None:
            task_rows[name]["ratio_lo"], task_rows[name]["ratio_hi"] = iv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=32, help="tasks (half on 4, half on 8 devices)")
    ap.add_argument("--quick", action="store_true",
                    help="4 tasks, 3 repeats: a smoke run of a couple of minutes")
    ap.add_argument("--scale", type=float, default=1 / 16,
                    help="rows, batch and memory scale (default 1/16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=7, help="kernel iterations (median)")
    ap.add_argument("--comm-repeats", type=int, default=7, help="collective rounds (median)")
    ap.add_argument("--mip-limit", type=float, default=2.0, help="MIP time limit, seconds")
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--families", default="neuroshard,dreamshard",
                    help="task shapes, alternating: neuroshard (TW, CW allowed), dreamshard "
                         "(TW only), any (the neuroshard tables, every sharding type allowed: "
                         "TorchRec's default and bench_vs_torchrec's tasks)")
    ap.add_argument("--no-noise", dest="noise", action="store_false",
                    help="skip re-measuring TorchRec's plan (the noise-floor row)")
    ap.add_argument("--heap", choices=HEAP_POLICIES, default=DEFAULT_HEAP, help=HEAP_HELP)
    ap.add_argument("--out", default=None, metavar="DIR", help="write results.csv, summary.json")
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks = min(args.tasks, 4)
        args.repeats = min(args.repeats, 3)
        args.comm_repeats = min(args.comm_repeats, 3)
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
