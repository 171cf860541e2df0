"""DeepSpeed config JSON plus the ``PipeModelDataParallelTopology`` arguments (formats.md §5).

DeepSpeed's ``ProcessTopology(axes=["pipe", "data", "model"])`` is row-major (model fastest), the
same physical layout as the plan's ``tp-cp-dp-pp`` with cp = 1. The pipeline degree is set in code
(``PipelineModule(num_stages=...)``), so it goes to ``deepspeed_topology.json`` next to the config.
"""

from __future__ import annotations

import json
from typing import Mapping

from simulator.errors import SpecError

from planner.export import _plan

__all__ = ["export_deepspeed", "validate_deepspeed", "unsupported", "CONFIG_FILE",
           "TOPOLOGY_FILE", "ZERO_STAGE"]

CONFIG_FILE = "ds_config.json"
TOPOLOGY_FILE = "deepspeed_topology.json"
ZERO_STAGE = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3}


def unsupported(p: Mapping, order: str) -> tuple[str, str, str] | None:
    """Why DeepSpeed cannot run layout ``p`` (degrees and ``fsdp``) in ``order``, as (message,
    field, fix); None when it can. ``plan --for deepspeed`` searches only layouts it can run."""
    stage = ZERO_STAGE[p.get("fsdp", "none")]
    if order != "tp-cp-dp-pp":
        return (f"order {order!r} cannot be expressed: DeepSpeed's topology is pipe, data, "
                "model (outermost first)", "order", "plan with order tp-cp-dp-pp")
    if p["cp"] > 1:
        return (f"cp={p['cp']}: DeepSpeed has no context-parallel setting in its config "
                "(Ulysses comes from process-group code)", "parallel.cp",
                "plan with --for deepspeed (or cp=1), or export to megatron/torchtitan")
    if p["vpp"] > 1:
        return (f"vpp={p['vpp']}: DeepSpeed's pipeline engine has no interleaved schedule",
                "parallel.vpp",
                "plan with --for deepspeed (or vpp=1), or export to megatron/torchtitan")
    if p["pp"] > 1 and stage > 1:
        return (f"fsdp={p.get('fsdp')} (ZeRO stage {stage}) with pp={p['pp']}: DeepSpeed's "
                "pipeline engine supports ZeRO stage 0 or 1 only", "parallel.fsdp",
                "plan with --for deepspeed (or fsdp none or zero1 when pp > 1)")
    return None


def export_deepspeed(plan: dict, *, precision: str | None = None,
                     hsdp_shard: int | None = None) -> dict[str, str]:
    """Plan → ``{"ds_config.json": ..., "deepspeed_topology.json": ...}``."""
    _plan.check_plan(plan)
    p = plan["parallel"]
    why = unsupported(p, plan.get("order", "tp-cp-dp-pp"))
    if why:
        raise SpecError(why[0], field=why[1], fix=why[2])
    mode = p.get("fsdp", "none")
    stage = ZERO_STAGE[mode]
    prec = _plan.precision(plan, precision)
    mbs, gbs, dp = plan["micro_batch_size"], plan["global_batch_size"], p["dp"]
    zero: dict[str, object] = {"stage": stage}
    if stage >= 1:
        zero.update(overlap_comm=True, contiguous_gradients=True)
    if mode == "hsdp":
        zero["mics_shard_size"] = _plan.hsdp_shard_degree(plan, hsdp_shard)
    cfg: dict[str, object] = {
        "train_batch_size": gbs,
        "train_micro_batch_size_per_gpu": mbs,
        "gradient_accumulation_steps": gbs // (mbs * dp),
        "bf16": {"enabled": prec in ("bf16", "fp8")},
        "fp16": {"enabled": prec == "fp16"},
        "zero_optimization": zero,
    }
    if p["tp"] > 1:
        cfg["tensor_parallel"] = {"autotp_size": p["tp"]}
    if p["pp"] > 1:
        cfg["pipeline"] = {"stages": p["pp"], "partition": "uniform"}
    topo = {"format": "clusterplan.deepspeed-topology", "schema_version": 1,
            "class": "PipeModelDataParallelTopology", "axes": ["pipe", "data", "model"],
            "num_pp": p["pp"], "num_dp": dp, "num_mp": p["tp"],
            "note": "PipelineModule(num_stages=num_pp, topology="
                    "PipeModelDataParallelTopology(num_pp, num_mp, num_dp))"}
    files = {CONFIG_FILE: json.dumps(cfg, indent=2) + "\n",
             TOPOLOGY_FILE: json.dumps(topo, indent=2) + "\n"}
    validate_deepspeed(files, plan)
    return files


def validate_deepspeed(files: Mapping[str, str], plan: Mapping | None = None) -> dict:
    """Re-parse; check DeepSpeed's batch identity and the topology's world size."""
    cfg = json.loads(files[CONFIG_FILE])
    topo = json.loads(files[TOPOLOGY_FILE])
    dp = topo["num_dp"]
    if cfg["train_batch_size"] != (cfg["train_micro_batch_size_per_gpu"]
                                   * cfg["gradient_accumulation_steps"] * dp):
        raise SpecError("train_batch_size != micro x accumulation x dp", source=CONFIG_FILE,
                        field="train_batch_size", fix="report this exporter bug")
    if cfg["zero_optimization"]["stage"] not in (0, 1, 2, 3):
        raise SpecError("bad ZeRO stage", source=CONFIG_FILE, field="zero_optimization.stage",
                        fix="report this exporter bug")
    if plan is not None and topo["num_pp"] * topo["num_dp"] * topo["num_mp"] != _plan.world(plan):
        raise SpecError("topology does not cover the world", source=TOPOLOGY_FILE,
                        fix="report this exporter bug")
    return cfg
