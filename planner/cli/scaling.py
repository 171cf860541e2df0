"""``clusterplan scaling``: MFU against GPU count, with the share of each mechanism that makes it
fall (planner/llm/scaling.py: ECMP collisions, GPU speed variability, host stalls, exposed
DP/PP communication)."""

from __future__ import annotations

import argparse
from dataclasses import replace

from simulator.errors import SpecError
from simulator.topology import Routing
from simulator.units import format_time, parse_bandwidth, parse_time

from planner.cli.output import emit
from planner.llm.scaling import BATCH_POLICIES, MECHANISMS, ScalingSetup, run_scaling
from planner.model.llm.spec import ParallelSpec, load_llm_spec, parse_parallel
from planner.model.llm.trainer import PRESETS, trainer_from_args
from planner.model.variability import STALL_MODELS, GpuVariability, HostStalls
from planner.progress import progress

__all__ = ["register", "run"]

DEFAULT_GPUS = "256,512,1024,2048,4096,8192,16384"
_SHORT = {"ecmp": "ECMP", "variability": "GPU var", "stalls": "stalls", "exposed": "exposed"}


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = (
        "Weak scaling of an LLM: MFU at each GPU count with tp·cp·pp fixed and dp grown, and "
        "the MFU each mechanism costs, found by switching it off with the others on "
        "(leave-one-out). Mechanisms: ecmp (hashed equal-cost paths), variability (GPU speed "
        "spread), stalls (unsynchronised per-process pauses), exposed (DP/PP communication "
        "a trainer does not overlap). Sources and defaults: planner/llm/scaling.py and "
        "planner/model/variability.py.")
    p.add_argument("model", metavar="MODEL", help="LLM spec: built-in name or YAML file")
    p.add_argument("--topology", required=True, metavar="NAME|FILE",
                   help="topology, resized to each GPU count (its network: section is replaced "
                        "by --qps/--hash-seed/--port-bandwidth)")
    p.add_argument("--gpus", default=DEFAULT_GPUS, metavar="N,N,...",
                   help=f"GPU counts (default {DEFAULT_GPUS})")
    p.add_argument("--trainer", choices=tuple(PRESETS), metavar="NAME",
                   help=f"trainer preset: {', '.join(PRESETS)} (default: the spec's)")
    p.add_argument("--trainer-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a trainer setting, e.g. grad_reduce=overlapped")
    p.add_argument("--parallel", metavar="SPEC",
                   help="tp, cp, pp, vpp, fsdp, ep (dp is grown); default: the spec's parallel:")
    p.add_argument("--batch", default="per-replica", choices=BATCH_POLICIES,
                   help="per-replica (default): sequences per DP replica fixed, the global "
                        "batch grows with dp; fixed: the spec's global batch at every size")
    p.add_argument("--per-replica", type=int, metavar="N",
                   help="sequences per DP replica (default: the spec's global batch over the "
                        "dp of the smallest GPU count)")
    p.add_argument("--micro-batch", type=int, metavar="N", help="sequences per micro-batch")
    p.add_argument("--mechanisms", default=",".join(MECHANISMS), metavar="LIST",
                   help=f"mechanisms on (default all: {','.join(MECHANISMS)}); the others are "
                        "off in every run")
    g = p.add_argument_group("ECMP (topology network: section)")
    g.add_argument("--qps", type=int, default=1, metavar="N",
                   help="hashed sub-flows per flow (NCCL_IB_QPS_PER_CONNECTION, default 1; "
                        "Llama 3 used 16 flows per GPU pair)")
    g.add_argument("--hash-seed", type=int, default=0, metavar="N",
                   help="first ECMP hash seed (sample k uses N + k)")
    g.add_argument("--port-bandwidth", metavar="BW",
                   help="uplink port rate (default: the NIC rate), e.g. 400Gb/s")
    g = p.add_argument_group("GPU speed variability")
    g.add_argument("--gpu-sigma", type=float, default=GpuVariability().sigma, metavar="S",
                   help="spread of ln(slowdown) per GPU (default 0.0148: Sinha et al. SC'22)")
    g.add_argument("--straggler-hosts", default="0", metavar="FRACTION[:FACTOR]",
                   help="hosts slower by FACTOR (default 1.10) with probability FRACTION "
                        "(default 0; MegaScale reports 0.005:1.10)")
    g = p.add_argument_group("host stalls")
    g.add_argument("--stall-model", default="gc", choices=STALL_MODELS,
                   help="gc: a pause of --stall-duration every --stall-period steps per process "
                        "(default); exponential: a pause of mean --stall-mean every step")
    g.add_argument("--stall-duration", default="1.45s", metavar="TIME",
                   help="gc pause (default 1.45s: staggered full CPython collections, "
                        "marin issue 9205)")
    g.add_argument("--stall-period", type=float, default=265.0, metavar="STEPS",
                   help="steps between a process's pauses (default 265)")
    g.add_argument("--stall-mean", default="5ms", metavar="TIME",
                   help="mean pause per step of the exponential model (default 5ms)")
    g.add_argument("--stall-steps", type=int, default=256, metavar="N",
                   help="sampled steps averaged (default 256)")
    p.add_argument("--samples", type=int, default=4, metavar="K",
                   help="seeds averaged for the random mechanisms (default 4)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="first seed of the GPU and stall draws (sample k uses N + k)")
    p.add_argument("--order", default="tp-cp-dp-pp", help="placement of parallel axes")
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved"))
    p.add_argument("--mode", default="auto", choices=("auto", "explicit", "symmetric"))
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _int_list(text: str) -> tuple[int, ...]:
    """``'256,512'`` → (256, 512) (``--gpus``)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise SpecError(f"--gpus {text!r} is not a list of integers", field="--gpus",
                        fix="write e.g. --gpus 256,512,1024") from None


def _stragglers(text: str) -> tuple[float, float]:
    """``'0.005:1.10'`` → (fraction of hosts, slowdown factor); the factor defaults to 1.10."""
    frac, _, factor = text.partition(":")
    try:
        return float(frac), float(factor) if factor else 1.10
    except ValueError:
        raise SpecError(f"--straggler-hosts {text!r} is not FRACTION[:FACTOR]",
                        field="--straggler-hosts", fix="write e.g. 0.005:1.10") from None


def setup_from_args(args) -> ScalingSetup:
    """The :class:`ScalingSetup` the command line describes."""
    spec = load_llm_spec(args.model)
    spec = replace(spec, trainer=trainer_from_args(spec.trainer, args.trainer, args.trainer_set))
    if args.micro_batch:
        spec = replace(spec, training=replace(spec.training, micro_batch_size=args.micro_batch))
    par = parse_parallel(args.parallel, spec.parallel) if args.parallel \
        else (spec.parallel or ParallelSpec())
    frac, factor = _stragglers(args.straggler_hosts)
    mech = tuple(m.strip() for m in args.mechanisms.split(",") if m.strip())
    return ScalingSetup(
        spec=spec, topology=args.topology, gpus=_int_list(args.gpus), parallel=par,
        mechanisms=mech, batch=args.batch, per_replica=args.per_replica,
        routing=Routing(mode="ecmp", qps=args.qps, seed=args.hash_seed,
                        port_Bps=parse_bandwidth(args.port_bandwidth, field="--port-bandwidth")
                        if args.port_bandwidth else None),
        variability=GpuVariability(sigma=args.gpu_sigma, straggler_fraction=frac,
                                   straggler_factor=factor, seed=args.seed),
        stalls=HostStalls(model=args.stall_model,
                          duration_s=parse_time(args.stall_duration, field="--stall-duration"),
                          period_steps=args.stall_period,
                          mean_s=parse_time(args.stall_mean, field="--stall-mean"),
                          steps=args.stall_steps, seed=args.seed),
        samples=args.samples, order=args.order, schedule=args.schedule, mode=args.mode)


def _text(d: dict) -> str:
    """The sweep as a table: MFU with all mechanisms on and off, and each one's MFU cost."""
    lay, b = d["layout"], d["batch"]
    batch = (f"{b['sequences_per_replica']} sequences per DP replica (global batch grows with "
             "dp)" if b["policy"] == "per-replica"
             else f"global batch fixed at {b['global_batch_size']}")
    mech = d["mechanisms"]
    lines = [(f"{d['model']} on {d['topology']} under {d['trainer']['preset']}: "
              f"tp={lay['tp']} cp={lay['cp']} pp={lay['pp']} vpp={lay['vpp']}, dp grown; {batch}"),
             (f"mechanisms on: {', '.join(mech) or 'none'}; {d['samples']} sample(s); "
              "loss = MFU points lost to each (leave-one-out)"),
             f"{'GPUs':>7}{'dp':>6}{'batch':>8}{'step':>10}{'MFU':>8}{'no-mech':>9}  "
             + "".join(f"{_SHORT[m]:>9}" for m in mech) + f"{'interact':>10}"]
    for r in d["rows"]:
        lines.append(
            f"{r['gpus']:>7}{r['parallel']['dp']:>6}{r['global_batch_size']:>8}"
            f"{format_time(r['step_time_s']):>10}{r['mfu']:>8.1%}{r['baseline']['mfu']:>9.1%}  "
            + "".join(f"{r['mechanisms'][m]['loss_mfu_points']:>9.2f}" for m in mech)
            + f"{r['interaction_mfu_points']:>10.2f}")
        if not r["memory_fits"]:
            lines[-1] += "  (out of memory)"
    return "\n".join(lines)


def run(args) -> int:
    """Run the sweep and print the table (or JSON)."""
    setup = setup_from_args(args)
    with progress(len(setup.gpus), "scaling") as advance:
        d = run_scaling(setup, advance)
    emit(args, d, _text(d))
    return 0
