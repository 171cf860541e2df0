"""``clusterplan topology show|list``: a topology's GPUs, nodes, tiers and bisection bandwidth."""

from __future__ import annotations

import argparse

from simulator.topology import builtin_topology_names, load_topology

from planner.cli.options import topology_from_args
from planner.cli.output import emit
from planner.cli.summary import format_topology_summary, topology_summary

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = "Show a topology's GPUs, nodes, tiers and bisection bandwidth."
    tsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = tsub.add_parser("show", help="summarise a topology")
    s.add_argument("topology", metavar="NAME|FILE",
                   help="built-in name or YAML file, with optional :key=value overrides")
    s.add_argument("--gpus", type=int, default=None, metavar="N", help="resize to N GPUs")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=run)
    ls = tsub.add_parser("list", help="list built-in topologies")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=run)


def run(args) -> int:
    """Show one topology or list the built-in ones (``args.action``)."""
    return _show(args) if args.action == "show" else _list(args)


def _show(args) -> int:
    s = topology_summary(topology_from_args(args))
    emit(args, s, format_topology_summary(s))
    return 0


def _list(args) -> int:
    rows = []
    for name in builtin_topology_names():
        t = load_topology(name)
        rows.append({"name": name, "gpu": t.gpu.name, "gpus": t.num_gpus, "nodes": t.num_nodes})
    human = "\n".join(f"{r['name']:<22}{r['gpus']:>7} × {r['gpu']:<10} {r['nodes']:>5} nodes"
                      for r in rows)
    emit(args, {"topologies": rows}, human)
    return 0
