"""``clusterplan reorder``: choose the rank order that makes a collective fastest on a
measured or generated network."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from simulator.costmatrix import load_cost_matrix
from simulator.errors import SpecError
from simulator.fileio import atomic_write_text, dumps_json, read_json_file
from simulator.topology.pairwise import cost_matrix_for
from simulator.units import format_time, parse_bytes

from planner.cli.output import add_timings_option, emit, split_timings
from planner.reorder.groups import placed_plan, plan_comm_time, plan_traffic, reorder_plan
from planner.reorder.rankmap import rank_map
from planner.reorder.search import reorder

__all__ = ["register", "run"]


_KINDS = ("allreduce", "tree", "alltoall", "hierarchical")


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Read pairwise latency/bandwidth (a matrix from `clusterplan probe`, or a "
                     "topology such as cloud-64) and find the rank order minimising the model "
                     "time of a ring all-reduce (TSP: exact MIP for small n, 2-opt/Or-opt above; "
                     "bottleneck variant), a tree, an all-to-all, or the TP/CP/DP/PP groups of an "
                     "LLM plan. Prints the order, model times before and after, and a rank map "
                     "(host order, rank → host) for the launcher.")
    p.add_argument("matrix", nargs="?", metavar="MATRIX.json", help="cost matrix file")
    p.add_argument("--topology", metavar="NAME|FILE", help="use a topology's costs instead")
    p.add_argument("--collective", default="allreduce", metavar="KIND|PLAN.json",
                   help="allreduce (ring), tree, alltoall, hierarchical (two-level all-reduce "
                        "over groups of --group-size), or an LLM plan JSON (clusterplan plan "
                        "MODEL --out plan.json); default allreduce")
    p.add_argument("--group-size", type=int, default=None, metavar="G",
                   help="hierarchical: ranks per group (default: ranks per host name, when "
                        "hosts hold several)")
    p.add_argument("--size", default="64MiB", metavar="BYTES",
                   help="message bytes per rank (default 64MiB; plans use their own sizes)")
    p.add_argument("--time-limit", type=float, default=20.0, metavar="S",
                   help="seconds for the solvers (default 20)")
    p.add_argument("--exact-max", type=int, default=16, metavar="N",
                   help="solve rings exactly (MIP) up to N ranks (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE", help="write the result with its rank map as JSON")
    p.add_argument("--plan-out", metavar="FILE",
                   help="with a plan: write it with every rank moved to its chosen VM (input "
                        "for clusterplan export)")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_timings_option(p)
    p.set_defaults(func=run)


def _load_matrix(args):
    if bool(args.matrix) == bool(args.topology):
        raise SpecError("give either a MATRIX.json or --topology NAME", field="MATRIX",
                        fix="e.g. clusterplan reorder --topology cloud-64")
    if args.matrix:
        return load_cost_matrix(args.matrix), args.matrix
    return cost_matrix_for(args.topology), args.topology


def _group_size(args, cm) -> int:
    g = args.group_size
    if g is None:
        per = set(Counter(cm.hostnames).values())
        if len(per) != 1 or per == {1}:
            raise SpecError("hierarchical needs a group size: host names do not give equal "
                            "groups of several ranks", field="--group-size",
                            fix="pass --group-size G (a divisor of the rank count)")
        g = per.pop()
    if not 1 <= g <= cm.n or cm.n % g:
        raise SpecError(f"--group-size {g} does not divide {cm.n} ranks", field="--group-size",
                        fix=f"pass a divisor of {cm.n}")
    return g


def run(args) -> int:

    if not 0 < args.time_limit <= 3600:
        raise SpecError(f"--time-limit {args.time_limit} is not in (0, 3600] s",
                        field="--time-limit", fix="pass e.g. --time-limit 10")
    if not 0 <= args.exact_max <= 64:
        raise SpecError(f"--exact-max {args.exact_max} is not in 0..64", field="--exact-max",
                        fix="exact rings beyond ~30 ranks are slow; use e.g. 16")
    size = parse_bytes(args.size, field="--size")
    cm, source = _load_matrix(args)
    extra: dict = {}
    if args.plan_out and args.collective in _KINDS:
        raise SpecError("--plan-out needs --collective PLAN.json", field="--plan-out",
                        fix="pass the plan written by `clusterplan plan MODEL --out plan.json`")
    if args.collective in _KINDS:
        g = _group_size(args, cm) if args.collective == "hierarchical" else None
        res = reorder(cm, args.collective, size, exact_max_n=args.exact_max,
                      time_limit_s=args.time_limit, seed=args.seed, group_size=g)
        what = f"{args.collective} of {size:,} bytes" + (f" (groups of {g})" if g else "")
        if g:
            extra = {"group_size": g}
    else:
        path = Path(args.collective)
        if not path.is_file():
            raise SpecError(f"{args.collective!r} is neither a collective nor a plan file",
                            field="--collective",
                            fix=f"use one of {', '.join(_KINDS)} or a plan JSON path")
        plan = read_json_file(path, field="--collective", missing_fix="check the path",
                              json_fix="pass a plan written by `clusterplan plan MODEL --out "
                                       "plan.json`")
        traffic = plan_traffic(plan, source=str(path))
        res = reorder_plan(cm, traffic, exact_max_n=args.exact_max,
                           time_limit_s=args.time_limit, seed=args.seed)
        extra = {"plan": str(path), "comm_before": plan_comm_time(cm, traffic, range(cm.n)),
                 "comm_after": plan_comm_time(cm, traffic, res.order)}
        what = f"plan {path.name} (TP/CP/DP/PP traffic per step)"
        if args.plan_out:
            atomic_write_text(args.plan_out, dumps_json(
                placed_plan(plan, res.order, cm.hostnames), indent=1) + "\n", field="--plan-out")
            extra["plan_out"] = args.plan_out
    data = res.to_dict() | {"source": source, "ranks": cm.n, "measured": dict(cm.measured),
                            "rank_map": rank_map(res.order, cm.hostnames)} | extra
    data, timings = split_timings(data)
    if args.out:
        atomic_write_text(args.out, dumps_json(data, indent=1) + "\n")
    rm = data["rank_map"]
    lines = [f"{what} over {cm.n} ranks ({source}):",
             f"  given order   {format_time(res.time_before_s)}",
             f"  reordered     {format_time(res.time_after_s)}   ({res.method}, "
             f"speedup {res.speedup:.2f}×)",
             f"  order         {' '.join(map(str, res.order[:32]))}"
             + (" …" if cm.n > 32 else ""),
             "  launch        " + ("torchrun: hosts in this order, --node-rank = position"
                                   if rm["torchrun_ok"] else
                                   "needs a per-rank map (rankfile or RANK remap; see --out)")]
    if res.clock_stopped:
        lines.append("  note          the pair-swap search ran out of --time-limit before its "
                     "budget: this order depends on the machine's speed and load (a larger "
                     "--time-limit makes it repeatable)")
    for f in (args.out, args.plan_out):
        if f:
            lines.append(f"  wrote {f}")
    emit(args, data, "\n".join(lines), timings)
    return 0


