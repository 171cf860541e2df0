"""``clusterplan simulate``: one training step of a model spec or an op graph on a topology."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.units import format_bytes, format_time
from simulator.workload_spec import load_workload

from planner.cli.llm import load_plan_spec, simulate_model
from planner.cli.options import (
    is_het,
    is_llm_plan,
    is_model,
    is_table_spec,
    topology_arguments,
    topology_from_args,
    trainer_arguments,
    with_trainer,
)
from planner.cli.output import add_timings_option, emit
from planner.cli.simulate_het import simulate_het
from planner.cli.planner_choice import planner_arguments
from planner.cli.simulate_sharding import (TABLE_SPEC_PLANNER, simulate_sharding_plan,
                                           simulate_table_spec)
from planner.measure.validate.dlrm import is_sharding_plan
from planner.model.llm.spec import load_llm_spec
from planner.model.reliability import add_arguments as _reliability_arguments
from planner.model.reliability import (
    link_faults_from_args,
    reliability_report,
    stragglers_from_args,
)

__all__ = ["register", "run"]

ORDER_DEFAULT = "tp-cp-dp-pp"
SCHEDULE_DEFAULT = "1f1b"


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Simulate one training step: a transformer spec (model:, "
                     "training:, parallel:; see planner/model/llm/spec.py) or a workload "
                     "YAML (an op DAG; see simulator/workload_spec.py), a parameter-server "
                     "spec with worker caches (kind: het; planner/workloads/het.py), by path or "
                     "built-in name (llama3-405b, gpt3-175b, dp-step ...), a plan.json "
                     "from `plan` (a sharding plan on its own topology unless --topology), "
                     "or a table spec (criteo-dlrm, mlperf-dcnv2, YAML or CSV), sharded by "
                     "greedy over --gpus N of --topology first.")
    p.add_argument("workload", metavar="MODEL|WORKLOAD|PLAN",
                   help="YAML, JSON or CSV file, a built-in name, or a plan.json from `plan`")
    topology_arguments(p, default="")
    p.add_argument("--parallel", metavar="SPEC", help="e.g. tp=8,cp=1,pp=16,dp=128,vpp=1")
    p.add_argument("--global-batch", type=int, metavar="N", help="sequences per step")
    p.add_argument("--micro-batch", type=int, metavar="N", help="sequences per micro-batch")
    p.add_argument("--order", default=ORDER_DEFAULT,
                   help="placement of parallel axes, innermost first (default tp-cp-dp-pp)")
    p.add_argument("--schedule", default=SCHEDULE_DEFAULT,
                   choices=("1f1b", "gpipe", "interleaved"))
    trainer_arguments(p)
    planner_arguments(p, default=TABLE_SPEC_PLANNER)
    p.add_argument("--mode", default="auto", choices=("auto", "explicit", "symmetric"))
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--trace-ranks", type=int, default=64, metavar="N",
                   help="ranks to include in the trace (default 64)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_timings_option(p)
    _reliability_arguments(p)
    p.set_defaults(func=run)


def _simulate_plan(args) -> int:
    """Re-simulate a plan written by ``clusterplan plan MODEL``: its model spec, layout,
    micro-batch, placement order and schedule, on ``--topology`` resized to the plan's GPUs
    (``--gpus`` and the other flags override)."""
    spec, plan = load_plan_spec(args.workload)
    if args.gpus is None:
        args.gpus = int(plan.get("gpus") or 0) or None
    if args.order == ORDER_DEFAULT and plan.get("order"):
        args.order = plan["order"]
    if args.schedule == SCHEDULE_DEFAULT and spec.parallel and spec.parallel.vpp > 1:
        args.schedule = "interleaved"
    return simulate_model(args, with_trainer(spec, args), topology_from_args(args), emit)


def run(args) -> int:
    if args.trace and not Path(args.trace).resolve().parent.is_dir():
        raise SpecError(f"directory of {args.trace} does not exist", field="--trace",
                        fix="create the directory or write the trace elsewhere")
    if not is_table_spec(args.workload) and (args.planner != TABLE_SPEC_PLANNER
                                             or args.planner_set):
        raise SpecError("--planner and --planner-set shard a table spec", source=args.workload,
                        field="--planner", fix="drop them, or simulate a table spec "
                        "(criteo-dlrm, mlperf-dcnv2, YAML or CSV)")
    if is_sharding_plan(args.workload):
        return simulate_sharding_plan(args, emit)
    if not args.topology:
        raise SpecError("simulate needs --topology (a sharding plan brings its own)",
                        field="--topology", fix="pass e.g. --topology dgx-h100:nodes=2")
    if is_table_spec(args.workload):
        return simulate_table_spec(args, emit)
    if is_llm_plan(args.workload):
        return _simulate_plan(args)
    topo = topology_from_args(args)
    if is_het(args.workload):
        return simulate_het(args, topo, emit)
    if is_model(args.workload):
        return simulate_model(args, with_trainer(load_llm_spec(args.workload), args), topo, emit)
    if args.trainer or args.trainer_set or args.dense_dtype:
        raise SpecError("--trainer, --trainer-set and --dense-dtype apply to model and table "
                        "specs, not op graphs",
                        source=args.workload, field="--trainer",
                        fix="drop the flag, or simulate a model spec (model: section)")
    w = load_workload(args.workload, num_gpus=topo.num_gpus)
    res = simulate(topo, w, mode="explicit" if args.mode == "auto" else args.mode,
                   slowdown=stragglers_from_args(args, topo.num_gpus),
                   link_faults=link_faults_from_args(args, topo), track_links=args.diagnose)
    df = res.ops
    by_cat = df.groupby("category").duration_s.sum()
    compute_ops = df[df.kind == "compute"]
    # exposed communication: step time on rank 0 not covered by its compute
    r0 = compute_ops[compute_ops.first_rank == 0]
    exposed = res.step_time_s - float(r0.duration_s.sum())
    data = {"workload": w.name, "topology": topo.name, "mode": res.mode,
            "step_time_s": res.step_time_s, "ops": len(df),
            "compute_time_rank0_s": float(r0.duration_s.sum()),
            "exposed_comm_rank0_s": exposed,
            "busy_time_by_category_s": {k: float(v) for k, v in by_cat.items()},
            "events": res.events, "wall_s": res.wall_s}
    lines = [f"{w.name} on {topo.name} ({topo.num_gpus} GPUs, {res.mode}): step time "
             f"{format_time(res.step_time_s)}",
             f"  rank 0: compute {format_time(data['compute_time_rank0_s'])}, exposed communication "
             f"{format_time(exposed)}"]
    comm = df[df.kind != "compute"]
    if len(comm):
        lines.append("  collectives (first instance):")
        for name, g in comm.groupby("name", sort=False):
            row = g.iloc[0]
            lines.append(f"    {name:<14}{row.algorithm:<16}{format_bytes(row.bytes):>12}"
                         f"  {format_time(row.duration_s):>12}  ({len(g)} groups of {row.ranks})")
    if res.link_faults:
        data["link_faults"] = [{"link": f.label, "links": len(f.links), "factor": f.factor,
                                "at_s": f.at_s} for f in res.link_faults]
        lines.append("  link faults: " + ", ".join(f.label for f in res.link_faults))
    if res.slowdown:
        data["stragglers"] = {str(r): f for r, f in sorted(res.slowdown.items())}
        lines.append("  stragglers: " + ", ".join(f"rank {r} ×{f:g}"
                                                   for r, f in sorted(res.slowdown.items())))
    rel_data, rel_lines = reliability_report(args, gpus=topo.num_gpus,
                                             step_time_s=res.step_time_s,
                                             busy_s=res.compute_busy_s(), sim=res, topo=topo)
    data.update(rel_data)
    lines += rel_lines
    if args.trace:                  # last: a run refused above leaves no file behind
        res.write_chrome_trace(args.trace, max_ranks=args.trace_ranks)
        data["trace"] = args.trace
    lines.append(f"  {res.events} events")
    if args.trace:
        lines.append(f"  trace: {args.trace} (open in https://ui.perfetto.dev)")
    emit(args, data, "\n".join(lines))
    return 0
