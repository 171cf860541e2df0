"""Is one rank's fused lookup the sum of its tables? (issue 22, the seed-1 family's large sets)

    python tests/bench/probe_fused_tables.py [SEED:SET ...]      # default 1:3 1:6 2:9 2:11

For sets of the unseen family (``planner/measure/validate/unseen.py``), rank 0's shards of the
greedy plan on 2 ranks: one fused FBGEMM TBE over all of them (forward + backward, fused SGD)
and each table alone in turn, one thread, against this host's CPU embedding profile, which
prices a rank's lookups as the sum of its tables. 2026-11-27 15:08, AMD EPYC VM (32 MiB L3):

    set   shards  batch   predicted   fused            tables alone, summed
    1:3   16      9,320   196.6 ms    328.8 (1.67x)    210.5 (1.07x)
    1:6    8     21,864   228.6 ms    466.6 (2.04x)    321.7 (1.41x)
    2:9   10      2,136    30.7 ms     40.6 (1.32x)     50.0 (1.63x)
    2:11  11      3,536    41.6 ms     56.9 (1.37x)     54.9 (1.32x)

(a first version, in 2 processes, 15:04: 1:3 1.89x / 1.27x, 1:6 1.76x / 1.30x, 2:9 1.40x /
1.61x). The profile's tables are additive; a large fused lookup is not (the likely cause, not
yet shown: its tables' rows and output gradients compete for one cache). Not modelled yet;
the gloo calibration's lookup probe (4 small tables, batch 2,048) charges about 1.3-1.4x,
which covers the small sets only.
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.measure.tables.kernels import time_shard_set  # noqa: E402
from planner.measure.tables.plans import rank_work  # noqa: E402
from planner.measure.validate.unseen import unseen_cases  # noqa: E402
from planner.model.tables.ids import model_ids  # noqa: E402
from planner.model.tables.plan import evaluate_shardings  # noqa: E402
from planner.model.tables.task import ShardingTask, prepare  # noqa: E402


def greedy_case(seed: int, k: int):
    """The greedy plan of set ``k`` of the family of ``seed`` (None if it is not on 2 ranks)."""
    for c in unseen_cases(k + 1, seed=seed):
        if c.set_name.startswith(f"unseen-{k}") and c.plan_kind == "greedy":
            return c if c.ranks == 2 else None
    return None


def seconds(tables) -> float:
    """Forward + backward seconds of one fused call over ``tables`` (medians of 3)."""
    t = time_shard_set(tables, repeats=3, warmup=1)
    return t.fwd_s + t.bwd_s


def parse_picks(args) -> list[tuple[int, int]]:
    """``SEED:SET`` arguments as pairs; SystemExit(2) naming the argument and the fix."""
    picks = []
    for a in args or ["1:3", "1:6", "2:9", "2:11"]:
        seed, _, k = a.partition(":")
        if not (seed.isdigit() and k.isdigit() and int(k) < 12):
            print(f"probe_fused_tables: argument {a!r} is not SEED:SET (fix: two whole "
                  "numbers, SET 0-11, e.g. 1:6)", file=sys.stderr)
            raise SystemExit(2)
        picks.append((int(seed), int(k)))
    return picks


def main(argv) -> int:
    for seed, k in parse_picks(argv):
        c = greedy_case(seed, k)
        if c is None:
            print(f"{seed}:{k} is not a 2-rank set; skipped")
            continue
        tables = rank_work(c.model, c.shardings, model_ids(c.model), 2)[0]
        fused = statistics.median(seconds(tables) for _ in range(3))
        alone = min(sum(seconds([t]) for t in tables) for _ in range(2))
        ev = evaluate_shardings(prepare(ShardingTask(model=c.model,
                                                     topology="localhost-gloo:node.gpus=2"), 2),
                                c.shardings)
        pred = float(ev.breakdown_s["lookup_fwd_s"][0] + ev.breakdown_s["lookup_bwd_s"][0])
        print(f"{seed}:{k} {len(tables):3d} shards on rank 0, batch {c.model.batch_size:6d}: "
              f"predicted {pred * 1e3:7.1f} ms, fused {fused * 1e3:7.1f} ({fused / pred:.2f}x), "
              f"tables alone summed {alone * 1e3:7.1f} ({alone / pred:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
