"""What a plan's turn costs its first step, when a table set's plans train side by side
(``validate unseen --plan-order interleaved``, ``planner/measure/validate/dlrm_interleave.py``).

    python tests/bench/bench_turn_cold.py [--seed 21] [--sets 8] [--set unseen-5]
                                          [--block 10] [--steps 100] [--out FILE.json]

Trains the chosen set's plans of the unseen family in one run, ``--block`` steps of each plan a
turn, and prints per plan the median step (slowest rank) of a turn's first step and of its
other steps, and the median over turns of first / median of the turn's others: a paired
figure, since a turn's steps run a few hundred milliseconds apart under one host speed. A
ratio above 1 is what the other plans' models left in the caches costs a step that follows
them; ``validate unseen`` sizes its turns (``--block-seconds``) so that only a small share of
a plan's measured steps pay it. About a minute per set on 2 cores; nothing is calibrated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def turn_ratios(steps_s: dict[int, float], block: int, warmup: int) -> tuple[list, list, list]:
    """``steps_s`` (step -> seconds) split into turns' first steps and their other steps, and
    per turn first / median of the others (turns of ``block`` steps from step 0; warm-up
    steps left out)."""
    turns: dict[int, dict[int, float]] = {}
    for s, t in steps_s.items():
        if s >= warmup:
            turns.setdefault(s // block, {})[s % block] = t
    first = [v[0] for v in turns.values() if 0 in v]
    rest = [t for v in turns.values() for k, t in v.items() if k]
    ratios = [v[0] / statistics.median(t for k, t in v.items() if k) for v in turns.values()
              if 0 in v and len(v) > 1]
    return first, rest, ratios


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=21)
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--set", default="unseen-5", help="the set's name (unseen-K)")
    ap.add_argument("--block", type=int, default=10, help="steps of a plan a turn")
    ap.add_argument("--steps", type=int, default=100, help="measured steps per plan")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", default=None, metavar="FILE.json")
    a = ap.parse_args(argv)
    import tempfile

    from planner.machine import installed_description
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_interleave import InterleavedRunConfig, split_result
    from planner.measure.validate.runner import Pool
    from planner.measure.validate.unseen_family import unseen_cases, write_case
    cases = [c for c in unseen_cases(a.sets, seed=a.seed) if c.set_name.split(" ")[0] == a.set]
    if not cases:
        print(f"no set {a.set!r} among seed {a.seed}'s {a.sets} sets", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        cfgs = [load_dlrm_config(str(write_case(c, Path(tmp))), nproc=c.ranks, steps=a.steps,
                                 warmup=a.warmup, timeout_s=300.0) for c in cases]
        run = InterleavedRunConfig(plans=tuple(cfgs), blocks=(a.block,) * len(cfgs))
        with Pool(cases[0].ranks) as pool:
            results = split_result(run, pool.run(run))
    rows = []
    for c, res in zip(cases, results):
        slowest: dict[int, float] = {}
        for rk in res.ranks:
            for s, t0, t1 in rk["steps"]:
                slowest[s] = max(slowest.get(s, 0.0), t1 - t0)
        first, rest, ratios = turn_ratios(slowest, a.block, a.warmup)
        row = {"plan": c.plan_kind, "first_ms": 1e3 * statistics.median(first),
               "rest_ms": 1e3 * statistics.median(rest), "turns": len(ratios),
               "first_over_rest": statistics.median(ratios),
               "range": [min(ratios), max(ratios)], "steps_s": slowest}
        rows.append(row)
        print(f"{c.plan_kind:12s} first {row['first_ms']:7.2f} ms  rest {row['rest_ms']:7.2f} ms"
              f"  first/rest {row['first_over_rest']:.3f} over {len(ratios)} turns "
              f"({min(ratios):.2f}-{max(ratios):.2f})")
    if a.out:
        doc = {"what": "first step of a turn vs the turn's others, plans side by side "
                       "(tests/bench/bench_turn_cold.py)", "seed": a.seed, "sets": a.sets,
               "set": cases[0].set_name, "block": a.block, "steps": a.steps,
               "warmup": a.warmup, "machine": installed_description(), "rows": rows}
        Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
