"""``clusterplan reorder`` and ``clusterplan probe``: parsers and run functions."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.errors import SpecError
from simulator.units import format_time, parse_bytes

__all__ = ["add_reorder_command", "add_probe_command"]

_KINDS = ("allreduce", "tree", "alltoall", "hierarchical")


def add_reorder_command(sub) -> None:
    p = sub.add_parser(
        "reorder", help="choose the rank order that makes a collective fastest on a network",
        description="Read pairwise latency/bandwidth (a matrix from `clusterplan probe`, or a "
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
    p.set_defaults(func=_reorder_run)


def _load_matrix(args):
    from simulator.costmatrix import load_cost_matrix
    from simulator.topology.pairwise import cost_matrix_for
    if bool(args.matrix) == bool(args.topology):
        raise SpecError("give either a MATRIX.json or --topology NAME", field="MATRIX",
                        fix="e.g. clusterplan reorder --topology cloud-64")
    if args.matrix:
        return load_cost_matrix(args.matrix), args.matrix
    return cost_matrix_for(args.topology), args.topology


def _group_size(args, cm) -> int:
    from collections import Counter
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


def _reorder_run(args) -> int:
    from simulator.fileio import atomic_write_text

    from planner.reorder.rankmap import rank_map
    from planner.reorder.search import reorder
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
        from planner.reorder.groups import plan_comm_time, plan_traffic, reorder_plan
        path = Path(args.collective)
        if not path.is_file():
            raise SpecError(f"{args.collective!r} is neither a collective nor a plan file",
                            field="--collective",
                            fix=f"use one of {', '.join(_KINDS)} or a plan JSON path")
        try:
            plan = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SpecError("not valid JSON", source=str(path),
                            fix="pass a plan written by `clusterplan plan MODEL --out plan.json`"
                            ) from None
        traffic = plan_traffic(plan, source=str(path))
        res = reorder_plan(cm, traffic, exact_max_n=args.exact_max,
                           time_limit_s=args.time_limit, seed=args.seed)
        extra = {"plan": str(path), "comm_before": plan_comm_time(cm, traffic, range(cm.n)),
                 "comm_after": plan_comm_time(cm, traffic, res.order)}
        what = f"plan {path.name} (TP/CP/DP/PP traffic per step)"
        if args.plan_out:
            from planner.reorder.groups import placed_plan
            atomic_write_text(args.plan_out, json.dumps(
                placed_plan(plan, res.order, cm.hostnames), indent=1) + "\n", field="--plan-out")
            extra["plan_out"] = args.plan_out
    data = res.to_dict() | {"source": source, "ranks": cm.n, "measured": dict(cm.measured),
                            "rank_map": rank_map(res.order, cm.hostnames)} | extra
    if args.out:
        atomic_write_text(args.out, json.dumps(data, indent=1) + "\n")
    rm = data["rank_map"]
    lines = [f"{what} over {cm.n} ranks ({source}):",
             f"  given order   {format_time(res.time_before_s)}",
             f"  reordered     {format_time(res.time_after_s)}   ({res.method}, "
             f"speedup {res.speedup:.2f}×, solved in {res.solve_s:.2f} s)",
             f"  order         {' '.join(map(str, res.order[:32]))}"
             + (" …" if cm.n > 32 else ""),
             "  launch        " + ("torchrun: hosts in this order, --node-rank = position"
                                   if rm["torchrun_ok"] else
                                   "needs a per-rank map (rankfile or RANK remap; see --out)")]
    for f in (args.out, args.plan_out):
        if f:
            lines.append(f"  wrote {f}")
    from planner.cli.main import emit
    emit(args, data, "\n".join(lines))
    return 0


def add_probe_command(sub) -> None:
    p = sub.add_parser(
        "probe", help="measure pairwise latency and bandwidth between ranks (torch.distributed)",
        description="Spawn N processes, pair them up in a round-robin tournament and time "
                    "point-to-point messages between every pair: small ping-pongs for latency, "
                    "large one-way sends for bandwidth, median of repeats. Writes a cost matrix "
                    "for `clusterplan reorder`.")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--nproc", type=int, default=2, metavar="N", help="processes (default 2)")
    p.add_argument("--repeats", type=int, default=9, metavar="K",
                   help="timed repeats per pair and size (median kept; default 9)")
    p.add_argument("--small", default="8", metavar="BYTES", help="latency message (default 8)")
    p.add_argument("--large", default="16MiB", metavar="BYTES",
                   help="bandwidth message (default 16MiB)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="overall limit in seconds (default 120)")
    p.add_argument("--emulate", metavar="MATRIX.json",
                   help="inject this matrix's latency and bandwidth as delays in the send path "
                        "(to test reordering on one machine)")
    p.add_argument("--out", metavar="FILE", help="write the matrix JSON here")
    p.add_argument("--json", action="store_true", help="print the matrix JSON")
    p.set_defaults(func=_probe_run)


def _probe_run(args) -> int:
    from simulator.fileio import atomic_write_text

    from planner.measure.probe import ProbeSettings, run_probe
    if not 2 <= args.nproc <= 256:
        raise SpecError(f"--nproc {args.nproc} is not in 2..256", field="--nproc",
                        fix="probe at least 2 processes")
    if not 1 <= args.repeats <= 1000:
        raise SpecError(f"--repeats {args.repeats} is not in 1..1000", field="--repeats",
                        fix="use e.g. --repeats 9")
    if not 1 <= args.timeout <= 86400:
        raise SpecError(f"--timeout {args.timeout} is not in 1..86400 s", field="--timeout",
                        fix="use e.g. --timeout 120")
    small = parse_bytes(args.small, field="--small")
    large = parse_bytes(args.large, field="--large")
    if not 4 <= small < large <= 2**30:
        raise SpecError(f"need 4 ≤ --small < --large ≤ 1 GiB, got {small} and {large}",
                        field="--large", fix="e.g. --small 8 --large 16MiB")
    emulate = None
    if args.emulate:
        from simulator.costmatrix import load_cost_matrix
        emulate = load_cost_matrix(args.emulate)
        if emulate.n != args.nproc:
            raise SpecError(f"the matrix has {emulate.n} ranks, --nproc is {args.nproc}",
                            source=args.emulate, field="ranks", fix="make them equal")
    cm = run_probe(ProbeSettings(backend=args.backend, nproc=args.nproc, repeats=args.repeats,
                                 small_bytes=small, large_bytes=large, timeout_s=args.timeout),
                   emulate=emulate)
    text = cm.to_json()
    if args.out:
        atomic_write_text(args.out, text)
    if args.json:
        print(text, end="")
        return 0
    lat = cm.latency_s[~__import__("numpy").eye(cm.n, dtype=bool)]
    bw = cm.bandwidth_Bps[~__import__("numpy").eye(cm.n, dtype=bool)]
    print(f"probed {cm.n} ranks ({args.backend}) on {len(set(cm.hostnames))} host(s): latency "
          f"{format_time(float(lat.min()))} … {format_time(float(lat.max()))}, bandwidth "
          f"{bw.min() / 1e9:.2f} … {bw.max() / 1e9:.2f} GB/s"
          + (f"; wrote {args.out}" if args.out else ""))
    return 0
