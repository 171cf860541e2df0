"""Activation bytes a Megatron-Core / Transformer Engine transformer block keeps for its backward.

One block, one micro-batch, one tensor-parallel rank, in bytes, as a sum of named tensors (the
tensors the block's autograd graph holds between its forward and its backward). The layout is
Megatron-Core's ``TransformerLayer`` with Transformer Engine modules (pre-norm, fused QKV GEMM,
core attention, output projection, fused bias-activation, bias-dropout-add):

====================  ====================================================================
``norm1_input``       the block input, saved by the input norm (the residual stream)
``norm1_stats``       the norm's fp32 statistics: rstd (RMSNorm) or mean and rstd (LayerNorm)
``qkv_input``         the norm output, saved by the QKV GEMM
``q``, ``k``, ``v``   the attention kernel's inputs (after RoPE); GQA: ``k``, ``v`` are
                      ``num_kv_heads·head_dim`` wide, at least one head per TP rank (standard
                      attention: expanded to all heads)
``attn_out``          the core-attention output, saved by the kernel and by the output GEMM
``softmax_lse``       flash attention's fp32 log-sum-exp per head and query
``scores_softmax``    standard attention: the ``s × s`` softmax output (input dtype)
``scores_dropout_mask``, ``scores_dropout``  standard attention with dropout: its 1-byte mask
                      and output (the value GEMM's input)
``proj_input_fp8``    fp8 only: the output GEMM's fp8 copy of ``attn_out``
``attn_dropout_mask`` the 1-byte mask of the dropout after the output projection
``norm2_input``, ``norm2_stats``, ``fc1_input``   as for the attention half
``fc1_output``        SwiGLU: gate and up (``2·ffn`` wide), both read by the activation's backward;
                      GELU: the pre-activation (``ffn`` wide)
``fc2_input``         the activation output (SwiGLU: silu(gate)·up; GELU: gelu), saved by fc2
``mlp_dropout_mask``  the 1-byte mask of the dropout after fc2
====================  ====================================================================

The activation functions are Megatron-Core's fused ``bias_swiglu`` / ``bias_gelu``, which save
only their input (eager PyTorch's ``silu(g) * u`` also keeps ``silu(g)``). Model families: the
spec has no dropout or position-embedding field, so they follow the MLP type: the GELU family
is GPT (LayerNorm, learned positions, dropout 0.1 after attention, after each residual branch
and on the embedding, Brown et al. 2020 / Megatron-LM's GPT defaults), the SwiGLU family is
Llama (RMSNorm, RoPE, no dropout; Llama 3 trains without dropout). RoPE's backward needs only
its cos/sin tables, so the pre-RoPE query and key are not kept; V, a strided view into the
fused QKV output, reaches the attention kernel as its own contiguous tensor (Transformer
Engine's ``get_qkv_layout`` copies a layout it does not recognise), so the fused QKV output is not
kept either. Without RoPE (GPT) Q, K and V stay views of the fused output (TE's ``sbh3d``
layout), which is kept whole: the same ``h + 2·kv`` width. Flash attention regenerates its
dropout mask from the RNG state, so it keeps no ``s × s`` tensor of any kind.

Tensor parallelism (``tp``) splits heads and the FFN width, so the GEMM interiors (``q``…
``fc2_input``) are ``1/tp`` on every rank. With sequence parallelism (Korthikanti et al. 2022)
the norms, residual and dropouts run on ``1/tp`` of the tokens, and the column-parallel GEMMs
keep only their sharded input and all-gather it again in the backward (Megatron's
``LinearWithGradAccumulationAndAsyncCommunication``), so ``norm*``, ``qkv_input``, ``fc1_input``
and the residual dropout masks are ``1/tp`` too; without it they are whole on every TP rank.
Context parallelism (``cp``) gives each rank ``seq/cp`` tokens; the CP attention keeps only the
local K/V chunk and fetches the others again in the backward (Transformer Engine's context-
parallel attention).

Recompute: ``selective`` checkpoints the core attention (Megatron's ``--recompute-granularity
selective``): its inputs ``q``, ``k``, ``v`` (unexpanded) are kept by the checkpoint, its output by
the output GEMM, and the rest (``softmax_lse`` or the ``s × s`` tensors) is recomputed. ``full``
keeps only each block's input, ``e·s·b·h`` (``/tp`` with sequence parallelism).

Mixture of experts: the MLP tensors are kept once per routed copy (``top_k``), the experts'
input is the permuted token copy (whole on every TP rank: Megatron's token dispatcher gathers
the sequence-parallel shards before the experts) and the router keeps its fp32 probabilities.

fp8 (Transformer Engine): GEMM inputs are kept as their 1-byte fp8 casts (``qkv_input``,
``fc1_input``, ``fc2_input``, ``proj_input_fp8``); everything else stays bf16.

GPT-style block at tp = 1, flash, no recompute, bf16 (Korthikanti's ``34·s·b·h`` without the
``5·a·s²·b`` scores, plus norm statistics and the log-sum-exp):

>>> from planner.model.llm.spec import ModelSpec
>>> gpt = ModelSpec(name="g", layers=1, hidden_size=1024, ffn_hidden_size=4096, num_heads=16,
...                 num_kv_heads=16, vocab_size=1000, seq_len=2048, ffn="gelu")
>>> t = block_terms(gpt, seq=2048, batch=1)
>>> (sum(t.values()) - t["norm1_stats"] - t["norm2_stats"] - t["softmax_lse"]) / (2048 * 1024)
34.0
"""

