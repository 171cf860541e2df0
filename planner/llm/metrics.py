"""Simulate one LLM step and report what a user asks: step time, tokens/s, MFU, memory, breakdown.

MFU is given in two named conventions, both against the GPU's dense peak in the training
precision: ``palm`` (6N + 12·l·h·s FLOPs per token, N = non-embedding parameters, active ones for MoE) and
``megatron`` (model FLOPs of every GEMM incl. logits, attention counted full:
72bslh²(1 + s/6h) + 6bshV for GPT). ``hfu`` adds recomputation (hardware FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

from simulator.compute import ComputeProfile
from simulator.engine import simulate
from simulator.result import SimResult
from simulator.errors import SpecError
from simulator.topology import Topology

from planner.model.llm.host import HostOverhead
from planner.model.llm.kernels import block_model_flops, logits_model_flops
from planner.model.llm.memory import MemoryEstimate, memory_per_gpu
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.workloads.llm.step import StepPlan, build_step, resolve_parallel

__all__ = ["LLMResult", "simulate_llm", "model_flops"]


def model_flops(spec: LLMSpec, attention_context: float | None = None) -> dict[str, float]:
    """FLOPs of one step in each convention (no recompute). ``attention_context``: the keys
    per query the conventions' attention terms count in place of ``seq_len`` (packed documents:
    ``2·Σ d(d+1)/2 / Σ d``, which equals ``seq_len`` + 1 for one whole-sequence document)."""
    m, t = spec.model, spec.training
    tokens = t.global_batch_size * m.seq_len
    if attention_context is not None:
        m = replace(m, seq_len=attention_context)
    megatron = m.layers * block_model_flops(m, tokens=tokens) + logits_model_flops(m, tokens=tokens)
    # N counts the weights a token uses: for a mixture of experts the active (top_k) ones
    palm = tokens * (6 * m.active_non_embedding_params
                     + 12 * m.layers * m.hidden_size * m.seq_len)
    # hardware FLOPs: + one extra forward of every block (full) or of attention (selective)
    fwd_block = block_model_flops(m, tokens=tokens) / 3
    attn_fwd = 4 * tokens * m.seq_len * m.hidden_size
    extra = {"none": 0.0, "selective": m.layers * attn_fwd,
             "full": m.layers * fwd_block}[t.activation_recompute]
    return {"megatron": megatron, "palm": palm, "hardware": megatron + extra}


@dataclass
class LLMResult:
    spec: LLMSpec
    parallel: ParallelSpec
    plan: StepPlan
    sim: SimResult
    memory: MemoryEstimate
    flops: dict

    @property
    def step_time_s(self) -> float:
        """The simulated step (s); with packed documents the mean over the sampled batches
        (``sim`` is then the slowest batch's simulation)."""
        if self.documents is not None:
            return self.documents["step_time_mean_s"]
        return self.sim.step_time_s

    def to_dict(self) -> dict:
        m, t = self.spec.model, self.spec.training
        st = self.step_time_s
        n = self.parallel.world()
        peak = self.sim_peak
        tokens = (self.documents["tokens_per_step_mean"] if self.documents is not None
                  else t.global_batch_size * m.seq_len)
        return {
            "model": m.name, "topology": self.sim.topology, "gpus": n,
            "parallel": {k: getattr(self.parallel, k) for k in ("tp", "cp", "pp", "dp", "vpp",
                                                                "fsdp", "ep")},
            "micro_batch_size": t.micro_batch_size, "global_batch_size": t.global_batch_size,
            "microbatches": self.plan.microbatches,
            "trainer": self.spec.trainer.to_dict(),
            "step_time_s": st, "tokens_per_s": tokens / st,
            "tflops_per_gpu": self.flops["megatron"] / st / n / 1e12,
            "hardware_tflops_per_gpu": self.flops["hardware"] / st / n / 1e12,
            "mfu": self.flops["palm"] / st / n / peak,
            "mfu_megatron": self.flops["megatron"] / st / n / peak,
            "hfu": self.flops["hardware"] / st / n / peak,
            "mfu_conventions": {
                "mfu": "PaLM: 6N + 12·l·h·s FLOPs per token, N non-embedding parameters",
                "mfu_megatron": "Korthikanti/Megatron model FLOPs (all GEMMs, logits, full attention)",
                "hfu": "hardware FLOPs: Megatron model FLOPs plus recomputation",
                "peak_flops_per_gpu": peak},
            "memory_per_gpu_bytes": self.memory.total_bytes,
            "memory": self.memory.to_dict(),
            "breakdown": self.breakdown(),
            "simulation": {"events": self.sim.events, "wall_s": self.sim.wall_s,
                           "mode": self.sim.mode, "ops": self.sim.num_ops},
        } | ({"documents": self.documents} if self.documents is not None else {}) \
          | ({"offload": self.plan.info["offload"].to_dict() | {
              k: self.memory.stages[self.memory.stage][k]
              for k in ("planned_fragmentation", "caching_allocator_fragmentation")}}
             if "offload" in self.plan.info else {})

    sim_peak: float = 0.0
    documents: dict | None = None     # packed documents: the sampled batches' summary


    def breakdown(self) -> dict:
        """Seconds on the busiest pipeline stage's critical rank, by kind."""
        t = self.sim.table                  # numpy columns: no pandas on this path
        # host copies (activation offload) run on their own streams beside the compute
        is_compute = (t["kind"] == "compute") & (t["category"] != "offload")
        best = None
        for s, r in enumerate(self.plan.representatives):
            mask = is_compute & (t["first_rank"] == r)
            busy = float(t["duration_s"][mask].sum())
            if best is None or busy > best[0]:
                best = (busy, s, r, mask)
        busy, s, r, mask = best
        cat, start, end = t["category"][mask], t["start_s"][mask], t["end_s"][mask]
        dur = t["duration_s"][mask]
        tpc = sum(self.plan.tp_comm_s[s]) * self.plan.microbatches
        # EP all-to-alls (2 forward, 2 backward, 2 more under full recompute) are inside tpc
        passes = 6 if self.spec.training.activation_recompute == "full" else 4
        epc = (self.plan.info.get("ep_a2a_s", [0.0] * (s + 1))[s] * passes
               * sum(self.plan.info["chunk_layers"][s]) * self.plan.microbatches)
        is_opt = cat == "optimizer"
        opt = float(dur[is_opt].sum())
        fb = busy - opt
        last_b = float(end[cat == "bwd"].max()) if (cat == "bwd").any() else float("nan")
        opt_start = float(start[is_opt].min()) if is_opt.any() else float("nan")
        dp_exposed = max(0.0, opt_start - last_b)
        st = self.step_time_s
        last_end = float(end.max()) if end.size else float("nan")
        idle = max(0.0, st - busy - dp_exposed - max(0.0, st - last_end))
        # idle time of a pipelined rank is its bubble; without PP it is waiting on FSDP gathers
        bubble = idle if self.parallel.pp > 1 else 0.0
        return {"stage": s, "compute_s": fb - tpc, "tp_cp_comm_s": tpc - epc, "ep_comm_s": epc,
                "optimizer_s": opt, "dp_comm_exposed_s": dp_exposed,
                "pipeline_bubble_s": bubble, "other_wait_s": idle - bubble,
                "tail_after_stage_s": max(0.0, st - last_end)}


def simulate_llm(spec: LLMSpec, parallel: ParallelSpec, topo: Topology, *, mode: str = "auto",
                 order: str = "tp-cp-dp-pp", schedule_name: str = "1f1b",
                 slowdown: Mapping[int, float] | None = None,
                 link_faults=(), track_links: bool = False,
                 profile: ComputeProfile | None = None,
                 host: HostOverhead | None | str = "measured") -> LLMResult:
    """Simulate one step under the trainer ``spec.trainer`` describes (its kernels, gradient
    reduction, pipeline sends and stage split: planner/model/llm/trainer.py).

    ``slowdown`` (rank → compute factor ≥ 1) models stragglers. A slow rank holds up its
    TP/CP group at every block and so its whole pipeline stage in its replica; the step waits
    for that replica at the gradient reduction. Replicas being alike, the stage's representative
    runs at the slowest factor among the stage's ranks, which is exact for that critical path.

    ``profile`` and ``host``: the GPU's compute profile and the trainer host's floor (default:
    the files shipped for the topology's GPU kind); a calibration passes candidates here.
"""
    p = resolve_parallel(spec, parallel, topo.num_gpus)
    if mode == "auto":
        mode = "symmetric" if topo.num_gpus > 8192 else "explicit"
    if spec.training.documents is not None:
        return _simulate_documents(spec, p, topo, mode=mode, order=order,
                                   schedule_name=schedule_name, profile=profile, host=host,
                                   faulty=bool(slowdown or link_faults))
    plan = build_step(spec, p, topo, order=order, schedule_name=schedule_name, profile=profile,
                      host=host)
    rep_slow: dict[int, float] = {}
    for r, f in (slowdown or {}).items():
        if not 0 <= int(r) < p.world():
            raise SpecError(f"straggler rank {r} is outside 0..{p.world() - 1}",
                            field="--straggler", fix=f"use a rank below {p.world()}")
        s = plan.layout.coords(int(r))["pp"]
        # the folded TP/CP collectives do not slow down with the GPU: scale the compute share
        total = sum(plan.fwd_s[s]) + sum(plan.bwd_s[s])
        share = 1.0 - sum(plan.tp_comm_s[s]) / total if total > 0 else 1.0
        rep = plan.representatives[s]
        rep_slow[rep] = max(rep_slow.get(rep, 1.0), 1.0 + (float(f) - 1.0) * share)
    # link faults re-rate the flows the step issues (DP buckets, pipeline sends); the TP/CP
    # collectives folded into block times were timed on the healthy fabric
    sim = simulate(topo, plan.workload, mode=mode, slowdown=rep_slow, link_faults=link_faults,
                   track_links=track_links, compute=profile)
    plan.info["stragglers"] = {int(r): float(f) for r, f in (slowdown or {}).items()}
    mem = memory_per_gpu(spec.model, spec.training, p, capacity_bytes=topo.gpu.hbm_bytes,
                         trainer=spec.trainer, schedule_name=schedule_name,
                         offload=plan.info.get("offload"))
    res = LLMResult(spec=spec, parallel=p, plan=plan, sim=sim, memory=mem,
                    flops=model_flops(spec))
    res.sim_peak = topo.gpu.peak(spec.training.precision)
    return res


def _simulate_documents(spec: LLMSpec, p: ParallelSpec, topo: Topology, *, mode: str,
                        faulty: bool, schedule_name: str, **step_kw) -> LLMResult:
    """:func:`simulate_llm` for packed documents: the sampled batches' mean step, the slowest
    batch's simulation (timeline, breakdown)."""
    if faulty:
        raise SpecError("stragglers and link faults are not simulated with packed documents yet",
                        source=spec.source, field="training.documents",
                        fix="drop --straggler/--link-fault, or the documents: section")
    from planner.llm.packed import simulate_packed_steps     # only for packed documents
    out = simulate_packed_steps(spec, p, topo, mode=mode, schedule_name=schedule_name,
                                **step_kw)
    plan, sim = out["slowest"]
    mem = memory_per_gpu(spec.model, spec.training, p, capacity_bytes=topo.gpu.hbm_bytes,
                         trainer=spec.trainer, schedule_name=schedule_name)
    res = LLMResult(spec=spec, parallel=p, plan=plan, sim=sim, memory=mem,
                    flops=model_flops(spec, out["summary"]["attention_context_tokens"]),
                    documents=out["summary"])
    res.sim_peak = topo.gpu.peak(spec.training.precision)
    return res
