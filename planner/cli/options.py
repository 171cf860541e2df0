"""Argument helpers several commands share: the topology flags, and telling a model spec from
a table spec or an op graph."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from simulator.topology import Topology, load_topology

from planner.model.llm.spec import builtin_model_names

__all__ = ["topology_arguments", "topology_from_args", "is_model"]


def topology_arguments(p: argparse.ArgumentParser, *, default: str | None = None) -> None:
    """Add ``--topology NAME|FILE`` (required unless ``default``) and ``--gpus N``."""
    p.add_argument("--topology", default=default, required=default is None, metavar="NAME|FILE",
                   help="built-in name or YAML file; NAME:key=value,... overrides fields "
                        "(e.g. selene-a100:nodes=192)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="resize a generated topology to at least N GPUs (sets nodes)")


def topology_from_args(args: argparse.Namespace) -> Topology:
    """The topology ``--topology`` names, resized to ``--gpus`` when given."""
    return load_topology(args.topology, gpus=args.gpus)


def is_model(ref: str) -> bool:
    """True when ``ref`` is a built-in LLM name or a YAML file with a ``model:`` section."""
    if ref in builtin_model_names():
        return True
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") and p.exists():
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError:
            return False
        return isinstance(doc, dict) and "model" in doc
    return False
