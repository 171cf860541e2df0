"""torchtitan job settings (formats.md §3): a v0.2.x job TOML, and the command-line overrides
``--training.*`` / ``--parallelism.*`` after ``--module/--config`` that torchtitan 0.3.0 (the
current release, whose configs are Python registries) reads; the overrides carry every setting
of the plan (degrees, schedule, micro-batch, local and global batch, sequence length).

torchtitan's mesh is ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]`` outermost first, which is
the physical layout of Megatron's ``tp-cp-dp-pp`` with dp = dp_shard (inner) x dp_replicate
(outer); plans in any other order are refused because torchtitan cannot reorder its mesh.
"""

from __future__ import annotations

import re
import shlex
from typing import Mapping

import tomllib

from simulator.errors import SpecError

from planner.export import _plan

__all__ = ["export_torchtitan", "validate_torchtitan", "unsupported", "TOML_FILE", "ARGS_FILE",
           "TARGET_VERSION", "torchtitan_degrees"]

TARGET_VERSION = "torchtitan 0.3.0 (overrides) and v0.2.2 (TOML)"
TOML_FILE = "torchtitan.toml"
ARGS_FILE = "torchtitan.args"


def torchtitan_degrees(plan: Mapping, hsdp_shard: int | None = None) -> dict[str, int]:
    """(dp_replicate, dp_shard) split of the plan's dp for its FSDP mode."""
    p = plan["parallel"]
    dp, mode = p["dp"], p.get("fsdp", "none")
    if mode == "zero3":
        rep, shard = 1, dp
    elif mode == "hsdp":
        shard = _plan.hsdp_shard_degree(plan, hsdp_shard)
        rep = dp // shard
    else:  # none / zero1 / zero2: DDP; torchtitan has no ZeRO-1/2 optimizer sharding
        rep, shard = dp, 1
    return {"data_parallel_replicate_degree": rep, "data_parallel_shard_degree": shard,
            "tensor_parallel_degree": p["tp"], "context_parallel_degree": p["cp"],
            "pipeline_parallel_degree": p["pp"],
            **({"expert_parallel_degree": p["ep"]} if p.get("ep", 1) > 1 else {})}


def _model_section(name: str) -> tuple[str, str] | None:
    m = re.fullmatch(r"llama3-(\d+)b", name or "")
    return ("llama3", f"{m.group(1)}B") if m else None


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def unsupported(p: Mapping, order: str) -> tuple[str, str, str] | None:
    """Why torchtitan cannot run layout ``p`` in ``order`` (message, field, fix), or None."""
    if order != "tp-cp-dp-pp":
        return (f"order {order!r} cannot be expressed: torchtitan's mesh is pp, dp_replicate, "
                "dp_shard, cp, tp (outermost first)", "order",
                "plan with --for torchtitan (order tp-cp-dp-pp) or export to megatron")
    return None


