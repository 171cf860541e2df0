"""``clusterplan validate MODEL|PLAN.json``: run a plan for real and compare with the simulator.

Exit codes: 0 when the real run's communication equals the simulator's op graph on every
rank and step; 1 when it does not, or when a rank failed, hung or crashed (the message names
the rank); 2 for bad input (the message names the field and the fix).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from simulator.errors import SpecError
from simulator.gloo_profile import load_gloo_profile

from planner.cli.output import emit
from planner.cli.validate_unseen import run_unseen
from planner.measure.heap import DEFAULT_HEAP, HEAP_HELP, HEAP_POLICIES
from planner.measure.validate.config import SCHEDULES, Scale, load_source, parse_fault, run_config
from planner.measure.validate.dlrm import is_sharding_plan, load_dlrm_config
from planner.measure.validate.dlrm_interleave import BLOCK_SECONDS
from planner.measure.validate.dlrm_report import format_dlrm_report, validate_dlrm
from planner.measure.validate.report import format_report, validate

__all__ = ["register", "run", "load_calibration"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Run an LLM plan for real on this machine: a scaled-down transformer "
                     "with the plan's tensor, pipeline and data parallelism, one spawned "
                     "process per rank (gloo). Checks that every rank's collectives and "
                     "pipeline messages (kind, count, bytes, group, order) equal the "
                     "simulator's op graph for the same plan, and prints predicted vs "
                     "measured step time. A sharding plan (clusterplan plan TABLES "
                     "--devices N --out plan.json) runs in TorchRec's "
                     "DistributedModelParallel instead, its collectives compared with the "
                     "simulator's TorchRec step. See planner/measure/validate/README.md.")
    p.add_argument("source", metavar="MODEL|PLAN.json|unseen",
                   help="model spec (YAML path or built-in name), a plan from clusterplan plan, "
                        "or `unseen`: seeded sharding plans of table sets nothing was fitted to "
                        "(--sets, --seed; planner/measure/validate/unseen_family.py)")
    p.add_argument("--parallel", metavar="SPEC",
                   help="layout to run, e.g. tp=2,pp=2,dp=1 (overrides the plan's)")
    p.add_argument("--nproc", type=int, metavar="N", help="processes (= tp·pp·dp; fills dp)")
    p.add_argument("--steps", type=int, default=None, metavar="K",
                   help="measured steps (3; unseen: 10)")
    p.add_argument("--warmup", type=int, default=None, metavar="W",
                   help="warm-up steps (1; unseen: 3)")
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--schedule", default="1f1b", choices=SCHEDULES,
                   help="pipeline schedule (1f1b is interleaved when vpp > 1)")
    p.add_argument("--order", default=None, metavar="ORDER",
                   help="rank order, innermost first (default: the plan's, else tp-cp-dp-pp)")
    p.add_argument("--recompute", choices=("none", "selective", "full"),
                   help="activation recompute (default: the spec's)")
    g = p.add_argument_group("scaled-down model (defaults keep the model's ratios)")
    for flag, what in (("layers", "blocks"), ("hidden", "hidden size"), ("heads", "heads"),
                       ("kv-heads", "KV heads"), ("ffn", "FFN width"), ("vocab", "vocabulary"),
                       ("seq", "sequence length"), ("micro-batch", "sequences per micro-batch"),
                       ("microbatches", "micro-batches per step and replica")):
        g.add_argument(f"--{flag}", type=int, default=None, metavar="N", help=what)
    p.add_argument("--dp-buckets", type=int, default=4, metavar="N",
                   help="gradient buckets per chunk (at most its blocks), as the simulator's")
    p.add_argument("--p2p-scatter-gather", action="store_true",
                   help="pipeline sends carry 1/tp of the activation, all-gathered over TP by "
                        "the receiver (Megatron's scatter-gather); default: whole activation")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="gloo timeout per call; a rank that hangs is named after it (60)")
    p.add_argument("--trace-dir", default=None, metavar="DIR",
                   help="torch.profiler Chrome traces of one extra step, per rank "
                        "(default traces/validate/<model>-<layout>-<time>/)")
    p.add_argument("--no-trace", action="store_true", help="write no profiler trace")
    p.add_argument("--inject-fault", default=None, metavar="RANK:KIND@STEP",
                   help="testing: make a rank raise, hang or exit at a step, e.g. 1:hang@1")
    p.add_argument("--calibration", metavar="FILE",
                   help="time the prediction with this machine's measured gloo profile "
                        "(`clusterplan calibrate gloo --out FILE`; default: the "
                        "localhost-gloo priors and the CPU compute profile)")
    p.add_argument("--heap", choices=HEAP_POLICIES, default=DEFAULT_HEAP, help=HEAP_HELP)
    p.add_argument("--host-probe", action=argparse.BooleanOptionalAction, default=True,
                   help="sharding plans with a calibration: time the calibration's lookup probe "
                        "before the warm-up and after the steps, and print the host's speed "
                        "then against the calibration's and the prediction at that speed "
                        "(a shared host drifts; on by default)")
    p.add_argument("--json", action="store_true", help="print JSON")
    d = p.add_argument_group("sharding plans (DLRM, TorchRec DistributedModelParallel)")
    d.add_argument("--tables", metavar="TABLES",
                   help="the plan's table spec (default: the plan's task.source)")
    d.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="global batch of the run and the prediction (default: the plan's)")
    u = p.add_argument_group("unseen plans (clusterplan validate unseen)")
    u.add_argument("--sets", type=int, default=12, metavar="N",
                   help="random table sets, up to 4 plans each (12)")
    u.add_argument("--seed", type=int, default=0, help="seed of the family (0)")
    u.add_argument("--only-sets", metavar="I,J", default=None,
                   help="run only these sets of the family (indices from 0, as in the set "
                        "names unseen-I): measure a set again that a disturbed run measured")
    u.add_argument("--rounds", type=int, default=1, metavar="K",
                   help="run the family K times, one after the other (1; a shared host's "
                        "speed drifts)")
    u.add_argument("--plan-order", default="interleaved",
                   choices=("interleaved", "alternate", "fixed"),
                   help="a set's plans in each round: side by side in one run, turns of "
                        "each in turn (interleaved, the default: the host's drift falls on all "
                        "of a set's plans alike), in turn with every other round in reverse "
                        "(alternate, before 2026-12-01) or in one order every round (fixed, "
                        "before 2026-11-29)")
    u.add_argument("--block-seconds", type=float, default=BLOCK_SECONDS, metavar="S",
                   help="interleaved: a plan's turn is about S seconds of its predicted steps, "
                        "so that only a turn's first step finds the other plans' data in the "
                        f"caches ({BLOCK_SECONDS:g}; 0: one step a turn, as on 2026-12-01)")
    u.add_argument("--measured", default="steps", choices=("steps", "round"),
                   help="a plan's measured step over several rounds: the median of all their "
                        "steps (steps, the default: as the calibration, it spans the host's "
                        "speed changes) or of its median round (round)")
    u.add_argument("--min-seconds", type=float, default=3.0, metavar="S",
                   help="measure each plan for at least S seconds of steps: a plan predicted "
                        "short runs more than --steps (up to 100), so that one slow spell of "
                        "a shared host does not cover all its steps (3; 0: --steps only)")
    u.add_argument("--out", metavar="FILE", help="write every row and the summary as JSON")
    u.add_argument("--repredict", metavar="FILE.json",
                   help="run nothing: predict the plans of a recorded run (its --out file, "
                        "made on this kind of host) again with the current model and this "
                        "host's calibrations, beside its measured times")
    p.set_defaults(func=run)


def load_calibration(path: str | None):
    """The ``--calibration`` profile (None without the flag), read before any process starts."""
    if path is None:
        return None
    return load_gloo_profile(path)


def _positive(value, flag: str, minimum: float = 1) -> None:
    if value is not None and value < minimum:
        raise SpecError(f"{value} is below {minimum:g}", field=flag,
                        fix=f"pass {flag} {minimum:g} or more")


def run(args) -> int:
    unseen = args.source == "unseen"
    if args.steps is None:
        args.steps = 10 if unseen else 3
    if args.warmup is None:
        args.warmup = 3 if unseen else 1
    if unseen:
        return run_unseen(args)
    if is_sharding_plan(args.source):
        return _run_dlrm(args)
    if args.backend != "gloo":
        raise SpecError("only gloo runs in this slice (nccl needs CUDA GPUs and a device "
                        "placement the worker does not do yet)", field="--backend",
                        fix="use --backend gloo")
    _positive(args.steps, "--steps")
    _positive(args.warmup, "--warmup", 0)
    _positive(args.dp_buckets, "--dp-buckets")
    if not args.timeout > 0:
        raise SpecError(f"{args.timeout} is not a positive number of seconds", field="--timeout",
                        fix="pass e.g. --timeout 60")
    fault = parse_fault(args.inject_fault)
    spec, par, order, _source = load_source(args.source)
    scale = Scale(layers=args.layers, hidden=args.hidden, heads=args.heads,
                  kv_heads=args.kv_heads, ffn=args.ffn, vocab=args.vocab, seq=args.seq,
                  micro_batch=args.micro_batch if args.micro_batch is not None else 1,
                  microbatches=args.microbatches)
    cfg = run_config(spec, par, parallel_text=args.parallel, nproc=args.nproc, scale=scale,
                     order=args.order or order, schedule=args.schedule,
                     recompute=args.recompute, steps=args.steps, warmup=args.warmup,
                     dp_buckets=args.dp_buckets, p2p_scatter_gather=args.p2p_scatter_gather,
                     timeout_s=args.timeout, fault=fault)
    cfg = replace(cfg, heap=args.heap)
    if fault is not None and fault.rank >= cfg.world:
        raise SpecError(f"rank {fault.rank} is outside 0..{cfg.world - 1}",
                        field="--inject-fault", fix=f"name a rank below {cfg.world}")
    if not args.no_trace:
        p = cfg.parallel
        trace_dir = args.trace_dir or str(
            Path("traces") / "validate" / f"{spec.model.name}-tp{p.tp}pp{p.pp}dp{p.dp}"
            f"vpp{p.vpp}-{time.strftime('%Y%m%d-%H%M%S')}")
        cfg = replace(cfg, trace_dir=trace_dir)
    d = validate(cfg, calibration=load_calibration(args.calibration))
    emit(args, d, format_report(d))
    return 0 if d["structure"]["match"] else 1


def _run_dlrm(args) -> int:
    """``validate PLAN.json`` for an embedding sharding plan (TorchRec on gloo)."""

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
    calibration = load_calibration(getattr(args, "calibration", None))
    cfg = load_dlrm_config(args.source, tables=args.tables, nproc=args.nproc,
                           batch_size=args.batch_size, steps=args.steps, warmup=args.warmup,
                           timeout_s=args.timeout, fault=fault, heap=args.heap,
                           host_probe=args.host_probe and calibration is not None)
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
