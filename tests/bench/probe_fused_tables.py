"""Is one rank's fused lookup the sum of its tables? (issue 22, the seed-1 family's large sets)

    python tests/bench/probe_fused_tables.py [SEED:SET ...]      # default 1:3 1:6 2:9 2:11

For sets of the unseen family (``planner/measure/validate/unseen_family.py``), rank 0's shards
of the greedy plan on 2 ranks: one fused FBGEMM TBE over all of them (forward + backward, fused
SGD) and each table alone in turn, one thread, with the heap policy validation ranks run with
(``retain``), the output gradient written before each backward and not timed. Each fused time is
paired back to back with the gloo calibration's lookup probe (4 small tables, batch 2,048: what
the calibration charges every lookup), so the host's drift cancels in "x the probe's ratio": how
much more than the calibration charges this set's lookups take. 2026-11-27 16:31, AMD EPYC VM
(32 MiB L3), nothing else running:

    set   shards  batch   profile    fused (x profile, x the probe's)   tables alone summed
    1:3   16      9,320   196.6 ms   240.8 (1.22x, 1.07x)               223.3 (1.14x)
    1:6    8     21,864   228.6 ms   306.6 (1.34x, 1.26x)               271.6 (1.19x)
    1:8   19      8,952   116.7 ms   144.3 (1.24x, 1.12x)               126.3 (1.08x)
    0:0   13     13,288   174.7 ms   212.2 (1.21x, 1.04x)               192.3 (1.10x)
    2:9   10      2,136    30.7 ms    39.8 (1.30x, 1.12x)                39.3 (1.28x)
    2:11  11      3,536    41.6 ms    49.0 (1.18x, 0.93x)                52.6 (1.26x)

An earlier version (15:08: glibc's default heap, gradient made inside the timed backward, the
probe not paired) printed 1.67-2.04x for 1:3 and 1:6; most of that was the heap's unmapping
and the host's drift (the same sets gave 1.29-1.83x within the next half hour). What remains:
a large set's fused backward is 1.1-1.3x its tables' backwards timed alone, the cost of
output-gradient rows that miss once the fused gradient matrix (40-70 MiB here) outgrows the
cache (``probe_grad_miss.py``), which the profile's additive tables do not price; the
calibration's lookup probe covers the small sets.
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.measure.heap import DEFAULT_HEAP, apply_heap_policy  # noqa: E402
from planner.measure.tables.kernels import time_shard_set  # noqa: E402
from planner.measure.tables.plan_work import rank_work  # noqa: E402
from planner.measure.validate.dlrm_probes import predicted_lookup_s  # noqa: E402
from planner.measure.validate.lookup_probe import lookup_probe_model, probe_shardings  # noqa: E402
from planner.measure.validate.unseen_family import unseen_cases  # noqa: E402
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
    """Forward + backward seconds of one fused call over ``tables`` (medians of 3; the output
    gradient written before the backward, untimed, as the step's collective writes it)."""
    t = time_shard_set(tables, repeats=3, warmup=1, grad_untimed=True)
    return t.fwd_s + t.bwd_s


def probe_tables():
    """Rank 0's tables of the gloo calibration's lookup probe (what it charges every lookup)."""
    model = lookup_probe_model()
    return rank_work(model, probe_shardings(model), model_ids(model), 1)[0]


def paired_ratio(tables, pred_s: float, probe, probe_pred_s: float, repeats: int = 5):
    """Median over ``repeats`` of (``tables``' fused time / ``pred_s``) over (the probe's /
    ``probe_pred_s``), each pair timed back to back so that the host's drift cancels; and the
    median fused seconds."""
    ratios, times = [], []
    for _ in range(repeats):
        q = seconds(probe) / probe_pred_s
        t = seconds(tables)
        ratios.append(t / pred_s / q)
        times.append(t)
    return statistics.median(ratios), statistics.median(times)


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
    picks = parse_picks(argv)
    apply_heap_policy(DEFAULT_HEAP)         # as every validation rank does
    probe, probe_pred = probe_tables(), predicted_lookup_s()
    for seed, k in picks:
        c = greedy_case(seed, k)
        if c is None:
            print(f"{seed}:{k} is not a 2-rank set; skipped")
            continue
        tables = rank_work(c.model, c.shardings, model_ids(c.model), 2)[0]
        ev = evaluate_shardings(prepare(ShardingTask(model=c.model,
                                                     topology="localhost-gloo:node.gpus=2"), 2),
                                c.shardings)
        pred = float(ev.breakdown_s["lookup_fwd_s"][0] + ev.breakdown_s["lookup_bwd_s"][0])
        rel, fused = paired_ratio(tables, pred, probe, probe_pred)
        alone = sum(seconds([t]) for t in tables)
        print(f"{seed}:{k} {len(tables):3d} shards on rank 0, batch {c.model.batch_size:6d}: "
              f"predicted {pred * 1e3:6.1f} ms, fused {fused * 1e3:6.1f} ({fused / pred:.2f}x; "
              f"{rel:.2f}x the probe's ratio), tables alone summed {alone * 1e3:6.1f} "
              f"({alone / pred:.2f}x)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
