"""``clusterplan measure TABLES PLAN.json``: run an embedding sharding plan for real on this
machine and print measured beside predicted."""

from __future__ import annotations

import argparse

from simulator.errors import SpecError
from simulator.fileio import dumps_json, read_json_file

from planner.cli.output import write_json
from planner.cli.tables import positive
from planner.measure.heap import DEFAULT_HEAP, HEAP_HELP, HEAP_POLICIES
from planner.measure.tables.plans import cpu_topology_ref, format_measurement, measure_shardings
from planner.model.tables.plan import plan_model, read_plan_json
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    """Register ``clusterplan measure TABLES PLAN.json`` on a subparsers object."""
    p.description = ("Measure a sharding plan (clusterplan plan TABLES --devices N "
                     "--out PLAN.json) on this machine: each rank's shards as one "
                     "fused embedding kernel (forward, backward, fused optimizer; "
                     "one thread; median of --repeats), and the ids and pooled-"
                     "embedding all-to-alls (and row-wise / data-parallel "
                     "collectives) with torch.distributed gloo across N processes. "
                     "Prints measured per-rank lookups, communication and total, "
                     "the maximum, and the analytic prediction beside them.")
    p.add_argument("tables", metavar="TABLES", help="the table spec the plan was made for")
    p.add_argument("plan", metavar="PLAN.json", help="a plan JSON written by clusterplan plan")
    p.add_argument("--repeats", type=int, default=5, metavar="K",
                   help="timed iterations per rank (median; default 5)")
    p.add_argument("--warmup", type=int, default=2, metavar="K", help="untimed iterations first")
    p.add_argument("--comm-repeats", type=int, default=7, metavar="K",
                   help="timed rounds of the collectives (median; default 7)")
    p.add_argument("--no-comm", action="store_true", help="time the kernels only")
    p.add_argument("--kernel", default="auto", choices=("auto", "fbgemm", "torch"),
                   help="fused FBGEMM TBE (auto when installed) or torch.nn.EmbeddingBag")
    p.add_argument("--seed", type=int, default=0, help="seed of the ids")
    p.add_argument("--heap", choices=HEAP_POLICIES, default=DEFAULT_HEAP, help=HEAP_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=None, metavar="FILE", help="write the JSON result here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``clusterplan measure``: load the spec and plan, measure, print."""
    doc = read_json_file(args.plan, field="PLAN", missing_fix="check the path",
                         json_fix="pass a plan written by clusterplan plan --out")
    if not isinstance(doc, dict) or doc.get("format") != "clusterplan.sharding-plan":
        raise SpecError("not a clusterplan sharding plan", source=args.plan, field="format",
                        fix="pass a plan written by clusterplan plan TABLES --devices N --out")
    model = plan_model(doc, args.plan, args.tables)
    devices = int(doc.get("devices") or 0)
    if devices < 1:
        raise SpecError("the plan has no device count", source=args.plan, field="devices",
                        fix="re-plan with clusterplan plan")
    task = ShardingTask(model=model, topology=cpu_topology_ref(devices))
    problem = prepare(task, devices)
    shardings = read_plan_json(doc, problem)
    if sorted(ts.table for ts in shardings) != list(range(model.num_tables)):
        raise SpecError("the plan does not place every table exactly once", source=args.plan,
                        field="shards", fix="re-plan with clusterplan plan")
    meas = measure_shardings(problem, shardings, repeats=positive(args.repeats, "--repeats"),
                             warmup=max(0, args.warmup),
                             comm_repeats=positive(args.comm_repeats, "--comm-repeats"),
                             comm=not args.no_comm, seed=args.seed, backend=args.kernel,
                             heap=args.heap)
    out = meas.to_dict() | {"plan": args.plan, "planner": doc.get("planner"),
                            "plan_topology": doc.get("topology")}
    if doc.get("topology") and doc["topology"] != problem.topology_ref:
        meas.notes = tuple(meas.notes) + (
            f"the plan was made for {doc['topology']}; predicted here with this machine's "
            f"profile ({problem.topology_ref})",)
        out["notes"] = list(meas.notes)
    if args.out:
        write_json(args.out, out)
    if args.json:
        print(dumps_json(out, indent=2, ensure_ascii=False))
    else:
        print(f"{model.name}: {model.num_tables} tables, batch {model.batch_size:,}, "
              f"{devices} ranks, plan by {doc.get('planner')}")
        print(format_measurement(meas))
        if args.out:
            print(f"wrote {args.out}")
    return 0
