"""Megatron-LM / Megatron-Core launch arguments for ``pretrain_gpt.py`` (formats.md §4).

Megatron's default ``RankGenerator`` order ``tp-cp-ep-dp-pp`` (first token stride 1) is the plan's
``tp-cp-dp-pp``; ``tp-cp-pp-dp`` maps to ``--use-tp-pp-dp-mapping``; other orders are refused.
"""

from __future__ import annotations

import shlex
from typing import Mapping

from simulator.errors import SpecError

from planner.export import _plan

__all__ = ["export_megatron", "validate_megatron", "unsupported", "ARGS_FILE",
           "parse_megatron_args"]

ARGS_FILE = "megatron.args"

_ORDERS = {"tp-cp-dp-pp": [], "tp-cp-pp-dp": ["--use-tp-pp-dp-mapping"]}


def unsupported(p: Mapping, order: str) -> tuple[str, str, str] | None:
    """Why Megatron cannot run layout ``p`` in ``order`` (message, field, fix), or None."""
    if order not in _ORDERS:
        return (f"order {order!r} has no Megatron equivalent", "order",
                "plan with order tp-cp-dp-pp or tp-cp-pp-dp")
    return None


def export_megatron(plan: dict, *, num_layers: int | None = None,
                    seq_len: int | None = None, precision: str | None = None) -> dict[str, str]:
    """Plan → ``{"megatron.args": ...}``: one flag (with its value) per line, shlex-parseable."""
    _plan.check_plan(plan)
    p = plan["parallel"]
    order = plan.get("order", "tp-cp-dp-pp")
    why = unsupported(p, order)
    if why:
        raise SpecError(why[0], field=why[1], fix=why[2])
    layers = _plan.num_layers(plan, num_layers)
    seq = _plan.seq_len(plan, seq_len)
    prec = _plan.precision(plan, precision)
    mode = p.get("fsdp", "none")
    tr = plan.get("trainer") or {}
    a = (_layer_flags(p, layers, int(tr.get("trim_first_last_stage", 0)), tr)
         + _expert_flags(plan, p) + [[flag] for flag in _ORDERS[order]]
         + _batch_flags(plan, p, seq) + _precision_flags(prec)
         + _data_parallel_flags(p, mode, tr))
    header = (f"# clusterplan export: Megatron-LM pretrain_gpt.py arguments for "
              f"{plan.get('model')} on {plan.get('topology')}; world {_plan.world(plan)} "
              f"(dp = {p['dp']}, micro-batches per step = {plan.get('microbatches')}), "
              f"fsdp={mode}\n")
    if mode == "hsdp":
        header += ("# hsdp: Megatron FSDP shards over the whole DP group here; "
                   "the plan's replicate split is not expressed\n")
    text = header + "\n".join(" ".join(shlex.quote(t) for t in line) for line in a) + "\n"
    files = {ARGS_FILE: text}
    validate_megatron(files, plan)
    return files


