"""Unseen DLRM plans on gloo: predicted against measured step time of sharding plans of table
sets nothing was fitted to (issue 22's first goal).

    python tests/bench/bench_unseen.py [--sets 8] [--seed 0] [--steps 10] [--warmup 3]
                                       [--calibration FILE] [--out FILE.json]
                                       [--heap retain|system] [--rounds 2]
                                       [--min-seconds S] [--measured steps|round]
                                       [--plan-order interleaved|alternate|fixed]
                                       [--block-seconds S] [--only-sets I,J]

Runs ``clusterplan validate unseen`` (``planner/measure/validate/unseen.py``): ``--sets`` seeded
random table sets (2 or 4 ranks, 4-40 tables, dims 16-256, pooling 1-60, rows 10³-10⁷ within
this machine's memory, batch 1k-64k, Zipf 0-1.2, half with a DCNv2 dense part), up to four plans
each (greedy, random table-wise, all column-wise, row-wise with small tables data-parallel),
each run for real under TorchRec's DistributedModelParallel (median of ``--steps`` steps of the
slowest rank, more for a plan predicted shorter than ``--min-seconds`` / ``--steps``; with
``--rounds`` K the median of all K rounds' steps, or with ``--measured round`` the median round;
a set's plans side by side in one run, turns of about ``--block-seconds`` of each plan's
steps alternating, or with ``--plan-order alternate`` one after the other, in reverse every
other round) and
predicted with this host's gloo calibration (cached per host and world size,
measured on first use; never fitted to these runs). Prints one row per plan, the MAPE, the
worst error, the plans within 25% and Kendall's tau between plans of the same set, against the
goals (MAPE ≤ 15%, every plan within 25%, tau ≥ 0.8), and writes everything to
``traces/validate/unseen-<time>.json``. The defaults are the protocol of the families the
README quotes (8 sets, 2 rounds, interleaved turns): 30-50 minutes on 2 cores, plus about 10
for the first calibrations.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--calibration", default=None, metavar="FILE")
    ap.add_argument("--out", default=None, metavar="FILE.json")
    ap.add_argument("--min-seconds", type=float, default=3.0,
                    help="measured seconds of steps per plan at least (more steps when short)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="whole runs of the family, each plan measured over all of them")
    ap.add_argument("--measured", default="steps", choices=("steps", "round"),
                    help="a plan's measured step over its rounds: all steps' median or the "
                         "median round's")
    ap.add_argument("--plan-order", default="interleaved",
                    choices=("interleaved", "alternate", "fixed"),
                    help="a set's plans in each round: interleaved turn by turn in one run "
                         "(default), in turn reversed every other round, or fixed")
    ap.add_argument("--block-seconds", type=float, default=1.0,
                    help="interleaved: predicted seconds of a plan's turn (0: one step)")
    ap.add_argument("--only-sets", default=None, metavar="I,J",
                    help="only these sets of the family (indices from 0): measure again a set "
                         "that a disturbed run measured")
    ap.add_argument("--heap", default="retain", choices=("retain", "system"),
                    help="the ranks' heap policy (planner/measure/heap.py)")
    a = ap.parse_args(argv)
    from planner.cli.main import main as clusterplan
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = a.out or str(ROOT / "traces" / "validate" / f"unseen-{stamp}.json")
    argv = ["validate", "unseen", "--sets", str(a.sets), "--seed", str(a.seed), "--steps",
            str(a.steps), "--warmup", str(a.warmup), "--out", out, "--heap", a.heap,
            "--rounds", str(a.rounds), "--min-seconds", str(a.min_seconds),
            "--measured", a.measured, "--plan-order", a.plan_order,
            "--block-seconds", str(a.block_seconds)]
    if a.calibration:
        argv += ["--calibration", a.calibration]
    if a.only_sets:
        argv += ["--only-sets", a.only_sets]
    t0 = time.time()
    rc = clusterplan(argv)
    wrote = f"; wrote {out}" if Path(out).is_file() else "; nothing written"
    print(f"wall {time.time() - t0:.0f} s{wrote}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
