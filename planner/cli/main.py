"""The ``clusterplan`` command: one module per subcommand, ``planner.cli.<name>``, each with
``register(parser)`` (its description and arguments) and ``run(args)``. :data:`COMMANDS` lists
them in the order ``--help`` shows, with their one-line help; a command's module is imported
only when that command runs, so ``clusterplan gpus`` does not pay for the planners' imports.

Every subcommand prints a table for people and, with ``--json``, one JSON object for programs.
Bad input (a missing file, an unknown name, a value out of range) ends with one line naming the
file, the field and the fix, and exit code 2; never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import threading
import warnings
from typing import Sequence

from simulator.errors import ClusterplanError

COMMANDS = {
    "topology": "show or list topologies",
    "gpus": "list the GPU catalog with sources",
    "collective": "time one collective on a topology",
    "simulate": "simulate a training step (model or op DAG) on a topology",
    "plan": "plan LLM parallelism or embedding-table sharding",
    "measure": "run a sharding plan for real on this machine",
    "export": "write a plan as trainer launch settings",
    "fidelity": "iteration-time error against published LLM runs",
    "scaling": "MFU against GPU count, with the share of each mechanism that lowers it",
    "calibrate": "fit simulator parameters to measurements",
    "diagnose": "name straggling ranks from traces of a run",
    "reorder": "choose the rank order that makes a collective fastest on a network",
    "probe": "measure pairwise latency and bandwidth between ranks (torch.distributed)",
    "costmodel": "learned (NeuroShard) embedding cost model: collect data on this machine, "
                 "train, ship weights",
    "validate": "run a plan with torch.distributed (gloo) and compare with the simulator",
    "sweep": "run a command over a grid of arguments (process pool or Ray)",
    "replay": "replay real traces (torch.profiler or Chakra) on a simulated topology",
}

EXAMPLES = """\
main commands (each has --help):
  clusterplan topology show selene-a100:nodes=64      GPUs, nodes, tiers, bisection bandwidth
  clusterplan gpus                                     the GPU catalog with sources
  clusterplan collective allreduce --size 1GiB --ranks 64 --topology h100-ib
  clusterplan simulate gpt3-175b --topology selene-a100 --gpus 512 --parallel tp=8,pp=8,dp=8
  clusterplan simulate dp-step --topology h100-ib --straggler 3=1.1 --diagnose   what-if faults
  clusterplan plan llama3-70b --topology two-buildings-h100 --out plan.json   LLM layout search
  clusterplan plan criteo-dlrm --devices 8 --planner mip --out dlrm.json    embedding sharding
  clusterplan simulate mlperf-dcnv2 --topology dgx-h100 --gpus 64 --trainer hugectr   DLRM step
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


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser, with every command listed and the one ``argv`` names fully registered."""
    p = argparse.ArgumentParser(
        prog="clusterplan", description="Simulate and plan training on GPU clusters.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, help_ in COMMANDS.items():
        parser = sub.add_parser(name, help=help_)
        if name == chosen:
            command_module(name).register(parser)
    p.set_defaults(main=main)      # for commands that run other commands (sweep)
    return p


def command_module(name: str):
    """The module of command ``name`` (``planner.cli.<name>``)."""
    return importlib.import_module(f"planner.cli.{name}")


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as one line on stderr, like the errors (no source line, no traceback)."""
    print(f"clusterplan: warning: {message}", file=sys.stderr)


class Terminated(Exception):
    """SIGTERM arrived: raised where the program was, so cleanups run (a solver child is
    killed, temporary folders and half-written outputs are removed)."""


@contextlib.contextmanager
def _sigterm_unwinds():
    """While the command runs, SIGTERM raises :class:`Terminated` instead of ending the process
    at once (only from the main thread, and only over the default handler)."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def raise_terminated(_sig, _frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``clusterplan argv`` (default: the process's arguments); returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        with warnings.catch_warnings(), _sigterm_unwinds():
            warnings.showwarning = _show_warning
            return int(args.func(args) or 0)
    except ClusterplanError as exc:
        print(f"clusterplan: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("clusterplan: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("clusterplan: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
