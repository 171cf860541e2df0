"""``clusterplan fidelity``: iteration-time error against published LLM runs."""

from __future__ import annotations

import argparse

from planner.cli.llm import fidelity
from planner.cli.output import emit
from planner.llm.fidelity import VTRAIN_DIR

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Simulate the published configurations of Narayanan 2021 "
                     "Table 1, Korthikanti 2022 and the vTrain multi-node runs, each row "
                     "through the same spec path as 'clusterplan simulate', and print the "
                     "error per row and the MAPE per set. The sets, their trainer presets "
                     "and assumptions are data: traces/published/*.yaml.")
    p.add_argument("--set", action="append",
                   choices=("narayanan", "korthikanti", "vtrain", "vtrain-single"),
                   help="default: narayanan, korthikanti, vtrain (vtrain-single: vTrain's 1,440 "
                        "one-node runs)")
    p.add_argument("--vtrain-dir", default=str(VTRAIN_DIR),
                   help="folder with ground_truth_multi.csv (default ../shared/data/vtrain)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each set")
    p.add_argument("--emit-specs", metavar="DIR", default=None,
                   help="also write each row as a model spec file and its simulate command "
                        "line (DIR/commands.sh)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    """Simulate the published rows of each chosen set and print the errors."""
    return fidelity(args, emit)
