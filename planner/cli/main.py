"""The ``clusterplan`` command: one module per subcommand, each with ``register(subparsers)``
and ``run(args)``; :data:`COMMANDS` lists them in the order ``--help`` shows.

Every subcommand prints a table for people and, with ``--json``, one JSON object for programs.
Bad input (a missing file, an unknown name, a value out of range) ends with one line naming the
file, the field and the fix, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from simulator.errors import ClusterplanError

from planner.cli import (
    calibrate,
    collective,
    costmodel,
    diagnose,
    export,
    fidelity,
    gpus,
    measure,
    plan,
    probe,
    reorder,
    replay,
    simulate,
    sweep,
    topology,
    validate,
)

COMMANDS = (topology, gpus, collective, simulate, plan, measure, export, fidelity, calibrate,
            diagnose, reorder, probe, costmodel, validate, sweep, replay)

EXAMPLES = """\
main commands (each has --help):
  clusterplan topology show selene-a100:nodes=64      GPUs, nodes, tiers, bisection bandwidth
  clusterplan gpus                                     the GPU catalog with sources
  clusterplan collective allreduce --size 1GiB --ranks 64 --topology h100-ib
  clusterplan simulate gpt3-175b --topology selene-a100 --gpus 512 --parallel tp=8,pp=8,dp=8
  clusterplan simulate dp-step --topology h100-ib --straggler 3=1.1 --diagnose   what-if faults
  clusterplan plan llama3-70b --topology two-buildings-h100 --out plan.json   LLM layout search
  clusterplan plan criteo-dlrm --devices 8 --planner mip --out dlrm.json    embedding sharding
  clusterplan plan criteo-dlrm --devices 16 --topology h100-ib:nodes=2 --dmt   DMT towers
  clusterplan measure criteo-dlrm dlrm.json            run a sharding plan for real (CPU)
  clusterplan export plan.json --to megatron|torchtitan|deepspeed|torchrec|hostfile
  clusterplan validate llama3-8b --parallel tp=2,pp=2,dp=1    run a plan for real (gloo)
  clusterplan reorder --topology cloud-64 --collective allreduce   rank order for the network
  clusterplan probe --backend gloo --nproc 4 --out matrix.json     measure the network
  clusterplan diagnose rank*.json                      name stragglers in profiler traces
  clusterplan replay rank*.json                        replay a real run's traces, op by op
  clusterplan fidelity --set korthikanti               error against published runs
  clusterplan calibrate compute --gpu h100-sxm --measurements kernels.csv --out h100.yaml
  clusterplan sweep grid.yaml --out results.csv --plot results.png [--ray local]
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clusterplan", description="Simulate and plan training on GPU clusters.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    p.set_defaults(main=main)      # for commands that run other commands (sweep)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except ClusterplanError as exc:
        print(f"clusterplan: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clusterplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
