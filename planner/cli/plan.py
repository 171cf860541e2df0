"""``clusterplan plan``: LLM parallelism for a model spec, embedding sharding for a table spec."""

from __future__ import annotations

import argparse

from simulator.errors import SpecError
from simulator.topology import load_topology

from planner.cli import tables
from planner.cli.constraints import TARGETS
from planner.cli.llm import plan_model
from planner.cli.options import is_model, trainer_arguments, with_trainer
from planner.cli.output import emit
from planner.cli.tables import add_arguments
from planner.model.llm.spec import load_llm_spec

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("With a model spec (llama3-70b, MODEL.yaml): search TP/CP/PP/"
                     "DP/vpp/micro-batch/FSDP layouts on --topology and print the "
                     "best by simulated step time. With a table spec (YAML or CSV; "
                     "built-in criteo-dlrm, mlperf-dcnv2): shard the tables over "
                     "--devices N so the slowest device is as fast as possible.")
    add_arguments(p, devices_required=False)
    p.add_argument("--top", type=int, default=5, metavar="K", help="model plans: layouts to show")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="model plans: resize the topology to N GPUs (--devices N says the "
                        "same; for table plans --gpus N is --devices N)")
    p.add_argument("--constrain", metavar="SPEC",
                   help="model plans: search only layouts with these values, e.g. "
                        "tp=8,cp=1,vpp=1,fsdp=none|zero1,mbs=1 (keys: tp cp pp dp vpp ep mbs "
                        "fsdp order; | separates allowed values)")
    p.add_argument("--for", dest="target", metavar="TARGET", choices=sorted(TARGETS),
                   help="model plans: only layouts this trainer's export can run "
                        f"({', '.join(sorted(TARGETS))})")
    trainer_arguments(p)
    p.set_defaults(func=run)


# per-rank all-to-all matrices grow with N² (4,096 devices: ~30 s, ~7 GB): a bound, not a hang
MAX_SHARDING_DEVICES = 4_096


def _gpu_count(args) -> int | None:
    """``--devices`` and ``--gpus`` name one count for either kind of plan; both given must agree."""
    if args.devices is not None and args.gpus is not None and args.devices != args.gpus:
        raise SpecError(f"--devices {args.devices} and --gpus {args.gpus} disagree",
                        field="--gpus", fix="give one of them")
    return args.gpus if args.gpus is not None else args.devices


def run(args) -> int:
    """Plan a model spec's parallelism or a table spec's sharding, whichever ``TABLES`` is."""
    args.gpus = args.devices = _gpu_count(args)
    if is_model(args.tables):
        if not args.topology:
            raise SpecError("a model plan needs --topology", field="--topology",
                            fix="pass e.g. --topology h100-ib --gpus 1024")
        topo = load_topology(args.topology, gpus=args.gpus)
        return plan_model(args, with_trainer(load_llm_spec(args.tables), args), topo, emit)
    if args.constrain or args.target:
        raise SpecError("--constrain and --for apply to model specs, not table specs",
                        source=args.tables, field="--constrain" if args.constrain else "--for",
                        fix="drop the flag (table plans take --sharding-types)")
    if args.devices is None:
        raise SpecError("a sharding plan needs --devices", field="--devices",
                        fix="pass --devices N")
    if args.devices > MAX_SHARDING_DEVICES:
        raise SpecError(f"--devices {args.devices} is more than the {MAX_SHARDING_DEVICES:,} "
                        "this planner handles", field="--devices",
                        fix=f"plan for at most {MAX_SHARDING_DEVICES:,} devices (shard per "
                            "embedding-parallel group and replicate)")
    return tables.run(args)
