"""``clusterplan calibrate steps``: a GPU's compute profile and host floor from measured steps
(planner/measure/compute/fit_steps.py), with the held-out split's error."""

from __future__ import annotations

import argparse
import shlex
from dataclasses import fields

import numpy as np
import yaml

from simulator.compute import load_compute_profile
from simulator.errors import SpecError
from simulator.fileio import check_writable

from planner.cli.output import atomic_write, emit, progress_line
from planner.llm.fidelity import VTRAIN_DIR, load_set, set_info
from planner.measure.compute import fit_steps as fs
from planner.model.llm.host import load_host_overhead

__all__ = ["add_parser", "run_steps"]

NAMES = tuple(f.name for f in fields(fs.StepFitParams))


def add_parser(csub) -> argparse.ArgumentParser:
    """The ``steps`` subcommand of ``calibrate``."""
    s = csub.add_parser("steps", help="fit a GPU's compute profile and host floor to measured "
                                      "training steps (vTrain's single-node A100 runs)",
                        description="Fit GEMM efficiency (top and latency), memory-bound "
                                    "efficiency, kernel launch time and the host's time per "
                                    "eager op to measured step times, on a fixed training split "
                                    "(SHA-256 of each row's configuration; a fifth held out), "
                                    "and report the held-out rows' error. See "
                                    "planner/measure/compute/fit_steps.py.")
    s.add_argument("--set", default="vtrain-single",
                   help="published set to fit to (a name or a traces/published-style YAML; "
                        "default %(default)s)")
    s.add_argument("--vtrain-dir", default=str(VTRAIN_DIR),
                   help="folder of the vTrain CSVs (default ../shared/data/vtrain beside the "
                        "repository)")
    s.add_argument("--gpu", default="a100-80gb", help="catalog GPU kind (default %(default)s)")
    s.add_argument("--every", type=int, default=1,
                   help="fit on every N-th training row (faster; the report covers all rows)")
    s.add_argument("--max-evals", type=int, default=150,
                   help="simulations of the training rows at most (default %(default)s)")
    s.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                   help="hold a parameter (gemm_top, gemm_latency_s, mem_top, launch_s, "
                        "host_op_s) at a value instead of fitting it (repeatable)")
    s.add_argument("--out", metavar="FILE", help="efficiency YAML to write "
                                                 "(traces/efficiency/<gpu>.yaml format)")
    s.add_argument("--host-out", metavar="FILE", help="host-overhead YAML to write "
                                                      "(traces/calibration/ format)")
    s.add_argument("--note", default="",
                   help="why parameters were held fixed, or anything else to record in the files")
    s.add_argument("--json", action="store_true")
    return s


