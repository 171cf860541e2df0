"""The summary of a measured sharding benchmark (``bench_sharding_measured.py``): per planner,
its measured and predicted step costs over the tasks where its plan is valid, its per-task ratios
to TorchRec's and size-lookup's plans, and the tasks whose paired 95% interval lies wholly above
or below TorchRec's; printed as one table for all tasks, then by device count and by family.

Rows are the benchmark's CSV rows as dicts (``task``, ``planner``, ``valid``, ``devices``,
``family``, ``measured_step_s``, ``measured_max_s``, ``predicted_step_s``, ``plan_s`` in
seconds, and ``ratio_lo`` / ``ratio_hi`` where measured).
"""

from __future__ import annotations

import statistics

#: TorchRec's plan measured a second time in the same paired run: its ratio to ``torchrec`` is
#: the noise floor of a per-task ratio
NOISE = "torchrec_again"


def _ratios(rows, planners, base, subset=None):
    """Per planner, its per-task measured step over ``base``'s (tasks where both are valid)."""
    by_task: dict[str, dict] = {}
    for r in rows:
        if subset is None or subset(r):
            by_task.setdefault(r["task"], {})[r["planner"]] = r
    out = {}
    for p in planners:
        rs = [t[p]["measured_step_s"] / t[base]["measured_step_s"] for t in by_task.values()
              if p in t and base in t and t[p]["valid"] and t[base]["valid"]]
        out[p] = rs
    return out


def _sure(rows, planner: str, *, above: bool) -> int:
    """Tasks where ``planner``'s plan is above (below) TorchRec's with its whole 95% interval."""
    return sum(1 for r in rows if r["planner"] == planner and r.get("ratio_lo") is not None
               and (r["ratio_lo"] > 1.0 if above else r["ratio_hi"] < 1.0))


def summarise(rows, planners, subset=None) -> dict:
    """The summary of ``rows`` (those ``subset`` keeps), per planner; split by devices and
    family at the top level."""
    sel = [r for r in rows if subset is None or subset(r)]
    tasks = sorted({r["task"] for r in sel})
    res = {"tasks": len(tasks), "planners": {}}
    vs_tr = _ratios(sel, planners, "torchrec") if "torchrec" in planners else {}
    vs_sl = _ratios(sel, planners, "size_lookup") if "size_lookup" in planners else {}
    for p in planners:
        mine = [r for r in sel if r["planner"] == p]
        ok = [r for r in mine if r["valid"]]
        meas = [r["measured_step_s"] for r in ok]
        pred_err = [(r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
                    for r in ok]
        entry = {"valid": len(ok), "n": len(mine),
                 "mean_measured_step_s": statistics.fmean(meas) if meas else None,
                 "median_measured_step_s": statistics.median(meas) if meas else None,
                 "mean_predicted_step_s": statistics.fmean([r["predicted_step_s"] for r in ok])
                 if ok else None,
                 "mean_measured_max_s": statistics.fmean([r["measured_max_s"] for r in ok])
                 if ok else None,
                 "mean_abs_prediction_error": statistics.fmean([abs(e) for e in pred_err])
                 if pred_err else None,
                 "mean_prediction_error": statistics.fmean(pred_err) if pred_err else None,
                 "mean_plan_s": statistics.fmean([r["plan_s"] for r in mine]) if mine else None}
        for label, rs in (("vs_torchrec", vs_tr.get(p)), ("vs_size_lookup", vs_sl.get(p))):
            if rs:
                entry[label] = {"mean_ratio": statistics.fmean(rs),
                                "median_ratio": statistics.median(rs), "tasks": len(rs),
                                "wins": sum(1 for x in rs if x < 1.0),
                                "above": sum(1 for x in rs if x > 1.0),
                                "max_ratio": max(rs),
                                "mean_abs_deviation": statistics.fmean([abs(x - 1) for x in rs])}
        if "vs_torchrec" in entry:
            # tasks whose whole paired 95% interval lies above (below) TorchRec's plan
            entry["vs_torchrec"].update(surely_above=_sure(sel, p, above=True),
                                        surely_below=_sure(sel, p, above=False))
        res["planners"][p] = entry
    if subset is None:
        res["by_devices"] = {str(d): summarise(rows, planners,
                                               subset=lambda r, d=d: r["devices"] == d)
                             for d in sorted({r["devices"] for r in rows})}
        res["by_family"] = {f: summarise(rows, planners, subset=lambda r, f=f: r["family"] == f)
                            for f in sorted({r["family"] for r in rows})}
    return res


def _fmt_ratio(e, key):
    v = e.get(key)
    if not v:
        return f"{'-':>16}"
    return f"{v['mean_ratio']:>7.3f} ({v['median_ratio']:.3f})"


def print_summary(summary: dict, planners) -> None:
    """Print :func:`summarise`'s result: all tasks, the noise floor, then each split."""
    def table(s: dict, title: str) -> None:
        print(f"\n{title} ({s['tasks']} tasks)")
        print(f"{'planner':<16}{'valid':>8}{'mean step ms':>13}{'median ms':>11}"
              f"{'vs torchrec':>17}{'vs size_lookup':>17}{'wins/TR':>9}{'worst/TR':>9}"
              f"{'sure -/+':>9}{'pred err':>10}{'plan s':>8}")
        for p in planners:
            e = s["planners"][p]
            mean = e["mean_measured_step_s"]
            med = e["median_measured_step_s"]
            wins = e.get("vs_torchrec")
            err = e["mean_prediction_error"]
            sure = f"{wins['surely_below']}/{wins['surely_above']}" if wins else "-"
            print(f"{p:<16}{e['valid']:>4}/{e['n']:<3}"
                  f"{(mean * 1e3 if mean else float('nan')):>13.2f}"
                  f"{(med * 1e3 if med else float('nan')):>11.2f}"
                  f"{_fmt_ratio(e, 'vs_torchrec')}{_fmt_ratio(e, 'vs_size_lookup')}"
                  f"{(str(wins['wins']) + '/' + str(wins['tasks'])) if wins else '-':>9}"
                  f"{(format(wins['max_ratio'], '.3f')) if wins else '-':>9}"
                  f"{sure:>9}"
                  f"{(100 * err if err is not None else float('nan')):>+9.1f}%"
                  f"{(e['mean_plan_s'] or 0):>8.2f}")
    table(summary, "all tasks — measured step cost (each phase's slowest rank, summed); "
                   "ratios: mean (median) of per-task ratios on tasks where both plans are valid")
    noise = summary["planners"].get(NOISE, {}).get("vs_torchrec")
    if noise:
        print(f"noise floor: TorchRec's plan measured twice in the same run: mean ratio "
              f"{noise['mean_ratio']:.3f}, mean |ratio − 1| {noise['mean_abs_deviation']:.3f} "
              f"over {noise['tasks']} tasks; its paired 95% interval excludes 1 on "
              f"{noise['surely_below'] + noise['surely_above']} of them")
    for d, s in summary.get("by_devices", {}).items():
        table(s, f"{d} devices")
    for f, s in summary.get("by_family", {}).items():
        table(s, f"{f} tasks")
    print(f"\nwall time {summary.get('wall_s', 0):.0f} s")
