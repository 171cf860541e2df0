"""Re-evaluate ``--planner best``'s rule on recorded runs of the measured sharding benchmark.

Run from the repository root (needs ``make setup-torchrec``)::

    python traces/sharding/best-rule-20261204/evaluate.py RESULTS.csv SEED [RESULTS.csv SEED ...]
        [--levels 0,0.5,0.8,0.9,0.95] [--out FILE.json]

Each RESULTS.csv is a ``tests/bench/bench_sharding_measured.py --families any --tasks 24
--seed SEED`` run. Every plan of a task was measured there, TorchRec's and the lowest predicted
of ours among them, so any rule that picks one of the two is evaluated exactly from the
recorded measurements: this script re-plans each task (same seed, same planners), checks that
TorchRec's plan and our lowest have the recorded predicted step costs (the same plans), computes
the probability :func:`planner.sharding.best.win_probability` gives ours under this host's
lookup fit error, and prints, per confidence level, the mean, median and worst measured ratio
to TorchRec's plan of the plan the rule picks (1 exactly where it keeps TorchRec's), the tasks
above 1 and those surely above (paired 95% interval wholly above 1), and how many it kept.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
for p in (REPO, REPO / "tests" / "bench"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import bench_sharding_measured as bench  # noqa: E402
from planner.model.tables.task import prepare  # noqa: E402
from planner.sharding.best import model_resolution, win_probability  # noqa: E402


def _rows(path: Path) -> dict:
    """(task → planner → row) of a results.csv; the lowest of ours is ``lowest`` or, in runs
    before that row existed, ``best``."""
    out: dict = {}
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            out.setdefault(r["task"], {})[r["planner"]] = r
    return out


def evaluate(path: Path, seed: int) -> list[dict]:
    """Per task of one run: win probability of our lowest plan over TorchRec's and the
    recorded measured ratio with its interval."""
    recorded = _rows(path)
    args = argparse.Namespace(seed=seed, mip_limit=2.0)
    out = []
    for info in bench.make_tasks(24, seed, 1 / 16, ["any"]):
        rec = recorded[info["name"]]
        low = rec.get("lowest") or rec["best"]
        tr = rec["torchrec"]
        if tr["valid"] != "True":
            continue
        _, plans = bench._plan_task(info, list(bench.PLANNERS), args)
        ours, theirs = plans[low["chosen"]], plans["torchrec"]
        same = (abs(ours.step_cost_s / float(low["predicted_step_s"]) - 1) < 1e-9
                and abs(theirs.step_cost_s / float(tr["predicted_step_s"]) - 1) < 1e-9)
        cost = prepare(info["task"], info["devices"]).cost
        p = win_probability(cost, ours.shardings, theirs.shardings, model_resolution(cost)[0],
                            seed=seed)
        out.append({"task": info["name"], "same_plans": same, "p_win": p,
                    "predicted": ours.step_cost_s / theirs.step_cost_s,
                    "measured": float(low["measured_step_s"]) / float(tr["measured_step_s"]),
                    "lo": float(low["ratio_lo"]), "hi": float(low["ratio_hi"])})
    return out


def summary(rows: list[dict], level: float) -> dict:
    rs = [r["measured"] if r["p_win"] >= level else 1.0 for r in rows]
    return {"level": level, "mean": statistics.fmean(rs), "median": statistics.median(rs),
            "worst": max(rs), "above": sum(x > 1 for x in rs),
            "surely_above": sum(r["p_win"] >= level and r["lo"] > 1 for r in rows),
            "kept_torchrec": sum(r["p_win"] < level for r in rows), "tasks": len(rs)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="RESULTS.csv SEED pairs")
    ap.add_argument("--levels", default="0,0.5,0.8,0.9,0.95")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if len(a.runs) % 2:
        ap.error("give RESULTS.csv SEED pairs")
    try:
        levels = [float(x) for x in a.levels.split(",")]
    except ValueError:
        ap.error(f"--levels {a.levels!r}: write probabilities, e.g. 0.5,0.9,0.95")
    pairs = list(zip(a.runs[::2], a.runs[1::2]))
    for path, seed in pairs:
        if not Path(path).is_file():
            ap.error(f"{path}: no such results.csv; give a bench_sharding_measured.py --out "
                     "DIR's results.csv")
        if not seed.isdigit():
            ap.error(f"{path}: seed {seed!r} is not a whole number; give the run's --seed")
    doc = {}
    for path, seed in pairs:
        rows = evaluate(Path(path), int(seed))
        doc[path] = {"seed": int(seed), "rows": rows,
                     "levels": [summary(rows, lv) for lv in levels]}
        print(f"{path} (seed {seed}): {sum(r['same_plans'] for r in rows)}/{len(rows)} tasks "
              "re-planned to the recorded plans")
        for s in doc[path]["levels"]:
            print(f"  confidence {s['level']:.2f}: mean {s['mean']:.3f} (median "
                  f"{s['median']:.3f}), worst {s['worst']:.3f}, above 1 on {s['above']}, surely "
                  f"above on {s['surely_above']}, TorchRec's plan kept on "
                  f"{s['kept_torchrec']}/{s['tasks']}")
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
