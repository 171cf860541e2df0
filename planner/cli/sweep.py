"""``clusterplan sweep GRID.yaml``: run a grid of simulations or plans into one table."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path

from simulator.errors import SpecError

from planner.cli.output import emit
from planner.sweep.grid import load_sweep
from planner.sweep.run import (bar_progress, check_plot_columns, plot_table, run_sweep,
                               write_table)

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Run one clusterplan command (simulate, plan, collective, ...) at every "
                     "point of a grid and collect the JSON results into one table (CSV or "
                     "parquet) and an optional plot. Resumable: finished points are kept in "
                     "OUT.partial.jsonl and skipped when the same sweep is started again. "
                     "Exit code 1 when any point failed or timed out (its row says why). "
                     "Grid format: planner/sweep/grid.py.")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("example:\n  clusterplan sweep grid.yaml --out results.csv --plot results.png\n"
                "  clusterplan sweep grid.yaml --ray local       # or --ray HOST:6379")
    p.add_argument("grid", metavar="GRID.yaml", help="the sweep file")
    p.add_argument("--out", metavar="FILE", default=None,
                   help="table to write (.csv or .parquet; default GRID.csv beside the grid)")
    p.add_argument("--plot", metavar="FILE", help="figure to write (needs plot: in the grid)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes of the local pool (default: the CPUs)")
    p.add_argument("--ray", metavar="ADDRESS",
                   help="run on Ray: 'local' starts a local instance, else the head's address")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop a point after this many seconds and record it as timed out "
                        "(the sweep goes on; a rerun tries it again)")
    p.add_argument("--restart", action="store_true",
                   help="forget finished points of an earlier, interrupted run")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    spec = load_sweep(args.grid)
    if args.workers is not None and args.workers < 1:
        raise SpecError(f"--workers {args.workers}", field="--workers", fix="use 1 or more")
    out = Path(args.out) if args.out else Path(args.grid).with_suffix(".csv")
    if not out.resolve().parent.is_dir():
        raise SpecError(f"directory of {out} does not exist", field="--out",
                        fix="create it or write elsewhere")
    if out.suffix not in (".csv", ".parquet"):
        raise SpecError(f"unknown table format {out.suffix!r}", field="--out",
                        fix="end the file name in .csv or .parquet")
    if args.plot and not spec.plot:
        raise SpecError("--plot needs a plot: section in the grid", source=spec.source,
                        field="plot", fix="add plot: {x: ..., y: ...}")
    timeout = _timeout(args.timeout)
    ckpt = out.with_name(out.name + ".partial.jsonl")
    if args.restart and ckpt.exists():
        ckpt.unlink()
    table, stats = run_sweep(spec, workers=args.workers, ray_address=args.ray, checkpoint=ckpt,
                             progress=bar_progress, command=args.main, timeout_s=timeout)
    if args.plot:                   # before any file is written: a bad column keeps the old ones
        check_plot_columns(table, spec.plot)
    write_table(table, out)
    if args.plot:
        plot_table(table, spec.plot, Path(args.plot))
    ckpt.unlink(missing_ok=True)
    data = {"out": str(out), "plot": args.plot, **stats,
            "backend": f"ray ({args.ray})" if args.ray else "process pool"}
    human = (f"{stats['points']} points ({stats['run']} run now, {stats['resumed']} resumed, "
             f"{stats['failed']} failed, {stats['timed_out']} of them timed out) on the "
             f"{data['backend']} → {out}"
             + (f", {args.plot}" if args.plot else ""))
    if stats["failed"]:
        first = table[~table.ok].iloc[0]
        human += f"\n  first failure, point {first.point}: {first.error}"
    emit(args, data, human)
    return 1 if stats["failed"] else 0


#: the longest a point may be given (seconds): a finite bound
MAX_TIMEOUT_S = 7 * 86_400.0


def _timeout(value: float | None) -> float | None:
    """``--timeout`` checked: positive, finite, and enforceable on this platform."""
    if value is None:
        return None
    if not 0 < value <= MAX_TIMEOUT_S:
        raise SpecError(f"--timeout must be positive seconds up to {MAX_TIMEOUT_S:,.0f}, got "
                        f"{value}", field="--timeout", fix="pass seconds, e.g. --timeout 600")
    if not hasattr(signal, "SIGALRM"):
        raise SpecError("per-point timeouts need POSIX signals, which this platform lacks",
                        field="--timeout", fix="drop --timeout")
    return value
