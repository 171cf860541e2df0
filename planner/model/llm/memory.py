"""Peak memory per GPU of every pipeline stage: model state, activations in flight, reserve.

**Model state** (bytes per parameter held by the rank; the parameters per rank are counted
exactly: norms replicated over TP, K/V heads replicated when tp exceeds them, the vocabulary
padded to a multiple of tp, as :func:`planner.workloads.llm.partition.rank_params`):

- weights in the training dtype (2 bytes; fp8 training keeps bf16 weights; fp32 4);
- gradients in the trainer's gradient-buffer dtype (``trainer.grad_reduce_dtype``: Megatron's
  fp32 ``main_grad`` buffer, 4 bytes, bf16 with ``--grad-reduce-in-bf16``; fp32 training 4);
- Adam: fp32 master weights, m and v, 12 bytes (fp32 training has no master copy: 8).

ZeRO/FSDP levels shard over the ranks that hold the same weights, ``dp·cp`` (context-parallel
ranks hold identical weights: Megatron-Core's distributed optimizer shards over
``get_data_parallel_group(with_context_parallel=True)``, torchtitan's FSDP over the flattened
``dp_shard·cp`` mesh); experts over their ``dp·cp/ep`` group:
``zero1`` the optimizer state; ``zero2`` also the gradients, the unsharded gradient then living
only while one unit (a block or the embedding, whichever is larger on the stage) is reduce-
scattered; ``zero3``/``hsdp`` also the weights, plus two gathered units (the one computing and
the one prefetched: FSDP's default backward prefetch). ``hsdp`` is counted as ``zero3`` over the
whole group (the spec states no shard-group size), a lower bound for hybrid sharding.

**Activations** (:mod:`.activations`): the stage's blocks are split over its virtual-stage chunks
by :func:`~planner.model.llm.stages.chunk_layer_counts` (as the simulated step does), and the
pipeline schedule the step runs (:func:`~planner.model.llm.schedule.schedule`) is walked pass by
pass: a forward of chunk ``c`` adds what its blocks keep for one micro-batch (plus the
embedding's ids on the first virtual stage and the final norm, output layer and fp32 loss on the
last), a backward frees it. The peak over the walk is the stage's activation memory, taken at
the moment it happens: after a forward (plus the logits alive while the loss runs, on the last
virtual stage) or during a backward (plus the gradients of one block's MLP interior, and with
full recompute what the recomputed block keeps until its backward ends). A
stage's output is not held: Megatron frees it once sent (``deallocate_pipeline_outputs``), and
Llama 3 does the same (Llama Team 2024, §3.3.2). This is exact for GPipe, 1F1B and interleaved
1F1B, e.g. with as many micro-batches as stages interleaving holds every micro-batch once.

**Capacity**: the GPU catalog's ``hbm_bytes`` is what the device reports (nvidia-smi
``memory.total``); :class:`Reserve` takes off a fixed reserve (CUDA context, communicator
buffers) and adds the caching allocator's fragmentation as a fraction of the dynamic
(activation) memory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

from planner.model.llm import activations as act
from planner.model.llm.allocator import layout_report, offload_requests
from planner.model.llm.offload import OffloadPlan
from planner.model.llm.schedule import schedule
from planner.model.llm.spec import ModelSpec, ParallelSpec, TrainingSpec
from planner.model.llm.stages import chunk_layer_counts
from planner.model.llm.trainer import TrainerSpec

__all__ = [
    "DEFAULT_RESERVE",
    "MemoryEstimate",
    "Reserve",
    "activation_peak",
    "memory_per_gpu",
    "stage_params",
    "walked_microbatches",
]

GiB = 1024**3


@dataclass(frozen=True, slots=True)
class Reserve:
    """What the device keeps from the model, in bytes, and the allocator's waste as a fraction.

    ``context_bytes``: the CUDA context with the loaded kernels of PyTorch, cuBLAS/cuDNN and
    Transformer Engine (of the order of 0.5 GiB per process on Hopper with CUDA 12's lazy
    loading, the "used" memory nvidia-smi shows once a process has initialised CUDA), plus the
    share of nvidia-smi's ``memory.total`` that the driver keeps and ``cudaMemGetInfo`` never
    offers (CUDA's deviceQuery gives an A100-SXM4-40GB 40,339 of its 40,960 MiB): 1 GiB.
    ``communicator_bytes``: NCCL's buffers, ``NCCL_BUFFSIZE`` (4 MiB by default, NCCL's
    environment-variable docs) per channel, peer and protocol, over the TP, CP, PP and DP
    communicators a rank joins (tens of channels on NVLink): 1 GiB.
    ``fragmentation``: PyTorch's caching allocator rounds and splits blocks and keeps freed ones
    for reuse, so it reserves more than is allocated while activations of varying sizes come and
    go; an assumed 5 % of the dynamic (activation) memory, low because Megatron-Core and
    torchtitan runs set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``. Not fitted to any
    run; pass another :class:`Reserve` to change it.
    """

    context_bytes: float = 1.0 * GiB
    communicator_bytes: float = 1.0 * GiB
    fragmentation: float = 0.05

    @property
    def fixed_bytes(self) -> float:
        return self.context_bytes + self.communicator_bytes


DEFAULT_RESERVE = Reserve()


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Peak bytes per GPU on the most loaded pipeline stage, and every stage's breakdown.

    ``total_bytes`` = weights + gradients + optimizer + activations + fragmentation;
    ``capacity_bytes`` is what the model may use (device memory − fixed reserve);
    ``overflow_bytes`` = max(0, total − capacity). ``stages``: one dict per stage (blocks per
    chunk, micro-batches in flight at the peak, each part in bytes).
    """

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    total_bytes: float
    capacity_bytes: float
    stage: int
    fragmentation_bytes: float = 0.0
    reserve_bytes: float = 0.0
    device_bytes: float = 0.0
    overflow_bytes: float = 0.0
    block_activation_terms: dict = field(default_factory=dict)
    stages: tuple = ()

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stages"] = [dict(s) for s in self.stages]
        return d | {"fits": self.fits}


