"""``clusterplan diagnose``: name straggling ranks from per-rank traces of a run."""

from __future__ import annotations

import argparse

from simulator.errors import SpecError
from simulator.faults import find_stragglers
from simulator.trace_read import busy_by_rank
from simulator.units import format_time

from planner.cli.output import emit

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Read Chrome/Perfetto traces (clusterplan simulate --trace, or "
                     "torch.profiler traces of a real run, one file per rank), sum "
                     "each rank's compute time and name the ranks that stand out.")
    p.add_argument("traces", nargs="+", metavar="TRACE.json")
    p.add_argument("--min-excess", type=float, default=0.02,
                   help="flag ranks at least this much above the median (default 0.02 = 2%%)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    if not 0 <= args.min_excess < 10:
        raise SpecError(f"--min-excess {args.min_excess} is not a fraction", field="--min-excess",
                        fix="pass e.g. 0.05 for 5%")
    busy = busy_by_rank(args.traces)
    if not busy:
        raise SpecError("no compute events in the traces", source=", ".join(args.traces),
                        fix="trace compute (torch.profiler with CPU/CUDA activities)")
    found = find_stragglers(busy, min_excess=args.min_excess)
    med = sorted(busy.values())[len(busy) // 2]
    lines = [f"{len(busy)} ranks, median compute {format_time(med)} per trace"]
    lines += [f"  straggler: rank {f['rank']} {format_time(f['busy_s'])} (×{f['slowdown']:.3f})"
              for f in found] or ["  no rank stands out"]
    emit(args, {"busy_s_by_rank": {str(r): v for r, v in busy.items()}, "stragglers": found},
          "\n".join(lines))
    return 0
