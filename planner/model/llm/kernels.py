"""FLOPs, bytes and times of one transformer block, per micro-batch, on one GPU.

Each block is a list of kernels (GEMMs, flash attention, memory-bound elementwise work) whose
times come from the roofline compute model, so GEMM size effects on efficiency are kept.
Shapes are per tensor-parallel rank (``tp``) and per context-parallel shard (``cp``).

FLOP conventions (forward, one block, micro-batch b, sequence s, hidden h, FFN f, KV width k):
QKV ``2bs·h(h + 2k)``, attention ``4bs²h`` counted full (Megatron/PaLM convention; the causal
kernel does half of it, which is what is timed), output ``2bsh²``, MLP ``2bshf × (3 for SwiGLU,
2 for GELU)``; backward is twice forward. For GPT with f = 4h and k = h this gives the
Korthikanti model-FLOPs formula ``72bslh²(1 + s/6h) + 6bshV`` per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.compute import ComputeProfile, op_time

from planner.model.llm.spec import ModelSpec

__all__ = ["Kernel", "block_kernels", "logits_kernels", "block_model_flops", "logits_model_flops",
           "kernels_time", "bytes_per_element"]

_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


def bytes_per_element(precision: str) -> int:
    return _BYTES[precision]


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    flops: float      # FLOPs actually executed (all ``count`` launches together)
    bytes: float      # bytes moved to and from HBM (all launches together)
    dtype: str
    count: int = 1    # equal launches the work is split into (one GEMM per local expert)
    kind: str = "matmul"  # efficiency curve of the FLOPs: "attention" for a fused flash kernel


def _act_dtype(precision: str) -> str:
    return "bf16" if precision == "fp8" else precision


def block_kernels(m: ModelSpec, *, b: int, tp: int, cp: int, precision: str,
                  attention: str = "flash", sequence_parallel: bool = True,
                  ep: int = 1) -> list[Kernel]:
    """Forward kernels of one transformer block on one rank.

    ``attention="flash"``: one fused causal kernel (half the full-score FLOPs, no s×s traffic).
    ``attention="standard"`` (Megatron before flash attention): batched score and value GEMMs
    over the full s×s scores, plus softmax and dropout passes over them in memory.
    Without ``sequence_parallel`` the norms, dropouts and residual adds run on the whole
    activation on every tensor-parallel rank instead of a 1/tp slice.

    Mixture of experts: a router GEMM, then each rank runs its ``E/ep`` local experts as one GEMM
    each over the tokens routed to it (balanced routing: ``top_k · T · ep / E`` tokens per
    expert), so small experts and high ``ep`` give small, less efficient GEMMs.
    """
    if attention not in ("flash", "standard"):
        raise ValueError(f"attention must be flash or standard, got {attention!r}")
    e = _BYTES[_act_dtype(precision)]
    s_loc = m.seq_len / cp
    T = b * s_loc                    # tokens on this rank
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = m.num_kv_heads * m.head_dim
    gemm = "fp8" if precision == "fp8" else precision
    experts = max(1, m.top_k if m.num_experts else 1)
    act = _act_dtype(precision)
    if attention == "flash":
        # flash attention, causal: half of the 4·T·s·h/tp full-score FLOPs
        attn = [Kernel("attention", 2 * T * m.seq_len * h / tp,
                       e * (T * (h + 2 * kv) / tp + T * h / tp), act, kind="attention")]
    else:
        scores = b * (m.num_heads / tp) * s_loc * m.seq_len      # elements of the s×s scores
        attn = [Kernel("attention", 2 * T * m.seq_len * h / tp,
                       e * (T * (h + kv) / tp + scores), act),
                Kernel("attention_softmax", 0.0, (2 * e + 2 * e + 1) * scores, act),
                Kernel("attention", 2 * T * m.seq_len * h / tp,
                       e * (scores + T * kv / tp + T * h / tp), act)]
    sp = tp if sequence_parallel else 1
    ks = [
        Kernel("qkv", 2 * T * h * (h + 2 * kv) / tp, e * (T * h + h * (h + 2 * kv) / tp
                                                       + T * (h + 2 * kv) / tp), gemm),
        *attn,
        Kernel("attn_out", 2 * T * h * h / tp, e * (T * h / tp + h * h / tp + T * h), gemm),
        *_mlp_kernels(m, T=T, tp=tp, ep=ep, e=e, gemm=gemm, sp=sp),
        # norms, residual adds, activation function, dropout: memory-bound passes
        Kernel("elementwise", 0.0, e * (12 * T * h / sp + 2 * experts * T * f / tp), act),
    ]
    return ks


def _mlp_kernels(m: ModelSpec, *, T: float, tp: int, ep: int, e: int, gemm: str,
                 sp: int) -> list[Kernel]:
    h, f = m.hidden_size, m.ffn_hidden_size
    mats = 3 if m.ffn == "swiglu" else 2
    up = mats - 1                             # SwiGLU's gate and up projections are one GEMM
    if not m.is_moe:
        return [Kernel("mlp_up", up * 2 * T * h * f / tp,
                       e * (T * h + up * h * f / tp + up * T * f / tp), gemm),
                Kernel("mlp_down", 2 * T * h * f / tp,
                       e * (T * f / tp + h * f / tp + T * h), gemm)]
    local = m.num_experts // ep
    routed = m.top_k * T                      # token copies processed on this rank
    return [Kernel("router", 2 * (T / sp) * h * m.num_experts,
                   e * (T / sp) * (h + m.num_experts) + 4 * h * m.num_experts, gemm),
            # permute tokens into expert order before, and back after (read + write each)
            Kernel("moe_permute", 0.0, 2 * 2 * e * routed * h / tp, gemm),
            Kernel("experts_up", up * 2 * routed * h * f / tp,
                   e * (routed * h + local * up * h * f / tp + up * routed * f / tp),
                   gemm, count=local),
            Kernel("experts_down", 2 * routed * h * f / tp,
                   e * (routed * f / tp + local * h * f / tp + routed * h), gemm, count=local)]


def logits_kernels(m: ModelSpec, *, b: int, tp: int, cp: int, precision: str) -> list[Kernel]:
    """Forward of the output layer and loss on the last stage."""
    e = _BYTES[_act_dtype(precision)]
    T = b * m.seq_len / cp
    V, h = m.vocab_size, m.hidden_size
    return [Kernel("logits", 2 * T * h * V / tp, e * (T * h + h * V / tp + T * V / tp),
                   "fp8" if precision == "fp8" else precision),
            Kernel("loss", 0.0, 4 * 3 * T * V / tp, "fp32")]


def block_model_flops(m: ModelSpec, *, tokens: float) -> float:
    """Model FLOPs (forward + backward, no recompute, attention counted full) of one block."""
    h, f = m.hidden_size, m.ffn_hidden_size
    kv = m.num_kv_heads * m.head_dim
    mats = 3 if m.ffn == "swiglu" else 2
    experts = max(1, m.top_k if m.num_experts else 1)
    fwd = 2 * tokens * h * (h + 2 * kv) + 4 * tokens * m.seq_len * h + 2 * tokens * h * h \
        + experts * mats * 2 * tokens * h * f
    if m.is_moe:
        fwd += 2 * tokens * h * m.num_experts           # router
    return 3 * fwd


def logits_model_flops(m: ModelSpec, *, tokens: float) -> float:
    return 3 * 2 * tokens * m.hidden_size * m.vocab_size


def kernels_time(profile: ComputeProfile, kernels: list[Kernel], *, backward: bool = False) -> float:
    """Seconds for the kernels in forward or backward.

    Backward of a GEMM ``Y = X·Wᵀ`` is two GEMMs, each with the forward's FLOPs and about its
    bytes: the input gradient ``dY·W`` and the weight gradient ``dYᵀ·X``; each is timed at its
    own size on the efficiency curve (one GEMM of twice the FLOPs would read the curve where it
    is higher: small GEMMs, as on a CPU, came out too fast; planner/measure/validate/README.md). A fused
    flash-attention backward is one kernel of 2.5× the forward FLOPs on its own curve;
    memory-bound passes move twice their forward bytes."""
    total = 0.0
    for k in kernels:
        if not backward:
            mult, launches, kind = 1.0, k.count, k.kind
        elif k.kind == "attention":
            mult, launches, kind = 2.5, k.count, "attention_backward"
        elif k.flops > 0:
            mult, launches, kind = 1.0, 2 * k.count, k.kind
        else:
            mult, launches, kind = 2.0, k.count, k.kind
        total += launches * op_time(profile, flops=mult * k.flops / k.count,
                                    bytes_moved=mult * k.bytes / k.count, dtype=k.dtype,
                                    kind=kind)
    return total
