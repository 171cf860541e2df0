"""``clusterplan replay TRACE...``: a real run's traces replayed on the simulator, op by op."""

from __future__ import annotations

import argparse

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.fileio import parse_json, read_text
from simulator.topology import load_topology
from simulator.units import format_time

from planner.cli.output import emit
from planner.workloads.chakra import chakra_workload
from planner.workloads.replay import kineto_workload, read_kineto

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Read one trace per rank of a real run into the simulator's op graph: "
                     "measured compute between communication calls stays as measured, every "
                     "collective and message is simulated on the topology. Prints each rank's "
                     "measured and replayed time and the communication time per kind, measured "
                     "and simulated (torch.profiler traces; Chakra traces carry no measured "
                     "communication). See planner/workloads/replay.py.")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="one file per rank: torch.profiler Chrome/Kineto JSON, or with --chakra "
                        "Chakra ET JSON views (chakra_jsonizer)")
    p.add_argument("--chakra", action="store_true", help="the traces are Chakra JSON views")
    p.add_argument("--comm-groups", metavar="FILE",
                   help="Chakra: process groups, {\"1\": [0, 1, ...]} (pg_name → ranks)")
    p.add_argument("--topology", default=None, metavar="NAME|FILE",
                   help="where to replay (default: this machine, localhost-gloo with one "
                        "process per rank)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    n = len(args.traces)
    topo = load_topology(args.topology or f"localhost-gloo:node.gpus={n}")
    if topo.num_gpus < n:
        raise SpecError(f"{n} traces but {topo.name} has {topo.num_gpus} devices",
                        field="--topology", fix="pass a topology with a device per rank")
    measured = None
    if args.chakra:
        groups = None
        if args.comm_groups:
            groups = parse_json(read_text(args.comm_groups, field="--comm-groups"),
                                source=args.comm_groups, fix='write {"1": [0, 1, 2, 3]}')
            if not isinstance(groups, dict) or not all(
                    isinstance(v, list) and all(isinstance(r, int) and 0 <= r < n for r in v)
                    for v in groups.values()):
                raise SpecError("expected a mapping of group name to a list of ranks",
                                source=args.comm_groups, field="groups",
                                fix=f'write {{"1": [0, 1]}} with ranks 0..{n - 1}')
        w = chakra_workload(args.traces, groups=groups)
    else:
        ranks = read_kineto(args.traces)
        w = kineto_workload(ranks)
        measured = ranks
    res = simulate(topo, w)
    df = res.ops
    kind_of = {op.id: ("p2p" if op.kind == "sendrecv" else op.collective or op.kind)
               for op in w.ops}
    ends = [0.0] * n
    for op, row in zip(w.ops, df.itertuples()):
        for r in op.ranks:
            if r < n:
                ends[r] = max(ends[r], float(row.end_s))
    per_rank = []
    for r in range(n):
        row = {"rank": r, "replayed_s": ends[r]}
        if measured:
            row["measured_s"] = measured[r].span_s
            row["relative_error"] = ends[r] / row["measured_s"] - 1 if row["measured_s"] else None
        per_rank.append(row)
    kinds: dict = {}
    for op, row in zip(w.ops, df.itertuples()):
        if op.kind == "compute":
            continue
        k = kinds.setdefault(kind_of[op.id], {"count": 0, "simulated_s": 0.0})
        k["count"] += 1
        k["simulated_s"] += float(row.duration_s)
    if measured:
        for kind in kinds:
            ms = [c.measured_s for c in measured[0].calls if _trace_kind(c.kind) == kind]
            kinds[kind]["measured_rank0_s"] = float(sum(ms))
    data = {"topology": topo.name, "ranks": n, "format": "chakra" if args.chakra else "kineto",
            "replayed_step_time_s": float(res.step_time_s), "per_rank": per_rank,
            "communication": kinds, "ops": int(len(df))}
    lines = [f"replayed {n} ranks ({data['format']}, {len(df)} ops) on {topo.name}: "
             f"{format_time(res.step_time_s)}"]
    for row in per_rank:
        if "measured_s" in row:
            lines.append(f"  rank {row['rank']:>3}: measured {format_time(row['measured_s'])}, "
                         f"replayed {format_time(row['replayed_s'])} "
                         f"({row['relative_error']:+.1%})")
        else:
            lines.append(f"  rank {row['rank']:>3}: replayed {format_time(row['replayed_s'])}")
    for kind, k in sorted(kinds.items()):
        extra = (f", measured on rank 0 {format_time(k['measured_rank0_s'])}"
                 if "measured_rank0_s" in k else "")
        lines.append(f"  {kind:<14}{k['count']:>5} ops, simulated {format_time(k['simulated_s'])}"
                     + extra)
    emit(args, data, "\n".join(lines))
    return 0


def _trace_kind(kind: str) -> str:
    return "p2p" if kind in ("send", "recv") else ("allreduce" if kind == "barrier" else kind)
