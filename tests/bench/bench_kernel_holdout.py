"""Does the CPU kernel fit hold on shard sets it never saw? (issue 22)

    python tests/bench/bench_kernel_holdout.py [--seeds 6 5] [--sets 12] [--rounds 2]
                                               [--repeats 5] [--out FILE.json]
    python tests/bench/bench_kernel_holdout.py --repredict FILE.json   # seconds, no timing

In one session, the two kinds spread evenly through one sequence (timed in chunks of 8, the
second round in reverse) so that the host's drift falls on both alike, times
(one thread, caches flushed, page faults of new outputs included, as ``clusterplan calibrate
embedding`` times its sweep):

- the calibration's kernel sweep (``kernel_configs(120, seed=0)``), and
- the held-out shard sets: every rank of the greedy and the random table-wise plans of the
  unseen family's sets (``planner/measure/validate/unseen_family.py``, ``--seeds``) as one fused
  kernel, the way a validation rank runs it (ranks over 3 M ids left out, for time).

The kernel model is fitted to the sweep alone (``fit.kernel_predictions``) and the held-out
ranks are predicted with it. Prints per rank predicted against measured forward and backward,
their MAPE, mean and worst error, and how far the host's speed moved between rounds (per
chunk, the median of round 2 over round 1), and writes it all to ``--out`` (default
``traces/validate/kernel-holdout-<time>.json``). About 10 minutes with two rounds on 2 cores.

This separates the kernel model's error from the step model's and the host's drift: the
unseen family's rows compare a whole step measured now against a profile measured earlier.

``--repredict FILE.json`` times nothing: it fits the current kernel model to the sweep points a
recorded run kept and predicts that run's held-out ranks again (same seeds and sets), to see
how a change of the model or its estimator moves the errors on the same measurements. Runs
since 2026-11-28 19:30 keep each rank's tables (``config``); for older ones the ranks are
rebuilt from the seeds, and a rank whose plan has changed since (the greedy planner plans with
the CPU profile of the day) is left out and counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from planner.measure.tables.fit import kernel_predictions  # noqa: E402
from planner.measure.tables.kernel_sweep import (  # noqa: E402
    kernel_configs,
    measure_kernel_points,
    point_model,
)
from planner.measure.validate.unseen_family import unseen_cases  # noqa: E402
from planner.model.tables.spec import ModelSpec, TableSpec  # noqa: E402

MAX_IDS = 3e6
CHUNK = 8


def held_out(seeds, sets: int) -> list[ModelSpec]:
    """One configuration per rank of the greedy and random table-wise plans."""
    out = []
    for seed in seeds:
        for c in unseen_cases(sets, seed=seed):
            if c.plan_kind not in ("greedy", "random") or any(
                    ts.sharding_type.value != "table_wise" for ts in c.shardings):
                continue
            for r in range(c.ranks):
                tabs = tuple(c.model.tables[ts.table] for ts in c.shardings
                             if ts.shards[0].rank == r)
                if tabs and c.model.batch_size * sum(t.pooling_factor for t in tabs) <= MAX_IDS:
                    name = f"seed{seed}-{c.set_name.split()[0]}-{c.plan_kind}-rank{r}"
                    out.append(ModelSpec(name=name, tables=tabs, batch_size=c.model.batch_size))
    return out


def mixed_order(n_fit: int, n_held: int) -> list[int]:
    """Indices of ``n_fit`` sweep then ``n_held`` held-out configurations spread evenly through
    one sequence, so every stretch of the session (and every chunk) times both kinds."""
    keyed = [((i + 0.5) / n_fit, i) for i in range(n_fit)]
    keyed += [((j + 0.5) / n_held, n_fit + j) for j in range(max(n_held, 0))]
    return [i for _, i in sorted(keyed)]


def errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    e = pred / meas - 1.0
    return {"mape": float(np.mean(np.abs(e))), "median": float(np.median(e)),
            "mean": float(np.mean(e)),
            "worst": float(e[np.argmax(np.abs(e))]), "within_25pct": int(np.sum(np.abs(e) <= 0.25)),
            "n": int(e.size)}


def drift(points: list[dict]) -> dict:
    """Per chunk of ``points`` (in the order they were timed), the median ratio of round 2 to
    round 1 (forward and backward together)."""
    if "rounds" not in points[0]:
        return {}
    ratios = []
    for c in range(0, len(points), CHUNK):
        part = points[c:c + CHUNK]
        ratios.append(statistics.median(
            (p["rounds"][1][0] + p["rounds"][1][1]) / (p["rounds"][0][0] + p["rounds"][0][1])
            for p in part))
    return {"chunk_ratio_median": statistics.median(ratios), "chunk_ratio_min": min(ratios),
            "chunk_ratio_max": max(ratios)}


def print_errors(summary: dict) -> None:
    for k in ("forward", "backward", "total"):
        s = summary[k]
        print(f"{k:8s}: MAPE {s['mape']:.1%}, median {s['median']:+.1%}, mean {s['mean']:+.1%}, "
              f"worst {s['worst']:+.1%}, {s['within_25pct']}/{s['n']} within 25%")


def _config(m: ModelSpec) -> list[dict]:
    """A rank's tables as plain fields (enough to rebuild them exactly)."""
    return [{k: v for k, v in asdict(t).items() if v is not None} for t in m.tables]


def _from_config(name: str, batch: int, config: list[dict]) -> ModelSpec:
    tables = tuple(TableSpec(**{k: tuple(v) if isinstance(v, list) else v
                                for k, v in t.items()}) for t in config)
    return ModelSpec(name=name, tables=tables, batch_size=int(batch))


