"""``clusterplan plan``: shard embedding tables over N GPUs.

::

    clusterplan plan TABLES --devices N [--topology NAME] [--planner NAME] [--seed S]
                     [--time-limit S] [--memory BYTES] [--sharding-types LIST]
                     [--batch-size B] [--optimizer OPT] [--simulate] [--measure [--repeats K]]
                     [--json] [--out FILE]

``TABLES`` is a built-in spec (``criteo-dlrm``, ``mlperf-dcnv2``), a YAML spec or a CSV of tables
(see :mod:`planner.model.tables.spec_file`). Prints per-rank cost and memory (``--json``: one
object, the plan file's content); ``--out`` writes the plan JSON atomically. Exit codes: 0 valid
plan, 1 the planner produced an invalid plan (over memory; try another planner), 2 bad input or
a task that cannot fit (one line naming the file, the field, the table, the numbers and the fix).

Also here: ``clusterplan calibrate embedding``
(:func:`run_calibrate_embedding`, the CPU profile of the cost model,
:mod:`planner.measure.tables.fit`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from simulator.errors import ClusterplanError, SpecError
from simulator.topology import sized_topology_ref
from simulator.fileio import dumps_json, parse_yaml, read_text
from simulator.units import format_bytes, format_time, parse_bytes

from planner.cli.dmt import add_dmt_arguments, dmt_section, format_dmt
from planner.cli.options import with_dlrm_trainer
from planner.cli.planner_choice import planner_arguments, planner_from_args
from planner.cli.output import (add_timings_option, progress_line, report_timings,
                                split_timings, write_json)
from planner.machine import make_cache_dir
from planner.measure.heap import DEFAULT_HEAP, HEAP_HELP, HEAP_POLICIES
from planner.measure.tables.fit import calibrate, refit_profile, write_profile
from planner.measure.tables.plans import cpu_topology_ref, format_measurement, measure_plan
from planner.model.tables.cpu_profile import host_profile_path, load_cpu_profile
from planner.model.tables.shards import parse_sharding_types
from planner.model.tables.spec import OPTIMIZERS
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask
from planner.workloads.dlrm.step import simulate_plan

__all__ = ["add_arguments", "run", "main", "build_parser", "positive", "add_calibrate_embedding",
           "run_calibrate_embedding"]


def add_arguments(p: argparse.ArgumentParser, *, devices_required: bool = True) -> None:
    """Add the ``plan`` command's arguments to ``p`` (``--devices`` optional where the same
    parser also plans models, which take their GPUs from the topology)."""
    p.add_argument("tables", metavar="TABLES",
                   help="built-in spec (criteo-dlrm, mlperf-dcnv2), a YAML spec or a CSV with "
                        "columns name,num_embeddings,embedding_dim,pooling_factor")
    p.add_argument("--devices", type=int, required=devices_required, metavar="N",
                   help="number of GPUs")
    p.add_argument("--topology", default=None, metavar="NAME|FILE",
                   help="topology (default dgx-a100:nodes=ceil(N/8)); ranks 0..N-1 are used; a "
                        "generated one grows to hold --devices (NAME:nodes=K)")
    planner_arguments(p)
    p.add_argument("--seed", type=int, default=0, help="seed (same inputs and seed: same plan)")
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="seconds for mip (default 10; whole call within 110%%) and local_search")
    p.add_argument("--memory", default=None, metavar="BYTES",
                   help="memory per device for embeddings, e.g. 4GiB (default: HBM less 15%% "
                        "and the dense model's state)")
    p.add_argument("--sharding-types", default=None, metavar="LIST",
                   help="allowed types, e.g. table_wise,column_wise,row_wise (tw, cw, rw, twrw, "
                        "dp); default all")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help="global batch (samples per step), overriding the spec")
    p.add_argument("--optimizer", default=None, choices=OPTIMIZERS,
                   help="embedding optimizer, overriding the spec")
    p.add_argument("--mip-solver", default="cbc", choices=("cbc", "highs"),
                   help="MIP solver (highs needs highspy)")
    p.add_argument("--column-slice-threshold", type=float, default=None, metavar="ELEMENTS",
                   help="memory_balanced: cut tables of more than this many elements (rows x "
                        "dim) into column slices (default 1e10, DeepLearningExamples' TF2 DLRM)")
    p.add_argument("--simulate", action="store_true",
                   help="also simulate one training step of the plan")
    p.add_argument("--measure", action="store_true",
                   help="also run the plan for real on this machine (fused embedding kernels, "
                        "gloo all-to-alls) and print measured per-rank cost beside the "
                        "prediction; without --topology the plan is then made for this machine "
                        "(localhost-gloo with N processes)")
    p.add_argument("--repeats", type=int, default=5, metavar="K",
                   help="--measure: timed iterations per rank (median; default 5)")
    p.add_argument("--heap", choices=HEAP_POLICIES, default=DEFAULT_HEAP,
                   help="--measure: " + HEAP_HELP)
    p.add_argument("--reproducible", action="store_true",
                   help="accepted for older scripts: results never carry wall-clock time "
                        "(see --timings)")
    add_timings_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=None, metavar="FILE", help="write the plan JSON here")
    add_dmt_arguments(p)


#: the longest search a plan may be given (seconds): a finite bound, so `inf` is refused
MAX_TIME_LIMIT_S = 86_400.0


def _task(args) -> ShardingTask:
    model = load_model_spec(args.tables)
    if args.batch_size is not None and args.batch_size < 1:
        raise SpecError(f"--batch-size must be ≥ 1, got {args.batch_size}", source="--batch-size",
                        fix="pass the global batch, e.g. --batch-size 65536")
    model = model.with_overrides(batch_size=args.batch_size, optimizer=args.optimizer)
    model = with_dlrm_trainer(model, args)
    memory = None
    if args.memory is not None:
        memory = parse_bytes(args.memory, field="--memory", allow_zero=False)
    types = parse_sharding_types(args.sharding_types) if args.sharding_types else None
    topology = sized_topology_ref(args.topology, args.devices) if args.topology else None
    if topology is None and getattr(args, "measure", False):
        topology = cpu_topology_ref(args.devices)
    return ShardingTask(model=model, topology=topology, memory_bytes=memory,
                        sharding_types=types)


def run(args: argparse.Namespace) -> int:
    """Plan, print, optionally write; returns the exit code (SpecError propagates)."""
    if args.devices is None or args.devices < 1:
        raise SpecError(f"--devices must be ≥ 1, got {args.devices}", source="--devices",
                        fix="pass the number of GPUs, e.g. --devices 8")
    if args.time_limit is not None and not 0 < args.time_limit <= MAX_TIME_LIMIT_S:
        raise SpecError(f"--time-limit must be positive seconds up to {MAX_TIME_LIMIT_S:,.0f} "
                        f"(a day), got {args.time_limit}", source="--time-limit",
                        fix="pass seconds, e.g. --time-limit 10")
    planner = planner_from_args(args)
    task = _task(args)
    plan = planner.plan(task, args.devices, seed=args.seed, time_limit_s=args.time_limit)
    doc, timings = split_timings(plan.to_dict())
    sim = None
    if args.simulate:
        sim = simulate_plan(plan, task)
        doc["simulation"] = {"step_time_s": sim.step_time_s,
                             "samples_per_s": task.model.batch_size / sim.step_time_s,
                             "trainer": task.model.trainer.to_dict(),
                             "breakdown_s": sim.breakdown_s, "a2a_bytes": sim.a2a_bytes}
    if getattr(args, "dmt", False):
        doc["dmt"], _ = dmt_section(args, task, plan)
    meas = None
    if getattr(args, "measure", False):
        meas = measure_plan(plan, task, repeats=positive(args.repeats, "--repeats"),
                            seed=args.seed, heap=getattr(args, "heap", DEFAULT_HEAP))
        doc["measurement"] = meas.to_dict()
    if args.out and plan.valid:         # an invalid plan (exit 1) leaves --out as it was
        write_json(args.out, doc)
    if args.json:
        print(dumps_json(doc, indent=2, ensure_ascii=False))
    else:
        print(format_plan(plan, sim, trainer=task.model.trainer.describe()))
        if "dmt" in doc:
            print(format_dmt(doc["dmt"]))
        if meas is not None:
            print()
            print(format_measurement(meas))
        if args.out:
            print(f"wrote {args.out}" if plan.valid else
                  f"not written to {args.out}: the plan is not valid")
    report_timings(args, timings)
    return 0 if plan.valid else 1


def positive(v: int, flag: str) -> int:
    """``v`` as an int when it is at least 1, else a SpecError naming ``flag``."""
    if v is None or v < 1:
        raise SpecError(f"{flag} must be ≥ 1, got {v}", source=flag, fix=f"pass e.g. {flag} 5")
    return int(v)


# -- clusterplan calibrate embedding ------------------------------------------------------

def add_calibrate_embedding(csub) -> None:
    """Register ``clusterplan calibrate embedding`` on the calibrate subparsers object."""
    c = csub.add_parser("embedding", help="fit the sharding cost model's CPU profile",
                        description="Time fused embedding kernels (seeded sweep over tables, rows, "
                                    "dims, pooling, batch and access distributions) and gloo "
                                    "collectives (2, 4, 8 processes) on this machine and fit the "
                                    "CPU profile of the sharding cost model; writes YAML with the "
                                    "numbers, fit errors, raw points and how they were measured "
                                    "(see planner/measure/tables/fit.py).")
    c.add_argument("--out", default=None, metavar="FILE",
                   help="profile YAML to write (default: this host's, in the calibration cache "
                        "folder, which plans and validations on localhost-gloo then read; the "
                        "committed one is traces/calibration/cpu-embedding.yaml)")
    c.add_argument("--kernel-points", type=int, default=120, metavar="N",
                   help="kernel configurations to time (default 120)")
    c.add_argument("--worlds", default="2,4,8", metavar="LIST",
                   help="gloo world sizes to time collectives on (default 2,4,8)")
    c.add_argument("--repeats", type=int, default=7, metavar="K", help="timed iterations (median)")
    c.add_argument("--rounds", type=int, default=2, metavar="K",
                   help="passes over the kernel sweep, averaged (default 2)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--kernel", default="auto", choices=("auto", "fbgemm", "torch"))
    c.add_argument("--refit", default=None, metavar="PROFILE",
                   help="measure nothing: fit this version's model again to the points a "
                        "profile recorded, and write it to --out (default: PROFILE itself)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_calibrate_embedding)


def run_calibrate_embedding(args: argparse.Namespace) -> int:
    try:
        worlds = tuple(int(w) for w in str(args.worlds).split(",") if w.strip())
    except ValueError:
        raise SpecError(f"--worlds {args.worlds!r} is not a list of integers",
                        source="--worlds", fix="write e.g. 2,4,8") from None
    if not worlds or any(w < 2 for w in worlds):
        raise SpecError(f"--worlds must list sizes ≥ 2, got {args.worlds!r}", source="--worlds",
                        fix="write e.g. 2,4,8")
    if args.refit is not None:
        return _refit_embedding(args)
    if args.out is None:
        make_cache_dir()
        args.out = str(host_profile_path())
    command = "clusterplan calibrate embedding " + " ".join(
        [f"--kernel-points {args.kernel_points}", f"--worlds {args.worlds}",
         f"--repeats {args.repeats}", f"--rounds {args.rounds}", f"--seed {args.seed}",
         f"--out {args.out}"])
    doc = calibrate(kernel_points=positive(args.kernel_points, "--kernel-points"), worlds=worlds,
                    repeats=positive(args.repeats, "--repeats"), seed=args.seed,
                    rounds=positive(args.rounds, "--rounds"),
                    backend=args.kernel, command=command,
                    progress=None if args.json else progress_line)
    write_profile(doc, args.out)
    return _report_profile(args, doc)


def _refit_embedding(args: argparse.Namespace) -> int:
    """``calibrate embedding --refit PROFILE``: the recorded points fitted again."""
    src = args.refit
    doc = parse_yaml(read_text(src, field="--refit"), source=src)
    out = args.out or src
    try:
        doc = refit_profile(doc, command=f"clusterplan calibrate embedding --refit {src} "
                                         f"--out {out}")
    except SpecError as e:
        raise SpecError(e.message, source=src, field=e.field, fix=e.fix) from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SpecError(f"its recorded points do not read as a profile's ({e!r})", source=src,
                        field="points", fix="refit a profile written by `clusterplan calibrate "
                        "embedding` of this version") from None
    args.out = out
    write_profile(doc, out)
    return _report_profile(args, doc)


def _report_profile(args: argparse.Namespace, doc: dict) -> int:
    """Print what ``calibrate embedding`` wrote (JSON with ``--json``)."""
    load_cpu_profile.cache_clear()
    look, fit = doc["lookup"], doc["lookup_fit"]
    data = {"out": args.out, "lookup": look, "lookup_fit": fit,
            "comm": (doc.get("comm") or {}).get("worlds", {})}
    if args.json:
        print(dumps_json(data, indent=2))
        return 0
    kernel = (doc.get("measured") or {}).get("kernel", "?")
    lines = [f"wrote {args.out}",
             f"lookups ({kernel}, 1 thread, {fit['points']} configurations): "
             f"{look['lookup_Bps'] / 1e9:.2f} GB/s per missed byte, overhead "
             f"{look['lookup_overhead_bytes']:.0f} B per lookup, repeat hit ratio "
             f"{look['repeat_hit_ratio']:.2f}, backward/forward {look['backward_multiplier']:.2f}, "
             f"{look['shard_overhead_s'] * 1e6:.1f} µs per shard, "
             f"{look['kernel_launch_s'] * 1e6:.1f} µs per call"
             + (f", fp16 element = {look['element_bytes']['fp16']:.1f} B"
                if "element_bytes" in look else "")
             + f"; fwd+bwd MAPE {100 * fit['total_mape']:.1f}%"]
    for n, e in data["comm"].items():
        lines.append(f"gloo × {n}: all-to-all {e['a2a_alpha_s'] * 1e3:.2f} ms + bytes / "
                     f"{e['a2a_Bps'] / 1e9:.2f} GB/s (MAPE {100 * e['a2a_mape']:.0f}%)"
                     + "".join(f"; {k} {e[k]['alpha_s'] * 1e3:.2f} ms + bytes / "
                               f"{e[k]['Bps'] / 1e9:.2f} GB/s" for k in
                               ("allreduce", "reducescatter", "allgather") if k in e))
    print("\n".join(lines))
    return 0


def format_plan(plan, sim=None, trainer: str | None = None) -> str:
    """The human-readable summary: per-rank cost and memory, types, dense part, validity (and
    with a simulation, the ``trainer`` settings it ran under, as one line)."""
    t = plan.task
    st = plan.stats
    status = st.status
    if st.gap is not None:
        status += f", gap {100 * st.gap:.2f}%"
    lines = [f"{t['name']}: {t['num_tables']} tables ({format_bytes(t['total_weight_bytes'])} of "
             f"weights, {t['optimizer']}), batch {t['batch_size']:,} on {plan.devices} × "
             f"{plan.gpu} ({plan.topology})",
             f"planner {plan.planner} ({status}), seed {st.seed}", ""]
    b = plan.breakdown_s
    hdr = (f"{'rank':>4} {'cost':>11} {'lookups':>11} {'all-to-all':>11} {'other comm':>11} "
           f"{'memory':>11} {'of':>10} {'shards':>6}")
    lines.append(hdr)
    shards_on = [0] * plan.devices
    for ts in plan.shardings:
        for s in ts.shards:
            shards_on[s.rank] += 1
    for r in range(plan.devices):
        look = b["lookup_fwd_s"][r] + b["lookup_bwd_s"][r]
        a2a = b["input_a2a_s"][r] + b["output_a2a_fwd_s"][r] + b["output_a2a_bwd_s"][r]
        other = (b["row_wise_comm_s"][r] + b["table_row_wise_comm_s"][r]
                 + b["data_parallel_allreduce_s"][r])
        lines.append(f"{r:>4} {format_time(plan.per_rank_cost_s[r]):>11} {format_time(look):>11} "
                     f"{format_time(a2a):>11} {format_time(other):>11} "
                     f"{format_bytes(plan.memory_per_rank_bytes[r]):>11} "
                     f"{format_bytes(plan.memory_capacity_bytes[r]):>10} {shards_on[r]:>6}")
    mean = sum(plan.per_rank_cost_s) / plan.devices
    lines.append("")
    lines.append(f"step cost {format_time(plan.step_cost_s)} (each phase's slowest rank, "
                 f"summed); slowest rank {format_time(plan.max_cost_s)}, mean "
                 f"{format_time(mean)}, imbalance "
                 f"{plan.imbalance:.3f}; types: "
                 + ", ".join(f"{v} {k}" for k, v in plan.type_counts().items()))
    d = plan.dense_s
    if any(d.values()):
        lines.append(f"dense part (every rank): MLP forward {format_time(d['mlp_fwd_s'])}, "
                     f"backward {format_time(d['mlp_bwd_s'])}, optimizer "
                     f"{format_time(d.get('optimizer_s', 0.0))}, all-reduce "
                     f"{format_time(d['dense_allreduce_s'])}")
    if sim is not None:
        rate = t["batch_size"] / sim.step_time_s if sim.step_time_s > 0 else float("nan")
        lines.append(f"simulated step: {format_time(sim.step_time_s)}, {rate:,.0f} samples/s ("
                     + ", ".join(f"{k} {format_time(v)}" for k, v in sim.breakdown_s.items() if v)
                     + ")")
        if trainer:
            lines.append(f"trainer: {trainer}")
    if plan.valid:
        lines.append("valid: every table placed once, every rank within its memory")
    else:
        lines.append("INVALID: " + "; ".join(plan.problems[:5])
                     + " (try --planner mip or local_search, or more devices)")
    for note in st.notes[:6]:
        lines.append(f"note: {note}")
    for line in plan.extrapolated:
        lines.append(f"extrapolated: {line}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="clusterplan plan",
                                description="Shard embedding tables over N GPUs.")
    add_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: parse, run, and turn bad input into one line and exit code 2."""
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except ClusterplanError as exc:
        print(f"clusterplan plan: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