def stage_params(m: ModelSpec, p: ParallelSpec, blocks: int, *, first: bool,
                 last: bool) -> dict[str, float]:
    """Parameters one rank of a stage holds: ``dense`` (attention, norms, router, embeddings),
    ``experts`` (its ``E/ep`` experts' share) and ``unit`` (the largest FSDP unit: one block or
    the embedding), counted as :func:`planner.workloads.llm.partition.rank_params` does."""
    h, f, tp = m.hidden_size, m.ffn_hidden_size, p.tp
    kv_local = m.head_dim if tp > m.num_kv_heads else m.num_kv_heads * m.head_dim // tp
    mats = 3 if m.ffn == "swiglu" else 2
    attn = 2 * h + h * (h // tp) + 2 * h * kv_local + (h // tp) * h
    if m.is_moe:
        dense_block = attn + h * m.num_experts
        expert_block = m.num_experts // max(1, p.ep) * mats * h * (f // tp)
    else:
        dense_block, expert_block = attn + mats * h * (f // tp), 0
    vocab_local = -(-m.vocab_size // tp)
    embed = vocab_local * h * (int(first) + int(last)) + (h if last else 0)
    unit = max(dense_block + expert_block, vocab_local * h if (first or last) else 0)
    return {"dense": blocks * dense_block + embed, "experts": blocks * expert_block,
            "unit": unit}


def _state_bytes(m: ModelSpec, t: TrainingSpec, p: ParallelSpec, trainer: TrainerSpec,
                 prm: dict[str, float]) -> dict[str, float]:
    """Weights, gradients and optimizer bytes of one rank holding ``prm`` (see module doc)."""
    fp32 = t.precision == "fp32"
    e_w = 4 if fp32 else 2
    e_g = 4 if fp32 else trainer.grad_bytes
    e_o = 8 if fp32 else 12
    dp = max(1, p.dp) * p.cp
    groups = ((prm["dense"], dp), (prm["experts"], max(1, dp // max(1, p.ep))))
    shard_w = p.fsdp in ("zero3", "hsdp")
    shard_g = p.fsdp in ("zero2", "zero3", "hsdp")
    w = sum(n * e_w / (g if shard_w else 1) for n, g in groups)
    gr = sum(n * e_g / (g if shard_g else 1) for n, g in groups)
    opt = sum(n * e_o / (g if p.fsdp != "none" else 1) for n, g in groups)
    gathered = 2 * prm["unit"] * e_w if shard_w else 0.0
    unsharded = prm["unit"] * e_g if shard_g else 0.0
    return {"weights": w + gathered, "gathered_weights": gathered, "gradients": gr + unsharded,
            "unsharded_gradient_unit": unsharded, "optimizer": opt}


@lru_cache(maxsize=4096)
def _passes(name: str, pp: int, micro: int, rank: int, vpp: int) -> tuple:
    """The schedule's passes of ``rank`` (cached: the search asks for the same ones often)."""
    return tuple(schedule(name, pp, micro, rank, vpp))


def walked_microbatches(name: str, pp: int, micro: int, vpp: int) -> int:
    """Micro-batches to walk for the same peak as ``micro``: the schedules repeat.

    1F1B holds at most ``pp`` micro-batches, reached by the ``pp``-th forward. Interleaved
    1F1B (``micro`` a multiple of ``pp``) is in steady state after at most ``2(pp−1) +
    (vpp−1)·pp`` warm-up forwards, and from then the bytes held repeat with period ``pp·vpp``
    passes (every chunk appears ``pp`` times in any ``pp·vpp`` forwards or backwards), so
    ``3·pp`` micro-batches reach every value; the cool-down only frees. GPipe walks them all.
    """
    if name == "gpipe":
        return micro
    if vpp > 1 or name == "interleaved":
        return micro if micro % pp else min(micro, 3 * pp)
    return min(micro, pp)


def activation_peak(passes, kept: list[float], at_forward: list[float],
                    at_backward: list[float]) -> dict:
    """Walk ``passes`` ``(F|B, micro-batch, chunk)``: a forward adds ``kept[chunk]`` bytes, a
    backward frees them. Peak bytes over the walk, counting ``at_forward[chunk]`` just after a
    forward and ``at_backward[chunk]`` during a backward; with the micro-batches and chunk
    passes held at that moment.

    >>> one_f_one_b = [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 2, 0), ("B", 1, 0),
    ...                ("B", 2, 0)]
    >>> activation_peak(one_f_one_b, [10.0], [0.0], [1.0])["bytes"]
    21.0
    """
    held, live = 0.0, {}
    best = {"bytes": 0.0, "microbatches": 0, "chunk_passes": 0, "moment": ""}
    for kind, mb, c in passes:
        if kind == "F":
            held += kept[c]
            live[(mb, c)] = True
            now = held + at_forward[c]
        else:
            now = held + at_backward[c]
        if now > best["bytes"]:
            best = {"bytes": now, "microbatches": len({k[0] for k in live}),
                    "chunk_passes": len(live), "moment": f"{kind} mb {mb} chunk {c}"}
        if kind == "B":
            held -= kept[c]
            live.pop((mb, c), None)
    return best


def _chunk_activations(m: ModelSpec, t: TrainingSpec, p: ParallelSpec, trainer: TrainerSpec,
                       rows: list[list[int]], stage: int) -> tuple[list, list, list, float]:
    """Per chunk of ``stage``: bytes kept per micro-batch, extra just after its forward, extra
    during its backward; and the bytes one block keeps."""
    kw = {"seq": m.seq_len, "batch": t.micro_batch_size, "tp": p.tp, "cp": p.cp}
    sp = trainer.sequence_parallel and p.tp > 1
    per_block = act.block_bytes(m, **kw, sequence_parallel=sp, attention=trainer.attention,
                                recompute=t.activation_recompute, precision=t.precision)
    bwd = act.backward_transient_bytes(m, **kw, precision=t.precision)
    if t.activation_recompute == "full":
        # the block being recomputed holds what it would have kept, until its backward ends
        # (Megatron's CheckpointFunction re-runs its forward right before its backward)
        bwd += act.block_bytes(m, **kw, sequence_parallel=sp, attention=trainer.attention,
                               recompute="none", precision=t.precision) - per_block
    nv = p.pp * p.vpp
    kept, fwd, back = [], [], []
    for c, n in enumerate(rows[stage]):
        vs = c * p.pp + stage
        k = n * per_block
        f = 0.0
        if vs == 0:
            k += sum(act.first_stage_terms(m, **kw, sequence_parallel=sp).values())
        if vs == nv - 1:
            k += sum(act.last_stage_terms(m, **kw, sequence_parallel=sp,
                                          precision=t.precision).values())
            f = act.loss_transient_bytes(m, **kw, precision=t.precision)
        kept.append(k)
        fwd.append(f)
        back.append(bwd if n else 0.0)
    return kept, fwd, back, per_block


def _offload_peak(m: ModelSpec, t: TrainingSpec, p: ParallelSpec, trainer: TrainerSpec,
                  o: OffloadPlan) -> dict:
    """Activation peak of one stage under MEMO's swap (pp = 1, one micro-batch at a time):
    at the end of the forward the last two blocks whole and the swap buffer still draining
    (a block starts only once the buffer two blocks back has drained, so one is in flight);
    during a backward one reloaded-and-recomputed block, the buffer being filled for the next
    and the gradients of one block's MLP interior. The embedding, final norm, output layer and
    loss keep theirs. Fragmentation is the planned layout's over the forward's live bytes
    (MEMO allocates from a plan: :mod:`.allocator`), beside what a best-fit caching allocator
    would lose (``online_fragmentation``)."""
    kw = {"seq": m.seq_len, "batch": t.micro_batch_size, "tp": p.tp, "cp": p.cp}
    sp = trainer.sequence_parallel and p.tp > 1
    ends = sum(act.first_stage_terms(m, **kw, sequence_parallel=sp).values()) + sum(
        act.last_stage_terms(m, **kw, sequence_parallel=sp, precision=t.precision).values())
    bwd = act.backward_transient_bytes(m, **kw, precision=t.precision)
    after_fwd = 2 * o.full_bytes + o.swap_bytes \
        + act.loss_transient_bytes(m, **kw, precision=t.precision)
    in_bwd = o.full_bytes + o.swap_bytes + bwd
    moment = "forward" if after_fwd >= in_bwd else "backward"
    # MEMO allocates from a planned layout, not the caching allocator: its fragmentation
    layout = layout_report(offload_requests(m, layers=m.layers, alpha=o.alpha, seq=m.seq_len,
                                            batch=t.micro_batch_size, tp=p.tp, cp=p.cp,
                                            precision=t.precision, sequence_parallel=sp),
                           mip=False)
    return {"bytes": ends + max(after_fwd, in_bwd), "microbatches": 1, "chunk_passes": 1,
            "moment": f"offload {moment}", "fragmentation": layout["planned_fragmentation"],
            "online_fragmentation": layout["online_fragmentation"]}


def memory_per_gpu(m: ModelSpec, t: TrainingSpec, p: ParallelSpec, *, capacity_bytes: float,
                   trainer: TrainerSpec | None = None, schedule_name: str = "1f1b",
                   reserve: Reserve = DEFAULT_RESERVE,
                   offload: OffloadPlan | None = None) -> MemoryEstimate:
    """Peak memory of every pipeline stage (bytes) and the most loaded one's breakdown.

    ``capacity_bytes`` is the device memory (the catalog's ``hbm_bytes``); ``reserve`` what the
    runtime keeps from it; ``schedule_name`` the pipeline schedule the step runs (``1f1b``,
    ``gpipe``, ``interleaved``; ``vpp > 1`` interleaves, as in the step). ``offload``: the
    step's token-wise swap (:func:`_offload_peak`).
    """
    trainer = trainer or TrainerSpec()
    rows = chunk_layer_counts(m.layers, p.pp, p.vpp, trainer.trim_first_last_stage)
    micro = max(1, t.global_batch_size // max(1, max(1, p.dp) * t.micro_batch_size))
    walk_m = walked_microbatches(schedule_name, p.pp, micro, p.vpp)
    usable = capacity_bytes - reserve.fixed_bytes
    stages = []
    for i in range(p.pp):
        prm = stage_params(m, p, sum(rows[i]), first=i == 0, last=i == p.pp - 1)
        state = _state_bytes(m, t, p, trainer, prm)
        kept, fwd, back, per_block = _chunk_activations(m, t, p, trainer, rows, i)
        peak = _offload_peak(m, t, p, trainer, offload) if offload is not None else \
            activation_peak(_passes(schedule_name, p.pp, walk_m, i, p.vpp), kept, fwd, back)
        frag = peak.get("fragmentation", reserve.fragmentation) * peak["bytes"]
        total = state["weights"] + state["gradients"] + state["optimizer"] + peak["bytes"] + frag
        stages.append({
            "stage": i, "blocks": list(rows[i]), "microbatches": micro,
            "in_flight_microbatches": peak["microbatches"],
            "in_flight_chunk_passes": peak["chunk_passes"], "peak_at": peak["moment"],
            "block_activation_bytes": per_block, "parameters": prm["dense"] + prm["experts"],
            "weights_bytes": state["weights"], "gathered_weights_bytes": state["gathered_weights"],
            "gradients_bytes": state["gradients"],
            "unsharded_gradient_unit_bytes": state["unsharded_gradient_unit"],
            "optimizer_bytes": state["optimizer"], "activations_bytes": peak["bytes"],
            "fragmentation_bytes": frag, "total_bytes": total,
            **({"caching_allocator_fragmentation": peak["online_fragmentation"],
                "planned_fragmentation": peak["fragmentation"]}
               if "online_fragmentation" in peak else {}),
            "overflow_bytes": max(0.0, total - usable)})
    worst = max(stages, key=lambda s: s["total_bytes"])
    sp = trainer.sequence_parallel and p.tp > 1
    terms = act.block_terms(m, seq=m.seq_len, batch=t.micro_batch_size, tp=p.tp, cp=p.cp,
                            sequence_parallel=sp, attention=trainer.attention,
                            recompute=t.activation_recompute, precision=t.precision)
    return MemoryEstimate(
        weights_bytes=worst["weights_bytes"], gradients_bytes=worst["gradients_bytes"],
        optimizer_bytes=worst["optimizer_bytes"], activations_bytes=worst["activations_bytes"],
        total_bytes=worst["total_bytes"], capacity_bytes=usable, stage=worst["stage"],
        fragmentation_bytes=worst["fragmentation_bytes"], reserve_bytes=reserve.fixed_bytes,
        device_bytes=float(capacity_bytes), overflow_bytes=worst["overflow_bytes"],
        block_activation_terms=terms, stages=tuple(stages))
