"""Place the process groups of an LLM plan on measured VMs: TP, DP and PP traffic on the matrix.

A plan (``clusterplan plan MODEL --out plan.json``) fixes which global ranks form each tensor-,
data- and pipeline-parallel group; reordering chooses which VM plays each global rank
(``order[r]`` = the VM of plan rank r). Communication per training step, all groups of one kind
running at once (so groups contend for shared links), nothing overlapped with compute:

* TP: ``4 · (layers / pp) · microbatches`` ring all-reduces of ``mbs · (seq / cp) · hidden · 2``
  bytes (two forward and two backward per layer, Megatron without sequence parallelism);
* DP: one ring all-reduce of the bf16 gradients, ``params / (tp · pp) · 2`` bytes (ZeRO's
  reduce-scatter + all-gather moves the same bytes);
* CP: ``3 · (layers / pp) · microbatches`` ring all-gathers (ring attention passing K and V
  round the CP group, one forward and two backward) of ``mbs · (seq / cp) · 2 · kv_dim · 2`` bytes
  per rank;
* PP: ``2 · microbatches`` activation sends of ``mbs · (seq / cp) · hidden · 2`` bytes across every
  stage boundary (forward and backward);

each ring timed by the pipelined ring model of :mod:`.model` on its group (an all-gather has half
an all-reduce's steps), the slowest group setting the pace. Expert all-to-alls are not modelled. The search packs VMs along the
minimum-cost ring into TP groups first (group-to-host assignment: a good ring keeps hosts and
racks contiguous, so consecutive chunks of it are local), then improves by pair swaps on the
step time above.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from simulator.costmatrix import CostMatrix
from simulator.errors import SpecError

from planner.model.llm.spec import load_llm_spec
from planner.reorder.model import concurrent_rings_time, ring_edge_cost, stream_rates
from planner.reorder.search import ReorderResult, swap_search
from planner.reorder.tsp_exact import mip_ring
from planner.reorder.tsp_local import heuristic_ring

__all__ = ["PlanTraffic", "plan_traffic", "plan_comm_time", "reorder_plan"]

AXES = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class PlanTraffic:
    """Groups (rows of plan ranks, in group-rank order) and per-step message sizes."""

    groups: Mapping[str, np.ndarray]
    tp_bytes: float
    tp_calls: int
    cp_bytes: float
    cp_calls: int
    dp_bytes: float
    pp_bytes: float
    pp_calls: int


def _groups(ranks: list[dict], axis: str) -> np.ndarray:
    rows: dict[tuple, list[tuple[int, int]]] = {}
    for e in ranks:
        key = tuple(e[a] for a in AXES if a != axis)
        rows.setdefault(key, []).append((e[axis], e["rank"]))
    return np.array([[r for _, r in sorted(v)] for _, v in sorted(rows.items())], dtype=np.int64)


def plan_traffic(plan: Any, *, source: str = "plan") -> PlanTraffic:
    """Read groups and message sizes from a plan document (see the module docstring)."""

    fix = "regenerate the plan with `clusterplan plan MODEL --out plan.json`"
    if not isinstance(plan, Mapping) or plan.get("kind") != "llm-plan":
        raise SpecError("not an LLM plan (kind: llm-plan)", source=source, field="kind", fix=fix)
    par = plan.get("parallel")
    if not isinstance(par, Mapping) or not all(
            isinstance(par.get(a), int) and par[a] >= 1 for a in ("tp", "cp", "pp", "dp")):
        raise SpecError("missing or malformed", source=source, field="parallel", fix=fix)
    if not isinstance(plan.get("model"), str):
        raise SpecError("missing model name", source=source, field="model", fix=fix)
    ranks = plan.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(
            isinstance(e, Mapping) and all(isinstance(e.get(k), int) for k in AXES + ("rank",))
            for e in ranks):
        raise SpecError("missing or malformed", source=source, field="ranks", fix=fix)
    model = load_llm_spec(plan["model"]).model
    mbs = int(plan.get("micro_batch_size", 1))
    micro = int(plan.get("microbatches", 1))
    seq = int(plan.get("seq_len", model.seq_len))
    act = mbs * seq / par["cp"] * model.hidden_size * 2.0
    return PlanTraffic(
        groups={ax: _groups(ranks, ax) for ax in ("tp", "cp", "dp", "pp")},
        tp_bytes=act, tp_calls=4 * -(-model.layers // par["pp"]) * micro,
        cp_bytes=mbs * seq / par["cp"] * 2 * model.num_kv_heads * model.head_dim * 2.0,
        cp_calls=3 * -(-model.layers // par["pp"]) * micro,
        dp_bytes=model.total_params / (par["tp"] * par["pp"]) * 2.0,
        pp_bytes=act, pp_calls=2 * micro)


def _pp_time(cm: CostMatrix, groups: np.ndarray, nbytes: float) -> float:
    g, p = groups.shape
    if p < 2:
        return 0.0
    src, dst = groups[:, :-1].ravel(), groups[:, 1:].ravel()
    t = cm.latency_s[src, dst] + nbytes / stream_rates(cm, src, dst)
    return float(t.max())


def plan_comm_time(cm: CostMatrix, traffic: PlanTraffic, order) -> dict[str, float]:
    """Per-step communication seconds of each kind, and ``total``, with plan rank r on VM
    ``order[r]``."""
    o = np.asarray(order, dtype=np.int64)
    g = traffic.groups
    tp = traffic.tp_calls * concurrent_rings_time(cm, o[g["tp"]], traffic.tp_bytes)
    cp = traffic.cp_calls * concurrent_rings_time(
        cm, o[g["cp"]], traffic.cp_bytes * g["cp"].shape[1], passes=1)
    dp = concurrent_rings_time(cm, o[g["dp"]], traffic.dp_bytes)
    pp = traffic.pp_calls * _pp_time(cm, o[g["pp"]], traffic.pp_bytes)
    return {"tp_s": tp, "cp_s": cp, "dp_s": dp, "pp_s": pp, "total_s": tp + cp + dp + pp}


def reorder_plan(cm: CostMatrix, traffic: PlanTraffic, *, exact_max_n: int = 16,
                 time_limit_s: float = 20.0, seed: int = 0) -> ReorderResult:
    """Best VM for every plan rank found; ``collective`` is ``plan``."""
    n = cm.n
    world = traffic.groups["tp"].size
    if world != n:
        raise SpecError(f"the plan has {world} ranks but the matrix {n}", field="--collective",
                        fix="plan for as many GPUs as were measured (clusterplan plan --gpus N)")
    t0 = time.perf_counter()
    cost = lambda o: plan_comm_time(cm, traffic, o)["total_s"]     # noqa: E731
    c = ring_edge_cost(cm, traffic.tp_bytes)
    ring = (np.asarray(mip_ring(c, time_limit_s=time_limit_s).order) if n <= exact_max_n
            else heuristic_ring(c, seed=seed, time_limit_s=time_limit_s / 2))
    cands = {"given": np.arange(n), "ring-packed": ring}
    times = {k: cost(o) for k, o in cands.items()}
    start = min(times, key=times.get)
    left = max(0.2, time_limit_s - (time.perf_counter() - t0))
    cands["swaps"], times["swaps"], clock = swap_search(cost, cands[start], time_limit_s=left,
                                                        seed=seed)
    method = min(times, key=times.get)
    return ReorderResult("plan", traffic.dp_bytes, tuple(int(x) for x in cands[method]),
                         times["given"], times[method], method, times,
                         time.perf_counter() - t0, clock)


def placed_plan(plan: Mapping[str, Any], order, hostnames) -> dict:
    """The plan with every rank moved to its chosen VM, for ``clusterplan export``.

    Plan rank r goes to measured rank ``order[r]``: its ``host`` becomes that VM's host name
    numbered by first appearance over ranks 0, 1, … (the launch order), ``gpu`` its index among
    the ranks on that host, ``device`` ``HOSTNAME/gpuK``; ``measured_rank`` records the VM.
    """
    out = dict(plan)
    host_id: dict[str, int] = {}
    used: dict[str, int] = {}
    ranks = []
    for e in sorted(plan["ranks"], key=lambda e: e["rank"]):
        vm = int(order[e["rank"]])
        name = hostnames[vm]
        h = host_id.setdefault(name, len(host_id))
        g = used.get(name, 0)
        used[name] = g + 1
        ranks.append(dict(e) | {"host": h, "gpu": g, "device": f"{name}/gpu{g}",
                                "measured_rank": vm})
    out["ranks"] = ranks
    out["reordered"] = {"by": "clusterplan reorder", "order": [int(x) for x in order]}
    return out
