"""The shared frame of the GPU microbenchmark drivers (``python -m planner.measure...``): their
common arguments and checks, the device and machine facts of a run, and a loop over measured
parts under one wall-time budget that writes each part's CSV and ``meta.json``."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from planner.measure.compute.gpu_timing import run_meta, torch_module, write_csv

__all__ = ["driver_parser", "check_driver_args", "start_driver", "open_driver", "run_parts"]


def driver_parser(module: str, doc: str, *, samples: int, budget_s: float
                  ) -> argparse.ArgumentParser:
    """The arguments every GPU microbenchmark driver takes: ``--out``, ``--quick``,
    ``--device``, ``--samples`` and ``--budget-s`` (wall seconds for all its parts)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="directory to write the CSVs to")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (a smoke run, any device)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--samples", type=int, default=samples,
                    help="samples per measurement (median)")
    ap.add_argument("--budget-s", type=float, default=budget_s,
                    help="wall seconds for all parts; a part stops adding rows past its share")
    return ap


def check_driver_args(ap: argparse.ArgumentParser, args, *extra: tuple[str, float]) -> None:
    """Exit 2 naming the flag for a non-positive ``--samples``, ``--budget-s`` or ``extra``
    (flag, value) pair, or an ``--out`` that cannot be a folder; creates ``--out``."""
    for name, v in (("--samples", args.samples), ("--budget-s", args.budget_s), *extra):
        if not (math.isfinite(v) and v > 0):
            ap.error(f"{name} must be a positive number, got {v}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {args.out}: cannot create the folder ({e.strerror}); name a folder")


def start_driver(module: str, args, argv: list[str] | None) -> tuple:
    """(device, meta) of a driver run: the device ``--device`` names (CUDA when available) and
    the machine facts with the command line as typed."""
    torch = torch_module()
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = run_meta(dev, args, " ".join(
        ["python", "-m", module, *(argv if argv is not None else sys.argv[1:])]))
    return dev, meta


def open_driver(module: str, doc: str, argv: list[str] | None, *, samples: int,
                budget_s: float, attention_backend: str = "n/a") -> tuple:
    """(args, device, meta) of a driver that takes only the common arguments
    (:func:`driver_parser`), checked (:func:`check_driver_args`)."""
    ap = driver_parser(module, doc, samples=samples, budget_s=budget_s)
    args = ap.parse_args(argv)
    check_driver_args(ap, args)
    args.attention_backend = attention_backend
    return (args, *start_driver(module, args, argv))


def run_parts(dev, args, meta: dict, parts) -> None:
    """Run ``parts`` ``(name, measure, share)`` in order, each until its share of the wall-time
    budget left (``measure(dev, quick=, samples=, deadline=)`` returns rows); write
    ``name.csv`` and ``meta.json`` into ``--out`` and print a line per part."""
    start = time.monotonic()
    for name, measure, share in parts:
        t0 = time.monotonic()
        left = max(0.0, args.budget_s - (t0 - start))
        rows = measure(dev, quick=args.quick, samples=args.samples, deadline=t0 + share * left)
        write_csv(args.out / f"{name}.csv", rows)
        meta[f"{name}_rows"] = len(rows)
        meta[f"{name}_wall_s"] = round(time.monotonic() - t0, 1)
        print(f"{name}: {len(rows)} rows in {meta[f'{name}_wall_s']} s", flush=True)
        if dev.type == "cuda":
            torch_module().cuda.empty_cache()
    meta["wall_s"] = round(time.monotonic() - start, 1)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
