"""A step of packed variable-length documents, simulated over many sampled global batches
(WLB-LLM, papers.md §5): the spec's ``training.documents`` says how documents are drawn, packed
and sharded over context parallelism.

Per sampled global batch: the packer (planner/model/llm/packing.py) fills ``micro·dp``
micro-batches; micro-batch ``j`` goes to data-parallel replica ``j mod dp``; each micro-batch's
attention work on its busiest CP rank (planner/model/llm/doc_attention.py, tile-padded; the
adaptive choice takes the cheaper of per-sequence and per-document sharding) and its tokens
scale its passes (:func:`~planner.workloads.llm.step.build_step`'s ``mb_scales``), and the
pipeline runs the replica's micro-batches of unequal cost through the simulator. Replicas wait
for each other at the gradient reduction, so a batch's step is its slowest replica's; the
``max_replicas`` replicas with the longest critical-path estimate (largest micro-batch through
every stage plus the rest on one stage, WLB-LLM §5.1) are simulated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.engine import simulate
from simulator.errors import SpecError
from simulator.topology import Topology

from planner.model.llm.doc_attention import rank_pairs
from planner.model.llm.documents import length_sampler
from planner.model.llm.packing import delay_histogram, imbalance, pack
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.workloads.llm.step import build_step

__all__ = ["PackedBatch", "packed_batches", "simulate_packed_steps", "work_per_document"]


@dataclass
class PackedBatch:
    """One sampled global batch: per DP replica its micro-batches' ``(tokens, attention)``
    scales and CP sharding, the packing imbalance and the simulated step (s)."""

    scales: list[list[tuple[float, float]]]
    sharding: list[list[str]]
    imbalance: float
    step_s: float = 0.0


def work_per_document(spec: LLMSpec):
    """Predicted work of a document of ``d`` tokens for the packer: causal attention pairs
    ``d²/2`` plus the linear work in the same unit (a block's weight FLOPs per token over the
    ``4·hidden`` FLOPs of one query-key pair), so ``W(d) = d²/2 + c·d``."""
    m = spec.model
    c = 2.0 * m.active_params_per_layer / (4.0 * m.hidden_size)
    return lambda d: 0.5 * d * d + c * d


def _scales(mb: list[int], seq: int, cp: int, mode: str, ref: float) -> tuple[float, float, str]:
    best = None
    for sharding in (("sequence", "document") if mode == "adaptive" else (mode,)):
        att = float(rank_pairs(mb, cp=cp, sharding=sharding)[1].max()) / ref
        if best is None or att < best[1]:
            best = (sum(mb) / seq, att, sharding)
    return best


def packed_batches(spec: LLMSpec, p: ParallelSpec) -> tuple[list[PackedBatch], list]:
    """The sampled global batches of ``spec.training.documents`` for resolved layout ``p``, and
    the packer's batches (documents per micro-batch)."""
    docs = spec.training.documents
    seq = spec.model.seq_len
    if spec.training.micro_batch_size != 1:
        raise SpecError(f"micro_batch_size {spec.training.micro_batch_size} with packed "
                        "documents: a micro-batch is one packed sequence", source=spec.source,
                        field="training.micro_batch_size", fix="set micro_batch_size: 1")
    micro = spec.training.global_batch_size // p.dp
    work = work_per_document(spec)
    batches = pack(docs, length_sampler(docs), seq=seq, n=micro * p.dp, batches=docs.batches,
                   work=work)
    ref = float(rank_pairs([seq], cp=p.cp, sharding="sequence")[1].max())
    out = []
    for gb in batches:
        scales = [[] for _ in range(p.dp)]
        shard = [[] for _ in range(p.dp)]
        for j, mb in enumerate(gb.microbatches):
            lin, att, how = _scales(mb, seq, p.cp, docs.cp_sharding, ref)
            scales[j % p.dp].append((lin, att))
            shard[j % p.dp].append(how)
        out.append(PackedBatch(scales, shard, imbalance(gb)))
    return out, batches


def _critical(scales: list[tuple[float, float]], pp: int) -> float:
    cost = [lin + att for lin, att in scales]
    return max(cost) * (pp - 1) + sum(cost)


def simulate_packed_steps(spec: LLMSpec, p: ParallelSpec, topo: Topology, *,
                          mode: str = "explicit", max_replicas: int = 4, **step_kw) -> dict:
    """Simulate every sampled batch; returns the summary and the slowest batch's simulation
    (``"slowest"``: (StepPlan, SimResult)) for its timeline."""
    if spec.training.documents is None:
        raise SpecError("the spec has no training.documents section", source=spec.source,
                        field="training.documents", fix="add a documents: mapping")
    batches, packed = packed_batches(spec, p)
    slowest = None
    for b in batches:
        order = sorted(range(p.dp), key=lambda r: -_critical(b.scales[r], p.pp))
        for r in order[:max_replicas]:
            plan = build_step(spec, p, topo, mb_scales=b.scales[r], **step_kw)
            sim = simulate(topo, plan.workload, mode=mode)
            if sim.step_time_s > b.step_s:
                b.step_s = sim.step_time_s
                if slowest is None or sim.step_time_s > slowest[1].step_time_s:
                    slowest = (plan, sim)
    steps = np.array([b.step_s for b in batches])
    tokens = np.mean([sum(gb.tokens()) for gb in packed])
    pairs = sum(d * (d + 1) / 2 for gb in packed for mb in gb.microbatches for d in mb)
    context = 2 * pairs / sum(sum(gb.tokens()) for gb in packed)
    choices = [h for b in batches for rep in b.sharding for h in rep]
    return {"slowest": slowest, "summary": {
        "batches": len(batches), "packing": spec.training.documents.packing,
        "step_time_mean_s": float(steps.mean()), "step_time_p50_s": float(np.median(steps)),
        "step_time_p90_s": float(np.percentile(steps, 90)), "step_time_max_s": float(steps.max()),
        "step_time_min_s": float(steps.min()),
        "tokens_per_step_mean": float(tokens), "attention_context_tokens": float(context),
        "tokens_per_s": float(tokens / steps.mean()),
        "packing_imbalance_mean": float(np.mean([b.imbalance for b in batches])),
        "attention_imbalance_mean": float(np.mean(
            [max(a for rep in b.scales for _, a in rep)
             / np.mean([a for rep in b.scales for _, a in rep]) for b in batches])),
        "cp_sharding": {k: choices.count(k) for k in sorted(set(choices))},
        "token_delay_share": {str(k): v for k, v in delay_histogram(packed).items()},
        "documents": spec.training.documents.to_dict()}}