def _layer_flags(p: dict, layers: int | None, trim: int, tr: dict) -> list[list[str]]:
    """Layers, tensor (sequence parallelism, its overlap, the attention kernel), pipeline
    (virtual stages, uneven end stages) and context parallelism."""
    a: list[list[str]] = []
    if layers is not None:
        if (layers + 2 * trim) % p["pp"]:
            raise SpecError(f"{layers} layers do not split over pp={p['pp']}"
                            + (f" with {trim} off the first and last stage" if trim else ""),
                            field="num_layers", fix="choose pp dividing the layer count")
        a.append(["--num-layers", str(layers)])
        if trim and p["pp"] > 2:
            end = str((layers + 2 * trim) // p["pp"] - trim)
            a += [["--decoder-first-pipeline-num-layers", end],
                  ["--decoder-last-pipeline-num-layers", end]]
    a.append(["--tensor-model-parallel-size", str(p["tp"])])
    if p["tp"] > 1 and tr.get("sequence_parallel", True):
        a.append(["--sequence-parallel"])
        if tr.get("tp_comm_overlap", False):
            a.append(["--tp-comm-overlap"])
    if tr.get("attention") == "standard":
        a.append(["--attention-backend", "unfused"])
    elif tr:
        a.append(["--attention-backend", "flash"])
    a.append(["--pipeline-model-parallel-size", str(p["pp"])])
    if p["vpp"] > 1:
        a.append(_virtual_stages_flag(p, layers, trim))
    a.append(["--context-parallel-size", str(p["cp"])])
    return a


def _virtual_stages_flag(p: dict, layers: int | None, trim: int) -> list[str]:
    """The virtual pipeline stages: chunks per rank with uneven end stages (Megatron-Core
    counts chunks, not layers per chunk, then), else layers per chunk."""
    if layers is None:
        raise SpecError("vpp > 1 needs the model's layer count for "
                        "--num-layers-per-virtual-pipeline-stage", field="num_layers",
                        fix="pass --num-layers N (or a plan that records num_layers)")
    if (layers + 2 * trim) % (p["pp"] * p["vpp"]):
        raise SpecError(f"{layers} layers do not split into pp*vpp = {p['pp'] * p['vpp']} "
                        "virtual stages", field="parallel.vpp",
                        fix="choose vpp so that layers divide by pp*vpp")
    if trim:
        return ["--num-virtual-stages-per-pipeline-rank", str(p["vpp"])]
    return ["--num-layers-per-virtual-pipeline-stage", str(layers // (p["pp"] * p["vpp"]))]


def _expert_flags(plan: dict, p: dict) -> list[list[str]]:
    """Mixture of experts: experts, router top-k, expert parallelism (none for dense)."""
    if plan.get("num_experts", 0) <= 1:
        return []
    return [["--num-experts", str(plan["num_experts"])],
            ["--moe-router-topk", str(plan.get("moe_top_k", 1))],
            ["--expert-model-parallel-size", str(p.get("ep", 1))]]


def _batch_flags(plan: dict, p: dict, seq: int | None) -> list[list[str]]:
    """Micro-batch and global batch sizes, and the sequence length."""
    a = [["--micro-batch-size", str(plan["micro_batch_size"])],
         ["--global-batch-size", str(plan["global_batch_size"])]]
    if seq is not None:
        if p["cp"] > 1 and seq % (2 * p["cp"]):
            raise SpecError(f"seq_len {seq} is not a multiple of 2*cp", field="seq_len",
                            fix="pick a sequence length divisible by 2*cp")
        a.append(["--seq-length", str(seq)])
    return a


def _precision_flags(prec: str | None) -> list[list[str]]:
    """bf16 or fp16 training, or fp8 (hybrid format) on top of bf16."""
    if prec in ("bf16", "fp16"):
        return [[f"--{prec}"]]
    if prec == "fp8":
        return [["--bf16"], ["--fp8-format", "hybrid"]]
    return []


def _data_parallel_flags(p: dict, mode: str, tr: dict) -> list[list[str]]:
    """The sharded optimizer or FSDP of ``mode``, and the overlap of gradient reduction and
    parameter gathering with compute."""
    a: list[list[str]] = []
    if mode in ("zero1", "zero2"):
        # Megatron's distributed optimizer shards optimizer state and reduce-scatters gradients
        a.append(["--use-distributed-optimizer"])
    elif mode in ("zero3", "hsdp"):
        # the flags Megatron-FSDP requires (its user guide, Megatron-LM docs/discussions/
        # megatron-fsdp-user-guide): core 0.18+ refuses to save or load in another format
        a += [["--use-megatron-fsdp"],
              ["--data-parallel-sharding-strategy", "optim_grads_params"],
              ["--no-gradient-accumulation-fusion"], ["--use-distributed-optimizer"],
              ["--ckpt-format", "fsdp_dtensor"]]
    if p["dp"] > 1:
        if tr.get("grad_reduce", "overlapped") == "overlapped":
            a.append(["--overlap-grad-reduce"])
        if tr.get("grad_reduce_dtype") == "bf16":
            a.append(["--grad-reduce-in-bf16"])
        if mode != "none":
            a.append(["--overlap-param-gather"])
    return a


def parse_megatron_args(text: str) -> dict[str, str | bool]:
    """``--flag value`` / ``--switch`` tokens → dict (switches map to True)."""
    toks = shlex.split(text, comments=True)
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("--"):
            raise SpecError(f"stray token {t!r}", source=ARGS_FILE, fix="report this exporter bug")
        if i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            out[t[2:]] = toks[i + 1]
            i += 2
        else:
            out[t[2:]] = True
            i += 1
    return out


def validate_megatron(files: Mapping[str, str], plan: Mapping | None = None) -> dict:
    """Re-parse the arguments; check dp, micro-batches and vpp as Megatron derives them."""
    args = parse_megatron_args(files[ARGS_FILE])
    if plan is not None:
        p = plan["parallel"]
        tp, pp, cp = (int(args[k]) for k in ("tensor-model-parallel-size",
                                             "pipeline-model-parallel-size",
                                             "context-parallel-size"))
        dp, rem = divmod(_plan.world(plan), tp * pp * cp)
        mb = int(args["global-batch-size"]) // (int(args["micro-batch-size"]) * max(dp, 1))
        vpp = 1
        if "num-layers-per-virtual-pipeline-stage" in args:
            per_chunk = int(args["num-layers-per-virtual-pipeline-stage"])
            vpp = int(args["num-layers"]) // pp // per_chunk
        elif "num-virtual-stages-per-pipeline-rank" in args:
            vpp = int(args["num-virtual-stages-per-pipeline-rank"])
        got = {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "vpp": vpp}
        want = {k: p[k] for k in got}
        if rem or got != want or ("microbatches" in plan and mb != plan["microbatches"]):
            raise SpecError(f"arguments give {got} and {mb} micro-batches, plan has {want}",
                            source=ARGS_FILE, fix="report this exporter bug")
    return args