from __future__ import annotations

from planner.model.llm.spec import ModelSpec

__all__ = [
    "activation_bytes",
    "backward_transient_bytes",
    "block_bytes",
    "block_terms",
    "first_stage_terms",
    "gemm_input_bytes",
    "has_dropout",
    "kv_width_per_rank",
    "last_stage_terms",
    "loss_transient_bytes",
    "uses_rope",
]

#: bytes of a dropout mask element (CUDA's native_dropout / Megatron keep a bool mask)
MASK_BYTES = 1
#: bytes of an fp32 statistic (norm mean/rstd, softmax log-sum-exp, router probabilities)
FP32 = 4


def has_dropout(m: ModelSpec) -> bool:
    """Whether the model family trains with dropout (GELU/GPT family: yes; SwiGLU/Llama: no)."""
    return m.ffn == "gelu"


def uses_rope(m: ModelSpec) -> bool:
    """Whether the family uses rotary position embeddings (SwiGLU/Llama) or learned ones (GPT)."""
    return m.ffn == "swiglu"


def activation_bytes(precision: str) -> int:
    """Bytes per activation element: fp32 training 4, otherwise bf16/fp16 2 (fp8 keeps bf16)."""
    return 4 if precision == "fp32" else 2


def gemm_input_bytes(precision: str) -> int:
    """Bytes per element of a GEMM input kept for the weight gradient (fp8: TE keeps the cast)."""
    return 1 if precision == "fp8" else activation_bytes(precision)


def kv_width_per_rank(m: ModelSpec, tp: int) -> float:
    """Elements per token of K (or V) on one TP rank: ``num_kv_heads·head_dim/tp``, at least one
    head (Megatron replicates KV heads when tp exceeds them)."""
    return m.head_dim * max(1.0, m.num_kv_heads / tp)


def _attention_terms(m: ModelSpec, *, tokens: float, batch: int, sq: float, skv: float,
                     tp: int, attention: str, recompute: str, e: int, g: int) -> dict[str, float]:
    """The attention core's kept tensors on one TP rank (bytes): Q/K/V, output, scores/stats."""
    h, a = m.hidden_size, m.num_heads
    kv_local = kv_width_per_rank(m, tp)
    expand = attention == "standard" and recompute != "selective"
    out = {"q": e * tokens * h / tp,
           "k": e * tokens * (h / tp if expand else kv_local),
           "v": e * tokens * (h / tp if expand else kv_local),
           "attn_out": e * tokens * h / tp}
    if recompute != "selective":
        if attention == "flash":
            out["softmax_lse"] = FP32 * tokens * a / tp
        else:
            scores = batch * a / tp * sq * skv
            out["scores_softmax"] = e * scores
            if has_dropout(m):
                out["scores_dropout_mask"] = MASK_BYTES * scores
                out["scores_dropout"] = e * scores
    if g != e:
        out["proj_input_fp8"] = g * tokens * h / tp
    return out


def _mlp_terms(m: ModelSpec, *, tokens: float, tp: int, res: int, e: int,
               g: int) -> dict[str, float]:
    """The MLP interior's kept tensors on one TP rank (bytes), per routed copy for an MoE."""
    h, f = m.hidden_size, m.ffn_hidden_size
    width = 2 * f if m.ffn == "swiglu" else f
    if not m.is_moe:
        return {"fc1_input": g * tokens * h / res,
                "fc1_output": e * tokens * width / tp,
                "fc2_input": g * tokens * f / tp}
    k = m.top_k
    return {"router_input": g * tokens * h / res,
            "router_probs": FP32 * tokens * m.num_experts / res,
            "fc1_input": g * tokens * k * h,
            "fc1_output": e * tokens * k * width / tp,
            "fc2_input": g * tokens * k * f / tp}


