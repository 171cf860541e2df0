"""Argument helpers several commands share: the topology flags, and telling a model spec from
a table spec or an op graph."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text
from simulator.topology import Topology, load_topology

from planner.model.llm.spec import LLMSpec, builtin_model_names
from planner.model.llm.trainer import PRESETS, TRAINER_KEYS, trainer_from_args
from planner.model.tables.dense import ACTIVATION_BYTES
from planner.model.tables.spec_file import builtin_spec_names
from planner.model.tables.trainer import DLRM_PRESETS, DLRM_TRAINER_CHOICES, dlrm_trainer_from_args

__all__ = ["topology_arguments", "topology_from_args", "is_model", "is_llm_plan", "is_table_spec",
           "trainer_arguments", "with_trainer", "with_dlrm_trainer", "DENSE_DTYPES"]

#: the dense part's compute dtypes a table spec may name (``dense.dtype``, ``--dense-dtype``)
DENSE_DTYPES = tuple(ACTIVATION_BYTES)


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


def trainer_arguments(p: argparse.ArgumentParser) -> None:
    """Add ``--trainer NAME`` and ``--trainer-set KEY=VALUE`` (model specs' ``trainer:``)."""
    p.add_argument("--trainer", metavar="NAME", default=None,
                   help="the trainer preset, replacing the spec's trainer: section; model specs: "
                        f"{', '.join(PRESETS)}; table specs: {', '.join(DLRM_PRESETS)}")
    p.add_argument("--trainer-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override one trainer setting (repeatable); model specs' keys: "
                        f"{', '.join(k for k in TRAINER_KEYS if k != 'preset')}; table specs': "
                        + ", ".join(f"{k}={'|'.join(v)}" for k, v in DLRM_TRAINER_CHOICES.items()))
    p.add_argument("--dense-dtype", default=None, choices=DENSE_DTYPES,
                   help="table specs: the dense part's compute dtype, replacing the spec's "
                        "dense.dtype (fp16 or bf16 for a run under mixed precision, tf32 for "
                        "TF32 GEMMs)")


def with_trainer(spec: LLMSpec, args: argparse.Namespace) -> LLMSpec:
    """``spec`` with ``--trainer`` and ``--trainer-set`` applied to its ``trainer:``."""
    if getattr(args, "dense_dtype", None):
        raise SpecError("--dense-dtype applies to table specs, not model specs",
                        source="--dense-dtype", fix="drop the flag; a model spec's precision "
                        "is its training: section's")
    name, sets = getattr(args, "trainer", None), getattr(args, "trainer_set", None)
    if not name and not sets:
        return spec
    return replace(spec, trainer=trainer_from_args(spec.trainer, name, sets))


def with_dlrm_trainer(model, args: argparse.Namespace):
    """A table spec's ``model`` (:class:`planner.model.tables.spec.ModelSpec`) with
    ``--trainer`` and ``--trainer-set`` applied to its ``trainer:`` and ``--dense-dtype`` to
    its dense part."""
    dtype = getattr(args, "dense_dtype", None)
    if dtype:
        if model.dense is None:
            raise SpecError(f"{model.name} has no dense part for --dense-dtype to set",
                            source="--dense-dtype", field="dense",
                            fix="drop the flag, or give the spec a dense: section")
        model = replace(model, dense=replace(model.dense, dtype=dtype))
    return replace(model, trainer=dlrm_trainer_from_args(
        model.trainer, getattr(args, "trainer", None), getattr(args, "trainer_set", None)))


def _peek(ref: str):
    """The parsed document of a YAML or JSON file ``ref`` (None if it is none, or unreadable:
    the loader that follows says why)."""
    p = Path(ref)
    if p.suffix not in (".yaml", ".yml", ".json") or not p.is_file():
        return None
    try:
        return parse_yaml(read_text(p), source=str(p))
    except SpecError:
        return None


def is_model(ref: str) -> bool:
    """True when ``ref`` is a built-in LLM name or a YAML or JSON file with a ``model:``
    section (a plan written by ``plan`` is not one: see :func:`is_llm_plan`)."""
    if ref in builtin_model_names():
        return True
    doc = _peek(ref)
    return isinstance(doc, dict) and "model" in doc and doc.get("kind") != "llm-plan"


def is_het(ref: str) -> bool:
    """True when ``ref`` is a parameter-server spec with worker caches (``kind: het``)."""
    doc = _peek(ref)
    return isinstance(doc, dict) and doc.get("kind") == "het"


def is_llm_plan(ref: str) -> bool:
    """True when ``ref`` is a plan written by ``clusterplan plan MODEL`` (``kind: llm-plan``)."""
    doc = _peek(ref)
    return isinstance(doc, dict) and doc.get("kind") == "llm-plan"


def is_table_spec(ref: str) -> bool:
    """True when ``ref`` is a built-in table spec name (criteo-dlrm ...), a CSV of tables, or a
    YAML file with a ``tables:`` section and no ``model:`` one."""
    if ref in builtin_spec_names():
        return True
    if Path(ref).suffix.lower() == ".csv" and Path(ref).is_file():
        return True
    doc = _peek(ref)
    return isinstance(doc, dict) and "tables" in doc and "model" not in doc