def _fixed(items: list[str]) -> dict[str, float]:
    """``--fix NAME=VALUE`` items as ``{name: value}``; SpecError naming the bad one."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = float("nan")
        if name not in NAMES or not eq or not np.isfinite(v) or v <= 0:
            raise SpecError(f"--fix {item!r} is not NAME=POSITIVE_NUMBER", field="--fix",
                            fix=f"write e.g. --fix gemm_top=0.8, NAME one of {', '.join(NAMES)} "
                                "(seconds for *_s)")
        out[name] = v
    return out


def _by_group(rows: list[dict], pred: np.ndarray) -> dict:
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(r["group"], []).append(i)
    meas = np.array([r["measured_s"] for r in rows])
    return {g: fs.errors_summary(meas[ix], pred[ix]) for g, ix in sorted(groups.items())}


def run_steps(args) -> int:
    """Fit, report the training and held-out errors, and write the files asked for."""
    if args.every < 1 or args.max_evals < 1:
        raise SpecError("--every and --max-evals must be at least 1", field="--every",
                        fix="pass positive integers")
    fixed = _fixed(args.fix)
    load_compute_profile(args.gpu)                      # a known GPU kind, before the work
    for path, flag in ((args.out, "--out"), (args.host_out, "--host-out")):
        if path:
            check_writable(path, field=flag)
    rows = load_set(args.set, vtrain_dir=args.vtrain_dir)
    train, test = fs.split(rows)
    fit_rows = train[::args.every]
    progress_line(f"fitting {args.gpu} to {len(fit_rows)} of {len(rows)} rows "
                  f"({len(test)} held out); a line every 10 simulations of them")

    def tick(n: int, mape: float) -> None:
        if n % 10 == 0:
            progress_line(f"  {n} simulations, training MAPE {mape:.1%}")
    params, summary = fs.fit_steps(args.gpu, fit_rows, fixed=fixed, max_evals=args.max_evals,
                                   progress=tick)
    prof, host = fs.candidate(args.gpu, params)
    pred = {name: fs.predict(rs, prof, host) for name, rs in (("train", train), ("held_out", test))}
    report = {"set": set_info(args.set)["source"], "gpu": args.gpu,
              "split": "held out: SHA-256 of 'group|row' = 0 mod 5",
              "fitted_on": (f"fitted on {len(fit_rows)} of the {len(train)} training rows"
                            + (f" (every {args.every}th)" if args.every > 1 else "")),
              "fixed": fixed, "parameters": {k: getattr(params, k) for k in NAMES},
              "evaluations": summary["evaluations"]}
    for name, rs in (("train", train), ("held_out", test)):
        meas = np.array([r["measured_s"] for r in rs])
        report[name] = fs.errors_summary(meas, pred[name])
        report[f"{name}_by_group"] = _by_group(rs, pred[name])
    _write(args, params, report)
    emit(args, report, _text(report, params))
    return 0


def _command(args) -> str:
    """The command line that reproduces this fit (defaults left out)."""
    words = ["clusterplan", "calibrate", "steps"]
    for flag, value, default in (("--set", args.set, "vtrain-single"),
                                 ("--gpu", args.gpu, "a100-80gb"),
                                 ("--every", args.every, 1),
                                 ("--max-evals", args.max_evals, 150)):
        if value != default:
            words += [flag, str(value)]
    for item in args.fix:
        words += ["--fix", item]
    for flag, value in (("--out", args.out), ("--host-out", args.host_out)):
        if value:
            words += [flag, value]
    return " ".join(shlex.quote(w) for w in words)


def _provenance(args, report: dict) -> str:
    t, h = report["train"], report["held_out"]
    title = set_info(args.set)["title"]
    held = ", ".join(f"{k}={v:g}" for k, v in report["fixed"].items()) or "nothing"
    return (f"Fitted by `{_command(args)}` on {fs.stamp()} to {report['set']} ({title}): "
            f"{report['fitted_on']}; {h['rows']} rows held out ({report['split']}). "
            f"Training MAPE {t['mape']:.1%}, held-out MAPE {h['mape']:.1%} "
            f"(mean {h['mean_error']:+.1%}, worst {h['worst']:+.1%}). "
            f"Held fixed: {held}"
            f"{'. ' + args.note if args.note else ''}. Method: "
            "planner/measure/compute/fit_steps.py. Nothing else was read: the multi-node vTrain "
            "set, Narayanan 2021 and Korthikanti 2022 stay validation data.")


def _write(args, params: fs.StepFitParams, report: dict) -> None:
    source = _provenance(args, report)
    if args.out:
        free = [k for k in NAMES if k not in report["fixed"]]
        doc = fs.profile_document(args.gpu, params, source=source,
                                  notes=f"{fs.describe(params)}. Fitted: {', '.join(free)}; the "
                                  "fp16/bf16 GEMM curves, the memory efficiency and the launch "
                                  "time are written from them; other dtypes keep the earlier "
                                  "file's curves (not timed by these runs).")
        head = (f"# Compute efficiency of {args.gpu}, FITTED to measured training steps "
                "(see source:)\n")
        atomic_write(args.out, head + _yaml(doc))
        load_compute_profile(args.gpu, args.out)           # the file loads as written
    if args.host_out:
        doc = fs.host_document(params, source=source)
        doc.update({"held_out": report["held_out"], "train": report["train"]})
        atomic_write(args.host_out, "# Host floor of eager PyTorch per transformer block (s); "
                     "see planner/model/llm/host.py\n" + _yaml(doc))
        load_host_overhead(args.host_out)


def _yaml(doc: dict) -> str:
    return yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def _text(report: dict, params: fs.StepFitParams) -> str:
    lines = [f"fitted {report['gpu']} to {report['set']}: {fs.describe(params)}",
             f"  {'split':<22}{'rows':>6}{'MAPE':>8}{'mean':>8}{'worst':>8}"]
    for name in ("train", "held_out"):
        for g, e in [(name, report[name])] + [(f"  {k}", v) for k, v in
                                              report[f"{name}_by_group"].items()]:
            lines.append(f"  {g:<22}{e['rows']:>6}{e['mape']:>8.1%}{e['mean_error']:>+8.1%}"
                         f"{e['worst']:>+8.1%}")
    return "\n".join(lines)