def recorded_ranks(doc: dict) -> tuple[list[dict], list[ModelSpec]]:
    """The rows of a recorded run and their configurations: kept ones as recorded, older
    runs' rebuilt from their seeds (rows whose rank no longer rebuilds the same are dropped)."""
    rows = doc["rows"]
    if all("config" in r for r in rows):
        return rows, [_from_config(r["rank"], r["batch"], r["config"]) for r in rows]
    st = doc["settings"]
    if "seeds" in st:
        seeds, sets = st["seeds"], st["sets"]
    else:                                    # runs before the settings kept them
        said = doc["validated_on"]
        seeds = [int(x) for x in said.split("seeds [")[1].split("]")[0].split(",")]
        sets = int(said.split("], ")[1].split(" sets")[0])
    by_name = {m.name: m for m in held_out(seeds, sets)}
    keep = [r for r in rows if r["rank"] in by_name
            and len(by_name[r["rank"]].tables) == r["tables"]
            and by_name[r["rank"]].batch_size == r["batch"]]
    if len(keep) < len(rows):
        print(f"{len(rows) - len(keep)} of {len(rows)} ranks left out: their plans have "
              "changed since the run (it kept no configurations)")
    return keep, [by_name[r["rank"]] for r in keep]


def repredict(path: Path) -> int:
    """A recorded run's held-out ranks predicted by the current fit of its own sweep points."""
    doc = json.loads(path.read_text())
    rows, models = recorded_ranks(doc)
    pts = doc["sweep_points"]
    mf = np.array([r["fwd_measured_s"] for r in rows])
    mb = np.array([r["bwd_measured_s"] for r in rows])
    yf = np.array([p["fwd_s"] for p in pts])
    yb = np.array([p["bwd_s"] for p in pts])
    for label, held, (f, b) in (
            ("sweep (fitted to)", [point_model(p) for p in pts], (yf, yb)),
            (f"held-out ranks of {path.name}", models, (mf, mb))):
        pf, pb = kernel_predictions(pts, held)
        print(label)
        print_errors({"forward": errors(pf, f), "backward": errors(pb, b),
                      "total": errors(pf + pb, f + b)})
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[6, 5])
    ap.add_argument("--sets", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, metavar="FILE.json")
    ap.add_argument("--repredict", default=None, metavar="FILE.json",
                    help="time nothing: refit a recorded run's sweep, predict its ranks again")
    a = ap.parse_args(argv)
    if a.repredict:
        return repredict(Path(a.repredict))
    sweep = kernel_configs(120, seed=0)
    held = held_out(a.seeds, a.sets)
    t0 = time.time()
    order = mixed_order(len(sweep), len(held))
    timed = measure_kernel_points([(sweep + held)[i] for i in order], repeats=a.repeats,
                                  rounds=a.rounds, chunk=CHUNK, progress=lambda m: print(
                                      f"{m} ({time.time() - t0:.0f} s)", file=sys.stderr,
                                      flush=True))
    pts = [None] * len(order)
    for i, p in zip(order, timed):
        pts[i] = p
    fit_pts, held_pts = pts[:len(sweep)], pts[len(sweep):]
    pf, pb = kernel_predictions(fit_pts, held)
    mf = np.array([p["fwd_s"] for p in held_pts])
    mb = np.array([p["bwd_s"] for p in held_pts])
    rows = [{"rank": m.name, "tables": len(m.tables), "batch": m.batch_size,
             "fwd_measured_s": float(x), "fwd_predicted_s": float(y),
             "bwd_measured_s": float(u), "bwd_predicted_s": float(v), "config": _config(m)}
            for m, x, y, u, v in zip(held, mf, pf, mb, pb)]
    print(f"{'held-out rank':36s} {'T':>3s} {'batch':>6s}  fwd meas/pred ms   bwd meas/pred ms")
    for r in rows:
        print(f"{r['rank']:36s} {r['tables']:3d} {r['batch']:6d}  "
              f"{r['fwd_measured_s'] * 1e3:7.1f} {r['fwd_predicted_s'] * 1e3:7.1f}   "
              f"{r['bwd_measured_s'] * 1e3:7.1f} {r['bwd_predicted_s'] * 1e3:7.1f} "
              f"({r['bwd_predicted_s'] / r['bwd_measured_s'] - 1:+.2f})")
    summary = {"forward": errors(pf, mf), "backward": errors(pb, mb),
               "total": errors(pf + pb, mf + mb), "host_drift": drift(timed)}
    print_errors(summary)
    if summary["host_drift"]:
        d = summary["host_drift"]
        print(f"host: round 2 / round 1 per chunk of {CHUNK}: median "
              f"{d['chunk_ratio_median']:.2f}, {d['chunk_ratio_min']:.2f}-"
              f"{d['chunk_ratio_max']:.2f}")
    out = Path(a.out) if a.out else ROOT / "traces" / "validate" / (
        "kernel-holdout-" + time.strftime("%Y%m%d-%H%M%S") + ".json")
    doc = {"what": "CPU kernel fit (planner/measure/tables/fit.py) fitted to the calibration's "
                   "sweep alone, predicting held-out ranks of the unseen family; measured in "
                   "one session, interleaved (tests/bench/bench_kernel_holdout.py)",
           "fitted_to": "kernel_configs(120, seed=0): the sweep of clusterplan calibrate embedding",
           "validated_on": f"unseen family seeds {a.seeds}, {a.sets} sets: greedy and random "
                           "table-wise plans, one fused kernel per rank",
           "settings": {"seeds": a.seeds, "sets": a.sets,
                        "rounds": a.rounds, "repeats": a.repeats, "chunk": CHUNK,
                        "max_ids_per_rank": MAX_IDS, "wall_s": round(time.time() - t0, 1)},
           "summary": summary, "rows": rows, "sweep_points": fit_pts}
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