def block_terms(m: ModelSpec, *, seq: int, batch: int, tp: int = 1, cp: int = 1,
                sequence_parallel: bool = True, attention: str = "flash",
                recompute: str = "none", precision: str = "bf16") -> dict[str, float]:
    """Bytes one TP rank keeps for one block's backward, per micro-batch, by tensor name.

    ``seq`` is the whole sequence (tokens), each CP rank holding ``seq/cp`` of it; ``batch`` the
    micro-batch size (sequences); ``attention`` ``flash`` or ``standard``; ``recompute``
    ``none``, ``selective`` or ``full``; ``precision`` the training precision.
    """
    e, g = activation_bytes(precision), gemm_input_bytes(precision)
    sq = seq / cp
    tokens = sq * batch
    h = m.hidden_size
    res = tp if sequence_parallel else 1          # the residual path's divisor
    if recompute == "full":
        return {"block_input": e * tokens * h / res}
    stats = (2 if not uses_rope(m) else 1) * FP32 * tokens / res   # LayerNorm mean+rstd / rstd
    out = {"norm1_input": e * tokens * h / res, "norm1_stats": stats,
           "qkv_input": g * tokens * h / res}
    out |= _attention_terms(m, tokens=tokens, batch=batch, sq=sq, skv=seq, tp=tp,
                            attention=attention, recompute=recompute, e=e, g=g)
    if has_dropout(m):
        out["attn_dropout_mask"] = MASK_BYTES * tokens * h / res
    out |= {"norm2_input": e * tokens * h / res, "norm2_stats": stats}
    out |= _mlp_terms(m, tokens=tokens, tp=tp, res=res, e=e, g=g)
    if has_dropout(m):
        out["mlp_dropout_mask"] = MASK_BYTES * tokens * h / res
    return out


def block_bytes(m: ModelSpec, **kw) -> float:
    """Sum of :func:`block_terms` (bytes per block, micro-batch and TP rank)."""
    return float(sum(block_terms(m, **kw).values()))


def first_stage_terms(m: ModelSpec, *, seq: int, batch: int, tp: int = 1, cp: int = 1,
                      sequence_parallel: bool = True) -> dict[str, float]:
    """Bytes the embedding keeps per micro-batch on the first stage (one TP rank).

    The token ids (int64, whole on every TP rank: the vocabulary-parallel lookup's backward
    reads them) and, with learned positions, the position ids; the GPT family adds the
    embedding dropout's mask. The embedding output itself is the first block's
    ``norm1_input``, counted there.
    """
    tokens = seq / cp * batch
    out = {"token_ids": 8.0 * tokens}
    if not uses_rope(m):
        out["position_ids"] = 8.0 * tokens
    if has_dropout(m):
        out["embedding_dropout_mask"] = MASK_BYTES * tokens * m.hidden_size / (
            tp if sequence_parallel else 1)
    return out


def last_stage_terms(m: ModelSpec, *, seq: int, batch: int, tp: int = 1, cp: int = 1,
                     sequence_parallel: bool = True, precision: str = "bf16") -> dict[str, float]:
    """Bytes the final norm, output layer and loss keep per micro-batch on the last stage.

    Megatron's vocabulary-parallel cross entropy casts the logits to fp32 and keeps their
    softmax (``4·tokens·vocab/tp`` bytes) for its backward; the output GEMM keeps its input
    (the final norm's output, sharded under sequence parallelism) and the final norm its input.
    """
    e, g = activation_bytes(precision), gemm_input_bytes(precision)
    tokens = seq / cp * batch
    res = tp if sequence_parallel else 1
    h = m.hidden_size
    stats = (2 if not uses_rope(m) else 1) * FP32 * tokens / res
    return {"final_norm_input": e * tokens * h / res, "final_norm_stats": stats,
            "output_input": g * tokens * h / res,
            "loss_softmax_fp32": FP32 * tokens * m.vocab_size / tp,
            "loss_targets": 8.0 * tokens}


def loss_transient_bytes(m: ModelSpec, *, seq: int, batch: int, tp: int = 1, cp: int = 1,
                         precision: str = "bf16") -> float:
    """Bytes alive only while the loss runs (last stage's forward): the logits in the training
    dtype, which live beside their fp32 copy until the model's forward returns."""
    return activation_bytes(precision) * seq / cp * batch * m.vocab_size / tp


def backward_transient_bytes(m: ModelSpec, *, seq: int, batch: int, tp: int = 1, cp: int = 1,
                             precision: str = "bf16") -> float:
    """Bytes alive only during a block's backward: the gradients of the MLP interior
    (``d fc1_output`` and ``d fc2_input``), the largest set of activation gradients that
    coexist (per routed copy for an MoE), in the activation dtype."""
    e = activation_bytes(precision)
    tokens = seq / cp * batch * (m.top_k if m.is_moe else 1)
    width = (3 if m.ffn == "swiglu" else 2) * m.ffn_hidden_size
    return e * tokens * width / tp