def export_torchtitan(plan: dict, *, num_layers: int | None = None,
                      seq_len: int | None = None, hsdp_shard: int | None = None
                      ) -> dict[str, str]:
    """Plan → ``{"torchtitan.toml": ..., "torchtitan.args": ...}``."""
    _plan.check_plan(plan)
    p = plan["parallel"]
    why = unsupported(p, plan.get("order", "tp-cp-dp-pp"))
    if why:
        raise SpecError(why[0], field=why[1], fix=why[2])
    deg = torchtitan_degrees(plan, hsdp_shard)
    mode = p.get("fsdp", "none")
    layers = _plan.num_layers(plan, num_layers)
    seq = _plan.seq_len(plan, seq_len)
    mbs, gbs, dp = plan["micro_batch_size"], plan["global_batch_size"], p["dp"]
    par: dict[str, object] = dict(deg)
    notes = [f"clusterplan export for {TARGET_VERSION}",
             f"model {plan.get('model')} on {plan.get('topology')}, world {_plan.world(plan)}, "
             f"fsdp={mode}"]
    if mode in ("zero1", "zero2"):
        notes.append(f"plan uses {mode} optimizer sharding; torchtitan has no ZeRO-1/2, so this "
                     "is plain DDP (replicate) with full optimizer state per rank; use "
                     "fsdp=zero3 to shard")
    if p["pp"] > 1:
        par["pipeline_parallel_schedule"] = "Interleaved1F1B" if p["vpp"] > 1 else "1F1B"
        par["pipeline_parallel_microbatch_size"] = mbs
        if p["vpp"] > 1:
            if layers is None:
                raise SpecError("vpp > 1 needs the model's layer count to set layers per stage",
                                field="num_layers", fix="pass --num-layers N")
            if layers % (p["pp"] * p["vpp"]):
                raise SpecError(f"{layers} layers do not split into pp*vpp = "
                                f"{p['pp'] * p['vpp']} stages", field="parallel.vpp",
                                fix="choose vpp so that layers divide by pp*vpp")
            par["pipeline_parallel_layers_per_stage"] = layers // (p["pp"] * p["vpp"])
            notes.append("layers per stage assumes first/last_stage_less_layers = 0")
            par["pipeline_parallel_first_stage_less_layers"] = 0
            par["pipeline_parallel_last_stage_less_layers"] = 0
        # with PP, local_batch_size is split into micro-batches inside one step
        local = gbs // dp
    else:
        # without PP, gradient accumulation = global / (local * dp)
        local = mbs
    training: dict[str, object] = {"local_batch_size": local, "global_batch_size": gbs}
    if seq is not None:
        if seq % (p["tp"] * 2 * p["cp"]) and p["cp"] > 1:
            raise SpecError(f"seq_len {seq} is not divisible by tp*2*cp", field="seq_len",
                            fix="pick a sequence length divisible by tp*2*cp")
        training["seq_len"] = seq
    lines = [f"# {n}" for n in notes] + [""]
    if (ms := _model_section(str(plan.get("model")))) is not None:
        lines += ["[model]", f'name = "{ms[0]}"', f'flavor = "{ms[1]}"', ""]
    lines.append("[training]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in training.items()]
    lines += ["", "[parallelism]"]
    lines += [f"{k} = {_toml_value(v)}" for k, v in par.items()]
    toml_text = "\n".join(lines) + "\n"
    args: list[str] = []
    if ms is not None:
        args += ["--module", ms[0], "--config", f"{ms[0]}_{ms[1].lower()}"]
    for k, v in training.items():
        args += [f"--training.{k}", str(v)]
    if p["pp"] > 1:        # 0.3.0 refuses CUDA graphs with pipeline parallelism at start-up
        args.append("--training.disable_cuda_graphs")
    for k, v in par.items():
        args += [f"--parallelism.{k}", str(v)]
    args_text = " ".join(shlex.quote(a) for a in args) + "\n"
    files = {TOML_FILE: toml_text, ARGS_FILE: args_text}
    validate_torchtitan(files, plan)
    return files


def validate_torchtitan(files: Mapping[str, str], plan: Mapping | None = None) -> dict:
    """Re-parse both files; check the invariants torchtitan checks at start-up."""
    doc = tomllib.loads(files[TOML_FILE])
    par = doc["parallelism"]
    prod = 1
    for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
              "tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree"):
        if not isinstance(par.get(k), int) or par[k] < 1:
            raise SpecError(f"{k} = {par.get(k)!r}", source=TOML_FILE, field=f"parallelism.{k}",
                            fix="report this exporter bug")
        prod *= par[k]
    toks = shlex.split(files[ARGS_FILE])
    for section in ("parallelism", "training"):
        over = {toks[i][len(section) + 3:]: toks[i + 1] for i in range(len(toks) - 1)
                if toks[i].startswith(f"--{section}.") and not toks[i + 1].startswith("--")}
        for k, v in over.items():
            if str(doc[section].get(k)) != v:
                raise SpecError(f"override {k}={v} disagrees with the TOML "
                                f"({doc[section].get(k)!r})", source=ARGS_FILE, field=k,
                                fix="report this exporter bug")
    if plan is not None:
        if prod != _plan.world(plan):
            raise SpecError(f"degrees multiply to {prod}, world is {_plan.world(plan)}",
                            source=TOML_FILE, field="parallelism", fix="report this exporter bug")
        t = doc["training"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        if t["global_batch_size"] % (t["local_batch_size"] * dp):
            raise SpecError("global batch is not a multiple of local batch x dp",
                            source=TOML_FILE, field="training", fix="report this exporter bug")
    return doc
