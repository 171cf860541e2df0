"""``clusterplan collective``: one collective alone on an idle network (nccl-tests conventions)."""

from __future__ import annotations

import argparse

from simulator.collectives import simulate_collective
from simulator.errors import SpecError
from simulator.units import format_bandwidth, format_bytes, format_time, parse_bytes

from planner.cli.options import topology_arguments, topology_from_args
from planner.cli.output import emit

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Simulate one collective alone on an idle network and print "
                     "time, algorithm bandwidth and bus bandwidth (nccl-tests "
                     "conventions).")
    p.add_argument("kind", choices=("allreduce", "allgather", "reducescatter", "alltoall",
                                    "broadcast"))
    p.add_argument("--size", required=True, metavar="BYTES",
                   help="message size with unit, e.g. 1GiB, 64MB, 4096")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="group size: ranks 0..N-1 (default: all GPUs)")
    p.add_argument("--algo", default="auto",
                   help="auto (NCCL-like choice), ring, tree, hierarchical, halving_doubling, "
                        "nvls, direct, pairwise")
    p.add_argument("--mode", default="explicit", choices=("explicit", "symmetric"),
                   help="flow simulation mode (symmetric: identical flows aggregated)")
    topology_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    size = parse_bytes(args.size, field="--size")
    topo = topology_from_args(args)
    n = args.ranks if args.ranks is not None else topo.num_gpus
    if not 1 <= n <= topo.num_gpus:
        raise SpecError(f"--ranks {n} but {topo.name} has {topo.num_gpus} GPUs", field="--ranks",
                        fix=f"use 1..{topo.num_gpus} or a bigger topology (--gpus)")
    r = simulate_collective(topo, args.kind, range(n), size, algo=args.algo, mode=args.mode)
    data = r.to_dict() | {"topology": topo.name}
    human = (f"{args.kind} of {format_bytes(size)} over {n} ranks on {topo.name} "
             f"({r.algorithm}, {r.channels} channel{'s' if r.channels != 1 else ''}, {r.mode}):\n"
             f"  time {format_time(r.time_s)}   algbw {format_bandwidth(r.algbw_Bps)}   "
             f"busbw {format_bandwidth(r.busbw_Bps)}")
    emit(args, data, human)
    return 0
