"""Shared checks and look-ups for the exporters: the plan JSON of ``clusterplan plan``.

Every exporter calls :func:`check_plan` first, so a plan that cannot be exported faithfully fails
with a :class:`SpecError` naming the field and the fix instead of writing a wrong config.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from simulator.errors import SpecError

__all__ = ["FORMAT_VERSION", "KIND", "FSDP_MODES", "check_plan", "num_layers", "seq_len",
           "precision", "world", "hosts_in_order", "hsdp_shard_degree", "rank_of",
           "host_name"]

FORMAT_VERSION = 1
KIND = "llm-plan"
FSDP_MODES = ("none", "zero1", "zero2", "zero3", "hsdp")
AXES = ("tp", "cp", "dp", "pp")


def _err(msg: str, field: str, fix: str, source: str | None) -> SpecError:
    return SpecError(msg, source=source, field=field, fix=fix)


def rank_of(coords: Mapping[str, int], par: Mapping[str, int], order: str) -> int:
    """Global rank of ``coords`` under ``order`` (innermost axis first, Megatron style)."""
    r, stride = 0, 1
    for ax in order.split("-"):
        r += int(coords[ax]) * stride
        stride *= int(par[ax])
    return r


def check_plan(plan: Any, source: str | None = None) -> dict:
    """Validate the parts of an ``llm-plan`` document the exporters read; return the plan."""
    if not isinstance(plan, Mapping):
        raise _err(f"expected a JSON object, got {type(plan).__name__}", "(top level)",
                   "pass the file written by `clusterplan plan MODEL --out plan.json`", source)
    if plan.get("kind") != KIND:
        raise _err(f"kind is {plan.get('kind')!r}, not {KIND!r}", "kind",
                   "export an LLM plan written by `clusterplan plan MODEL --out plan.json`",
                   source)
    if plan.get("format_version") != FORMAT_VERSION:
        raise _err(f"format_version {plan.get('format_version')!r} is not supported "
                   f"(this exporter reads {FORMAT_VERSION})", "format_version",
                   "regenerate the plan with this version of clusterplan", source)
    par = plan.get("parallel")
    if not isinstance(par, Mapping):
        raise _err("missing or not an object", "parallel",
                   "regenerate the plan with `clusterplan plan`", source)
    for ax in ("tp", "cp", "pp", "dp", "vpp"):
        v = par.get(ax)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _err(f"{v!r} is not a positive integer", f"parallel.{ax}",
                       f"set parallel.{ax} to an integer >= 1", source)
    ep = par.get("ep", 1)
    if not isinstance(ep, int) or isinstance(ep, bool) or ep < 1 or par["dp"] % ep:
        raise _err(f"{ep!r} is not a positive integer dividing dp {par['dp']}", "parallel.ep",
                   "set parallel.ep to a divisor of dp (1 for a dense model)", source)
    if par.get("fsdp", "none") not in FSDP_MODES:
        raise _err(f"{par.get('fsdp')!r} is not one of {', '.join(FSDP_MODES)}",
                   "parallel.fsdp", "use none, zero1, zero2, zero3 or hsdp", source)
    if par["vpp"] > 1 and par["pp"] == 1:
        raise _err(f"vpp={par['vpp']} needs pp > 1", "parallel.vpp",
                   "set vpp to 1 or pp above 1", source)
    for key in ("micro_batch_size", "global_batch_size"):
        v = plan.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise _err(f"{v!r} is not a positive integer", key,
                       f"set {key} to an integer >= 1", source)
    mbs, gbs, dp = plan["micro_batch_size"], plan["global_batch_size"], par["dp"]
    if gbs % (mbs * dp):
        raise _err(f"global batch {gbs} is not a multiple of micro batch {mbs} x dp {dp}",
                   "global_batch_size", "pick a global batch divisible by mbs*dp", source)
    order = plan.get("order", "tp-cp-dp-pp")
    if not isinstance(order, str) or sorted(order.split("-")) != sorted(AXES):
        raise _err(f"order {order!r} is not a permutation of tp, cp, dp, pp", "order",
                   "write e.g. tp-cp-dp-pp (innermost first)", source)
    ranks = plan.get("ranks")
    n = world(plan)
    if not isinstance(ranks, list) or len(ranks) != n:
        got = len(ranks) if isinstance(ranks, list) else ranks
        raise _err(f"expected {n} entries (tp*cp*pp*dp), got {got!r}", "ranks",
                   "regenerate the plan with `clusterplan plan`", source)
    seen: set[int] = set()
    places: set[tuple[int, int]] = set()
    for i, e in enumerate(ranks):
        if not isinstance(e, Mapping):
            raise _err("not an object", f"ranks[{i}]", "regenerate the plan", source)
        for key in ("rank", *AXES, "host", "gpu"):
            v = e.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise _err(f"{v!r} is not a non-negative integer", f"ranks[{i}].{key}",
                           "regenerate the plan with `clusterplan plan`", source)
        for ax in AXES:
            if e[ax] >= par[ax]:
                raise _err(f"coordinate {e[ax]} is out of range for {ax}={par[ax]}",
                           f"ranks[{i}].{ax}", "regenerate the plan", source)
        if rank_of(e, par, order) != e["rank"]:
            raise _err(f"rank {e['rank']} does not sit at its coordinates under order "
                       f"{order}", f"ranks[{i}]",
                       "frameworks derive groups from the rank order: regenerate the plan",
                       source)
        seen.add(e["rank"])
        if (e["host"], e["gpu"]) in places:
            raise _err(f"host {e['host']} GPU {e['gpu']} is used twice", f"ranks[{i}]",
                       "regenerate the plan", source)
        places.add((e["host"], e["gpu"]))
    if seen != set(range(n)):
        raise _err("ranks are not 0..world-1 exactly once", "ranks",
                   "regenerate the plan", source)
    return dict(plan)


def world(plan: Mapping) -> int:
    p = plan["parallel"]
    return p["tp"] * p["cp"] * p["pp"] * p["dp"]


def _model_field(plan: Mapping, *names: str) -> Any:
    for holder in (plan, plan.get("model_spec") or {}, plan.get("training") or {}):
        if isinstance(holder, Mapping):
            for n in names:
                if holder.get(n) is not None:
                    return holder[n]
    return None


def num_layers(plan: Mapping, given: int | None = None) -> int | None:
    """Transformer layers: an explicit argument wins, then the plan, else None."""
    v = given if given is not None else _model_field(plan, "num_layers", "layers")
    if v is not None and (not isinstance(v, int) or v < 1):
        raise SpecError(f"{v!r} is not a positive integer", field="num_layers",
                        fix="pass --num-layers N")
    return v


def seq_len(plan: Mapping, given: int | None = None) -> int | None:
    return given if given is not None else _model_field(plan, "seq_len", "seq_length")


def precision(plan: Mapping, given: str | None = None) -> str:
    v = given or _model_field(plan, "precision") or "bf16"
    if v not in ("bf16", "fp16", "fp8", "fp32"):
        raise SpecError(f"precision {v!r} is unknown", field="precision",
                        fix="use bf16, fp16, fp8 or fp32")
    return v


def host_name(entry: Mapping) -> str:
    """A host name for a rank entry: the device path without its GPU part, else ``hostN``."""
    dev = entry.get("device")
    if isinstance(dev, str) and "/" in dev:
        name = dev.rsplit("/", 1)[0].replace("/", "-")
        if re.fullmatch(r"[A-Za-z0-9._-]+", name):
            return name
    return f"host{entry['host']}"


def hosts_in_order(plan: Mapping) -> list[int]:
    """Host ids by first appearance scanning ranks 0..n-1 (NCCL's node numbering, §6.3)."""
    out: list[int] = []
    for e in sorted(plan["ranks"], key=lambda e: e["rank"]):
        if e["host"] not in out:
            out.append(e["host"])
    return out


def hsdp_shard_degree(plan: Mapping, given: int | None = None) -> int:
    """HSDP shard size: ``given``, else the DP ranks of rank 0's group that share its host."""
    dp = plan["parallel"]["dp"]
    if given is not None:
        if given < 1 or dp % given:
            raise SpecError(f"HSDP shard degree {given} does not divide dp={dp}",
                            field="hsdp_shard", fix="pick a divisor of dp")
        return given
    by_rank = {e["rank"]: e for e in plan["ranks"]}
    host0 = by_rank[0]["host"]
    same = [e for e in plan["ranks"] if e["host"] == host0 and e["tp"] == 0 and e["cp"] == 0
            and e["pp"] == 0]
    shard = len(same)
    while dp % shard:
        shard -= 1
    return max(shard, 1)
