"""``clusterplan fidelity``: iteration-time error against published LLM runs."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from simulator.fileio import atomic_write_text

from planner.cli.output import emit
from planner.llm.fidelity import (
    VTRAIN_DIR,
    kendall_tau_by_group,
    load_set,
    row_command,
    row_spec_document,
    run_set,
    set_info,
)
from planner.progress import progress

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Simulate the published configurations of Narayanan 2021 "
                     "Table 1, Korthikanti 2022 and the vTrain multi-node runs, each row "
                     "through the same spec path as 'clusterplan simulate', and print the "
                     "error per row and the MAPE per set. The sets, their trainer presets "
                     "and assumptions are data: traces/published/*.yaml.")
    p.add_argument("--set", action="append",
                   choices=("narayanan", "korthikanti", "vtrain", "vtrain-single"),
                   help="default: narayanan, korthikanti, vtrain (vtrain-single: vTrain's 1,440 "
                        "one-node runs)")
    p.add_argument("--vtrain-dir", default=str(VTRAIN_DIR),
                   help="folder with ground_truth_multi.csv (default ../shared/data/vtrain)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each set")
    p.add_argument("--emit-specs", metavar="DIR", default=None,
                   help="also write each row as a model spec file and its simulate command "
                        "line (DIR/commands.sh)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    """Simulate the published rows of each chosen set and print the errors."""
    return fidelity(args, emit)


def fidelity(args, emit) -> int:
    """Simulate the published sets' rows through the public spec path; print errors per row."""
    sets = args.set or ["narayanan", "korthikanti", "vtrain"]
    frames, info = [], {}
    for name in sets:
        rows = load_set(name, vtrain_dir=args.vtrain_dir)
        if args.limit:
            rows = rows[: args.limit]
        if args.emit_specs:
            _write_row_specs(rows, Path(args.emit_specs))
        info[rows[0]["set"] if rows else name] = set_info(name)
        with progress(len(rows), f"fidelity {name}") as advance:
            frames.append(run_set(rows, progress=lambda k, n: advance()))
    df = pd.concat(frames, ignore_index=True)
    summary = {s: {"mape": float(g.error.abs().mean()), "mean_error": float(g.error.mean()),
                   "rows": len(g), **info.get(s, {})}
               for s, g in df.groupby("set", sort=False)}
    if "vtrain" in summary:
        summary["vtrain"]["kendall_tau_by_group"] = kendall_tau_by_group(df[df.set == "vtrain"])
    lines = [f"{'set':<14}{'row':<38}{'measured':>11}{'predicted':>11}{'error':>9}"]
    for r in df.itertuples():
        lines.append(f"{r.set:<14}{r.row:<38}{r.measured_s:>10.3f}s{r.predicted_s:>10.3f}s"
                     f"{r.error * 100:>8.1f}%")
    for s, v in summary.items():
        extra = ""
        if "kendall_tau_by_group" in v:
            extra = "  Kendall tau " + ", ".join(f"{g} {t:.2f}" for g, t in
                                                  v["kendall_tau_by_group"].items())
        lines.append(f"{s}: MAPE {v['mape'] * 100:.1f}% (mean {v['mean_error'] * 100:+.1f}%) "
                     f"over {v['rows']} rows, trainer "
                     f"{v.get('trainer', {}).get('preset', '?')} ({v.get('source', '')}){extra}")
    if args.emit_specs:
        lines.append(f"specs and commands: {args.emit_specs}/")
    emit(args, {"rows": df.to_dict(orient="records"), "summary": summary}, "\n".join(lines))
    return 0


def _write_row_specs(rows: list[dict], folder: Path) -> None:
    """Each row as a spec file plus its line in ``commands.sh``: the public path, by hand."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for r in rows:
        name = f"{r['set']}-{r['row']}".replace(" ", "-").replace("/", "-") + ".yaml"
        atomic_write_text(folder / name, yaml.safe_dump(row_spec_document(r), sort_keys=False),
                          field="--emit-specs")
        lines.append(row_command(r, str(folder / name)))
    cmds = folder / "commands.sh"
    old = cmds.read_text().splitlines() if cmds.exists() else []
    atomic_write_text(cmds, "\n".join(dict.fromkeys(old + lines)) + "\n", field="--emit-specs")
