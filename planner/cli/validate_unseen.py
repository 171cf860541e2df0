"""``clusterplan validate unseen``: predicted against measured step time of seeded sharding
plans of table sets nothing was fitted to (:mod:`planner.measure.validate.unseen`)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from simulator.errors import SpecError
from simulator.gloo_profile import load_gloo_profile

from planner.cli.output import emit, progress_line, write_json
from planner.machine import installed_description
from planner.measure.heap import DEFAULT_HEAP
from planner.measure.validate.cache import cached_calibration, ensure_host_profile
from planner.measure.validate.calibrate import GlooCalibration, measure_gloo
from planner.measure.validate.dlrm_interleave import BLOCK_SECONDS
from planner.measure.validate.dlrm_report import heap_notes
from planner.measure.validate.unseen import repredict_rows, run_cases
from planner.measure.validate.unseen_family import unseen_cases
from planner.measure.validate.unseen_report import format_rows, summarise
from planner.model.tables.cpu_profile import load_cpu_profile

__all__ = ["run_unseen", "calibrations_for", "only_sets"]

MAX_SETS = 200


#: rounds of ``validate unseen --rounds``: each is a whole run of the family (10-45 minutes)
MAX_ROUNDS = 5
#: ``--min-seconds`` at most: measured seconds of steps per plan
MAX_MIN_SECONDS = 60.0


def calibrations_for(worlds, explicit: str | None, heap: str = DEFAULT_HEAP) -> dict:
    """Per world size the gloo profile that times its plans: ``--calibration`` for the world it
    was measured with, else this host's cached one for the heap policy ``heap``, measured now
    when there is none."""
    out = {}
    def announce() -> None:
        print("clusterplan: no CPU embedding profile of this host yet: measuring it once (a few "
              "minutes; `clusterplan calibrate embedding` refreshes it)", file=sys.stderr,
              flush=True)
    ensure_host_profile(worlds, progress=progress_line, announce=announce)
    given = load_gloo_profile(explicit) if explicit else None
    for world in sorted(set(worlds)):
        if given is not None and world in {n for _, n in given.comm}:
            out[world] = given
            continue
        def measure(w):
            print(f"clusterplan: no gloo calibration of this host for {w} processes yet: "
                  "measuring it once (5-10 minutes; `clusterplan calibrate gloo` refreshes "
                  "it)", file=sys.stderr, flush=True)
            return measure_gloo(GlooCalibration(world=w, rounds=2, heap=heap))
        path, _ = cached_calibration(world, measure=measure, heap=heap)
        out[world] = load_gloo_profile(str(path))
    return out


def run_unseen(args) -> int:
    """Run the family, print one row per plan and the summary; exit 0 (timing is reported,
    the goals are printed), 1 when a plan's communication did not match the simulator's."""
    if not 1 <= args.sets <= MAX_SETS:
        raise SpecError(f"--sets {args.sets} is outside 1..{MAX_SETS}", field="--sets",
                        fix="pass e.g. --sets 12")
    for flag, v, lo in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if v < lo:
            raise SpecError(f"{v} is below {lo}", field=flag, fix=f"pass {flag} {lo} or more")
    rounds = getattr(args, "rounds", 1)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise SpecError(f"--rounds {rounds} is outside 1..{MAX_ROUNDS}", field="--rounds",
                        fix="pass e.g. --rounds 3")
    min_seconds = getattr(args, "min_seconds", 0.0)
    if not 0 <= min_seconds <= MAX_MIN_SECONDS:
        raise SpecError(f"--min-seconds {min_seconds:g} is outside 0..{MAX_MIN_SECONDS}",
                        field="--min-seconds", fix="pass e.g. --min-seconds 3 (0: --steps only)")
    measured = getattr(args, "measured", "steps")
    order = getattr(args, "plan_order", "interleaved")
    block_s = getattr(args, "block_seconds", BLOCK_SECONDS)
    if not 0 <= block_s <= MAX_MIN_SECONDS:
        raise SpecError(f"--block-seconds {block_s:g} is outside 0..{MAX_MIN_SECONDS:g}",
                        field="--block-seconds", fix="pass e.g. --block-seconds 1 (0: one "
                                                     "step a turn)")
    if args.out:
        from simulator.fileio import check_writable
        check_writable(args.out)
    if getattr(args, "repredict", None):
        return _repredict(args)
    only = only_sets(getattr(args, "only_sets", None), args.sets)
    cases = unseen_cases(args.sets, seed=args.seed, only=only)
    cals = calibrations_for([c.ranks for c in cases], args.calibration, args.heap)

    def progress(i, n, row):
        if "error" in row:
            print(f"[{i}/{n}] {row['set']} {row['plan']}: FAILED: {row['error']}",
                  file=sys.stderr, flush=True)
            return
        err = row["predicted_s"] / row["measured_s"] - 1.0
        host = (f"; host {row['host_speed']:.2f}x, at its speed "
                f"{row['predicted_at_host_s'] / row['measured_s'] - 1:+.1%}"
                if "host_speed" in row else "")
        print(f"[{i}/{n}] {row['set']} {row['plan']}: predicted {row['predicted_s'] * 1e3:.1f} "
              f"ms, measured {row['measured_s'] * 1e3:.1f} ms ({err:+.1%}{host})",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rows = run_cases(cases, Path(tmp), steps=args.steps, warmup=args.warmup,
                         calibrations=cals, progress=progress, heap=args.heap, rounds=rounds,
                         host_probe=getattr(args, "host_probe", True),
                         min_seconds=min_seconds, measured=measured, order=order,
                         block_s=block_s)
    doc = {"seed": args.seed, "sets": args.sets, "steps": args.steps, "warmup": args.warmup,
           "min_seconds": min_seconds, "heap": args.heap, "rounds": rounds,
           "measured": measured, "order": order,
           **({"block_seconds": block_s} if order == "interleaved" else {}),
           "host_probe": getattr(args, "host_probe", True),
           **({"only_sets": sorted(only)} if only is not None else {})}
    return _finish(args, doc, rows, cals)


def only_sets(text: str | None, sets: int) -> frozenset | None:
    """``--only-sets`` as set indices (None without the flag), each checked against ``--sets``."""
    if text is None:
        return None
    fix = f"pass indices from 0 to {sets - 1}, comma-separated, e.g. --only-sets 0,{sets - 1}"
    try:
        got = frozenset(int(t) for t in text.split(","))
    except ValueError:
        raise SpecError(f"{text!r} is not a list of set indices", field="--only-sets",
                        fix=fix) from None
    bad = sorted(k for k in got if not 0 <= k < sets)
    if bad:
        raise SpecError(f"set {bad[0]} is not among the family's {sets} sets",
                        field="--only-sets", fix=fix)
    return got


def _finish(args, doc: dict, rows: list, cals: dict, header: str = "") -> int:
    summary = summarise(rows)
    profile = load_cpu_profile(None)
    doc = {**doc, "machine": installed_description(),
           "cpu_profile": profile.source if profile is not None else None,
           "calibrations": {str(w): getattr(c, "source", "") for w, c in cals.items()},
           "rows": rows, "summary": summary}
    if args.out:
        write_json(args.out, doc)
    notes = []
    for cal in cals.values():
        notes += [n for n in heap_notes(doc["heap"], cal) if n not in notes]
    notes = "".join(f"note: {n}\n" for n in notes)
    emit(args, json.loads(json.dumps(doc)), header + notes + format_rows(rows, summary))
    return 0 if all(r.get("structure_match") for r in rows) else 1


def _repredict(args) -> int:
    """``--repredict FILE``: the recorded run's measurements, predicted again here."""
    src = args.repredict
    try:
        rec = json.loads(Path(src).read_text())
        seed, sets, steps, warmup = (int(rec[k]) for k in ("seed", "sets", "steps", "warmup"))
        recorded, machine = list(rec["rows"]), dict(rec["machine"])
        heap = str(rec.get("heap", "system"))      # runs before --heap kept glibc's defaults
    except OSError as e:
        raise SpecError(f"cannot read it: {e.strerror}", source=src, field="--repredict",
                        fix="pass a file written by `validate unseen --out`") from None
    except (ValueError, KeyError, TypeError) as e:
        raise SpecError(f"not a `validate unseen --out` file ({e})", source=src,
                        field="--repredict", fix="pass a file written by `validate unseen "
                        "--out`") from None
    here = installed_description()
    if machine.get("cpu_model") != here.get("cpu_model"):
        raise SpecError(f"measured on {machine.get('cpu_model')!r}, this host is "
                        f"{here.get('cpu_model')!r}: this host's calibrations would not time "
                        "that machine's runs", source=src, field="machine.cpu_model",
                        fix="re-predict on the kind of host that ran it, or run the family "
                            "here (`validate unseen`)")
    cases = unseen_cases(sets, seed=seed)
    cals = calibrations_for([c.ranks for c in cases], args.calibration, heap)
    with tempfile.TemporaryDirectory() as tmp:
        rows = repredict_rows(cases, recorded, Path(tmp), steps=steps, warmup=warmup,
                              calibrations=cals, source=src)
    doc = {"seed": seed, "sets": sets, "steps": steps, "warmup": warmup, "heap": heap,
           "repredicted_from": {"file": src, "machine": machine,
                                "summary": rec.get("summary")}}
    before = rec.get("summary") or {}
    header = (f"re-predicted from {src} (measured on {machine.get('cpu_model')}; predictions "
              f"there: MAPE {before.get('mape') or float('nan'):.1%}, tau "
              f"{before.get('kendall_tau_within_sets') or float('nan'):.2f})\n")
    rebuilt = sum(r.get("plan_layout") == "rebuilt" for r in rows)
    if rebuilt:
        header += (f"note: {rebuilt} plans rebuilt from the seed (the file predates recorded "
                   "layouts); a greedy plan made with another CPU profile than the run's may "
                   "differ from the one measured\n")
    return _finish(args, doc, rows, cals, header)
