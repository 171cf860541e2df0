"""Memory per GPU: weights, gradients, optimizer state and activations in flight.

Weights in the training precision (fp8 training keeps bf16 weights), fp32 main gradients and
Adam state (fp32 master weights, m, v: 12 bytes per parameter), as Megatron's mixed-precision
defaults; ZeRO-1 shards the optimizer state over data-parallel ranks, ZeRO-2 also the
gradients, ZeRO-3 (and HSDP inside its shard group) also the weights. Activations per block
follow Korthikanti et al. 2022: ``s·b·h·(34 + 5·a·s/h)`` bytes without recompute, sequence
parallelism dividing everything by ``tp``; the attention kernels modelled here are flash
attention, which stores no ``s × s`` scores, so the ``5as/h`` term is dropped (as selective
recompute drops it); full recompute keeps only the block input ``2·s·b·h``. A 1F1B stage ``i`` holds ``pp − i``
micro-batches in flight, the interleaved schedule ``× (1 + (pp − 1)/(pp·vpp))``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.model.llm.spec import ModelSpec, ParallelSpec, TrainingSpec
from planner.model.llm.stages import stage_layers
from planner.model.llm.trainer import TrainerSpec

__all__ = ["MemoryEstimate", "memory_per_gpu"]


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """Bytes per GPU on the most loaded pipeline stage."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    total_bytes: float
    capacity_bytes: float
    stage: int

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def to_dict(self) -> dict:
        return asdict(self) | {"fits": self.fits}


def memory_per_gpu(m: ModelSpec, t: TrainingSpec, p: ParallelSpec, *, capacity_bytes: float,
                   reserve_fraction: float = 0.05, trainer: TrainerSpec | None = None,
                   schedule_name: str = "1f1b") -> MemoryEstimate:
    """Peak memory estimate of the most loaded stage; ``capacity`` minus a runtime reserve."""
    e = 1 if t.precision == "fp8" else (4 if t.precision == "fp32" else 2)
    e_w = 2 if t.precision == "fp8" else e
    dp = max(1, p.dp)
    h, s, b = m.hidden_size, m.seq_len / p.cp, t.micro_batch_size
    # the kernels are flash attention: no s×s scores are stored, so the 5as/h term is gone
    per_block_act = {
        "none": s * b * h * 34 / p.tp,
        "selective": s * b * h * 34 / p.tp,
        "full": 2 * s * b * h / p.tp,
    }[t.activation_recompute] * (e / 2)
    if m.is_moe and t.activation_recompute != "full":
        # the MLP's share of the 34 (19·sbh of it) is stored once per routed copy
        per_block_act *= 1 + (m.top_k - 1) * 19 / 34
    ep = max(1, p.ep)
    worst = None
    trim = trainer.trim_first_last_stage if trainer else 0
    for i, n_layers in enumerate(stage_layers(m.layers, p.pp, trim)):
        params = n_layers * m.dense_params_per_layer / p.tp
        if i == 0:
            params += m.embedding_params / p.tp
        if i == p.pp - 1:
            params += m.embedding_params / p.tp
        # experts: E/ep per rank, their state sharded over the dp/ep expert-data-parallel ranks
        experts = n_layers * (m.params_per_layer - m.dense_params_per_layer) / (ep * p.tp)
        weights = grads = optim = 0.0
        for n, group in ((params, dp), (experts, dp // ep)):
            weights += n * e_w / (group if p.fsdp in ("zero3", "hsdp") else 1)
            grads += n * 4 / (group if p.fsdp in ("zero2", "zero3", "hsdp") else 1)
            optim += n * 12 / (group if p.fsdp != "none" else 1)
        micro = t.global_batch_size // max(1, dp * b)
        in_flight = min(p.pp - i, micro) if p.pp > 1 else 1
        if p.vpp > 1:
            in_flight *= 1 + (p.pp - 1) / (p.pp * p.vpp)
        acts = per_block_act * n_layers * in_flight
        if i == p.pp - 1:   # logits and loss in fp32 for one micro-batch
            acts += 4 * 2 * s * b * m.vocab_size / p.tp
        total = weights + grads + optim + acts
        est = MemoryEstimate(weights, grads, optim, acts, total,
                             capacity_bytes * (1 - reserve_fraction), i)
        if worst is None or est.total_bytes > worst.total_bytes:
            worst = est
    return worst
