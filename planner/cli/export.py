"""``clusterplan export PLAN --to TARGET [--out DIR_OR_FILE]`` (torchtitan, megatron, deepspeed,
hostfile, torchrec, torchrec-py, hugectr).

An LLM plan (``"kind": "llm-plan"``) goes to torchtitan, Megatron-LM, DeepSpeed or a host file;
an embedding sharding plan (``"format": "clusterplan.sharding-plan"``) goes ``--to torchrec``
(:mod:`planner.export.torchrec`: a versioned JSON that
:func:`planner.export.torchrec_load.load_sharding_plan` turns into TorchRec's ``ShardingPlan``)
or ``--to torchrec-py`` (:mod:`planner.export.torchrec_py`: a Python module that builds the same
plan with TorchRec alone), or ``--to hugectr`` (:mod:`planner.export.hugectr`: the shard matrix
and strategy HugeCTR's embedding collection takes).

The lead wires :func:`add_arguments` and :func:`run` into ``planner.cli.main``; :func:`main` runs the
command on its own (exit 2 and one line on bad input, as every clusterplan command).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from simulator.errors import ClusterplanError, SpecError
from simulator.fileio import dumps_json, read_json_file

from planner.cli.output import atomic_write
from planner.export import TARGETS, export_plan
from planner.export._plan import check_plan
from planner.export.hugectr import HUGECTR_FILE, export_hugectr_plan
from planner.export.torchrec import export_torchrec_plan
from planner.export.torchrec_format import is_sharding_plan, torchrec_plan_json
from planner.export.torchrec_py import TORCHREC_PY_FILE, torchrec_plan_module
from planner.model.llm.spec import builtin_model_names, load_llm_spec

__all__ = ["register", "add_arguments", "run", "main", "load_plan", "read_plan_file", "write_files",
           "TORCHREC", "TORCHREC_FILE", "TORCHREC_PY"]

#: the target for embedding sharding plans (the others take LLM plans)
TORCHREC = "torchrec"
TORCHREC_FILE = "torchrec_plan.json"
#: the same plan as a Python module that needs only torch and TorchRec
TORCHREC_PY = "torchrec-py"
#: an embedding sharding plan as HugeCTR's shard matrix and strategy
HUGECTR = "hugectr"


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Turn an LLM plan JSON (clusterplan plan MODEL --out plan.json) "
                     "into torchtitan, Megatron-LM or DeepSpeed settings, or a "
                     "host/rank file that places every rank where the plan put it.")
    add_arguments(p)
    p.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", metavar="PLAN", help="plan JSON from `clusterplan plan --out`")
    parser.add_argument("--to", required=True,
                        choices=list(TARGETS) + [TORCHREC, TORCHREC_PY, HUGECTR],
                        help="target framework (torchrec: an embedding sharding plan as JSON "
                             "for clusterplan's loader; torchrec-py: as a Python module that "
                             "needs only TorchRec; hugectr: as HugeCTR's shard_matrix and "
                             "shard_strategy)")
    parser.add_argument("--out", metavar="DIR_OR_FILE",
                        help="directory for the files (a file path if the target writes one); "
                             "default: print them")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--num-layers", type=int, help="transformer layers if the plan lacks them")
    parser.add_argument("--seq-len", type=int, help="sequence length if the plan lacks it")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp8", "fp32"])
    parser.add_argument("--hsdp-shard", type=int,
                        help="HSDP shard degree (default: the DP ranks on one host)")
    parser.add_argument("--module-fqn", default="", metavar="FQN",
                        help="torchrec: path of the EmbeddingBagCollection inside the module "
                             "DistributedModelParallel wraps (default: it is that module)")
    parser.add_argument("--device", choices=["cpu", "cuda"],
                        help="torchrec: shard placements (default: cpu for a plan made for a "
                             "CPU topology, else cuda)")


def read_plan_file(path: str) -> dict:
    """Read a plan file as JSON; every failure is a SpecError naming the file."""
    return read_json_file(path, field="PLAN",
                          missing_fix="write one with `clusterplan plan MODEL --out plan.json`",
                          json_fix="pass the JSON written by `clusterplan plan MODEL --out "
                                   "plan.json`")


def load_plan(path: str) -> dict:
    """Read and check an LLM plan file; every failure is a SpecError naming the file."""
    doc = read_plan_file(path)
    if is_sharding_plan(doc):
        raise SpecError("an embedding sharding plan cannot go to an LLM trainer", source=path,
                        field="format", fix="export it with --to torchrec or --to hugectr")
    try:
        return check_plan(doc, source=path)
    except SpecError as exc:
        raise exc.at(source=path) from None


def _fill_from_model(plan: dict, args) -> dict:
    """Options the plan lacks, taken from the built-in model of the same name when there is one."""
    opts = {"num_layers": args.num_layers, "seq_len": args.seq_len, "precision": args.precision,
            "hsdp_shard": args.hsdp_shard}
    try:
        if plan.get("model") in builtin_model_names():
            spec = load_llm_spec(plan["model"])
            if opts["num_layers"] is None and "num_layers" not in plan:
                opts["num_layers"] = spec.model.layers
            if opts["seq_len"] is None and "seq_len" not in plan:
                opts["seq_len"] = spec.model.seq_len
            if opts["precision"] is None and "precision" not in plan:
                opts["precision"] = spec.training.precision
    except (ImportError, ClusterplanError):
        pass
    return opts


def write_files(files: dict[str, str], out: str) -> list[str]:
    """Write to ``out``: a directory (made if its parent exists) or, for one file, a file path."""
    dest = Path(out)
    as_dir = dest.is_dir() or out.endswith(("/", os.sep)) or len(files) > 1
    parent = dest if as_dir and dest.is_dir() else dest.parent
    if not (parent if parent != Path("") else Path(".")).resolve().is_dir():
        raise SpecError(f"directory of {out} does not exist", field="--out",
                        fix="create the directory first")
    if as_dir:
        if dest.exists() and not dest.is_dir():
            raise SpecError(f"{out} is a file but the target writes {len(files)} files",
                            field="--out", fix="pass a directory")
        dest.mkdir(exist_ok=True)
        paths = [dest / name for name in files]
    else:
        paths = [dest]
    for path, text in zip(paths, files.values()):
        atomic_write(path, text)
    return [str(p) for p in paths]


def _export_torchrec(args) -> dict[str, str]:
    doc = read_plan_file(args.plan)
    out = export_torchrec_plan(doc, module_fqn=getattr(args, "module_fqn", "") or "",
                               device=getattr(args, "device", None), source=args.plan)
    if args.to == TORCHREC_PY:
        return {TORCHREC_PY_FILE: torchrec_plan_module(out, source=args.plan)}
    return {TORCHREC_FILE: torchrec_plan_json(out)}


def run(args) -> int:
    if args.to in (TORCHREC, TORCHREC_PY):
        files = _export_torchrec(args)
    elif args.to == HUGECTR:
        out = export_hugectr_plan(read_plan_file(args.plan), source=args.plan)
        files = {HUGECTR_FILE: dumps_json(out, indent=1) + "\n"}
    else:
        plan = load_plan(args.plan)
        try:
            files = export_plan(plan, args.to, **_fill_from_model(plan, args))
        except SpecError as exc:
            raise exc.at(source=exc.source or args.plan) from None
    written = write_files(files, args.out) if args.out else []
    if args.json:
        print(dumps_json({"target": args.to, "plan": args.plan, "written": written,
                          "files": files}, indent=1))
    elif written:
        print(f"{args.to}: wrote " + ", ".join(written))
    else:
        for name, text in files.items():
            if len(files) > 1:
                print(f"==> {name} <==")
            sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clusterplan export",
                                     description="Export a plan to a trainer config.")
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        return run(args)
    except ClusterplanError as exc:
        print(f"clusterplan: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
