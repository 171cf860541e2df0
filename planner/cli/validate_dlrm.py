"""``clusterplan validate PLAN.json`` for a sharding plan (see :mod:`planner.measure.validate.dlrm`)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from simulator.errors import SpecError

__all__ = ["run_validate_dlrm"]


def run_validate_dlrm(args) -> int:
    from planner.cli.main import emit

    from planner.measure.validate.config import parse_fault
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import format_dlrm_report, validate_dlrm
    if args.backend != "gloo":
        raise SpecError("only gloo runs DLRM plans here (TorchRec on CPU)", field="--backend",
                        fix="use --backend gloo")
    for flag, v, lo in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0)):
        if v < lo:
            raise SpecError(f"{v} is below {lo}", field=flag, fix=f"pass {flag} {lo} or more")
    if not args.timeout > 0:
        raise SpecError(f"{args.timeout} is not a positive number of seconds", field="--timeout",
                        fix="pass e.g. --timeout 60")
    fault = parse_fault(args.inject_fault)
    from planner.cli.validate import load_calibration
    calibration = load_calibration(getattr(args, "calibration", None))
    cfg = load_dlrm_config(args.source, tables=args.tables, nproc=args.nproc,
                           batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                           timeout_s=args.timeout, fault=fault)
    if fault is not None and fault.rank >= cfg.world:
        raise SpecError(f"rank {fault.rank} is outside 0..{cfg.world - 1}",
                        field="--inject-fault", fix=f"name a rank below {cfg.world}")
    if not args.no_trace:
        trace_dir = args.trace_dir or str(
            Path("traces") / "validate" / f"{cfg.model.name}-dlrm{cfg.world}-"
            f"{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = replace(cfg, trace_dir=trace_dir)
    d = validate_dlrm(cfg, calibration=calibration)
    emit(args, d, format_dlrm_report(d))
    return 0 if d["structure"]["match"] else 1
