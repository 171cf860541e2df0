"""Bytes a transformer block really saves for its backward, counted in eager PyTorch (CPU).

Checks :mod:`planner.model.llm.activations`: a Llama-style block (RMSNorm, fused QKV GEMM with
GQA, RoPE, causal attention, output projection, SwiGLU MLP) and a GPT-style block (LayerNorm,
MHA, GELU MLP, dropout) run forward under :func:`torch.autograd.graph.saved_tensors_hooks`, and
the bytes of the unique storages the autograd graph keeps (deduplicated by storage address;
parameters and constant tables excluded) are summed. Recompute modes as Megatron: ``selective``
checkpoints the core attention, ``full`` the whole block, with a checkpoint function written as
Megatron's ``tensor_parallel.checkpoint`` (a reentrant one: it keeps its tensor inputs with
``save_for_backward``, so the count sees them, once per storage; ``torch.utils.checkpoint``'s
non-reentrant variant keeps the same tensors but imports the compiler stack, seconds here).

The blocks mirror the choices of Megatron-Core with Transformer Engine where eager PyTorch
differs, with small autograd functions:

- norms keep their input and fp32 statistics (TE's fused norms; eager ``F.rms_norm`` on CPU
  keeps fp32 copies of the input and of the normalised output, and ``F.layer_norm`` on CPU keeps
  bf16 statistics);
- SwiGLU keeps only its input (Megatron's fused ``bias_swiglu``; eager ``silu(g) * u`` also
  keeps ``silu(g)``);
- dropout keeps a bool mask (CUDA's ``native_dropout`` and Megatron; on CPU the mask is kept in
  the input dtype);
- tensor parallelism is emulated on one process by building the block with ``1/tp`` of the
  heads and of the FFN width; sequence parallelism by running the norms and residual on
  ``1/tp`` of the tokens, the column-parallel GEMMs keeping only that shard and "gathering"
  it again in their backward (Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``),
  and the row-parallel GEMMs' "reduce-scatter" keeping ``1/tp`` of the tokens (the gathered
  copies are ``tp`` repeats of the local shard: the same sizes as the real collective's);
- with RoPE (Llama), ``V`` gets its own storage, as Transformer Engine's attention does when Q
  and K are RoPE outputs and V a strided view into the fused QKV output (its ``get_qkv_layout``
  copies layouts it does not recognise); without RoPE (GPT) Q, K and V stay views of the fused
  QKV output (TE's ``sbh3d`` layout), which is kept whole: the same ``3h`` bytes for MHA.

Attention: on CPU, ``F.scaled_dot_product_attention`` without dropout runs the CPU flash kernel
(``ScaledDotProductFlashAttentionForCpuBackward0``), which keeps q, k, v (GQA natively: K and V
at ``num_kv_heads`` width), the output and an fp32 log-sum-exp, as the GPU flash kernels do; this
is ``attention="flash"``. With dropout it falls back to the math path (fp32 masks), so the GPT
block's flash variant runs the core without dropout (on the GPU the flash kernel regenerates its
dropout mask from the RNG state and keeps none). ``attention="standard"`` is written out as
Megatron's core attention: ``q·kᵀ`` (K and V expanded to all heads), scaled and masked, softmax
(keeps its output), dropout (keeps its mask), then the value GEMM.

>>> measure_block("llama", tp=1, sp=False, attention="flash", recompute="full",
...               batch=1, seq=8, hidden=16, heads=4, kv_heads=2, ffn=24)["bytes"]
256
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ["measure_block", "saved_bytes", "sdpa_backend"]

DTYPE = torch.bfloat16


class _RMSNorm(torch.autograd.Function):
    """RMSNorm keeping its input and fp32 rstd (Transformer Engine's fused RMSNorm)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, w)
        return (x.float() * rstd).to(x.dtype) * w

    @staticmethod
    def backward(ctx, dy):
        x, rstd, w = ctx.saved_tensors
        xh = x.float() * rstd
        g = dy.float() * w.float()
        dx = rstd * (g - xh * (g * xh).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy.float() * xh).sum(0).to(w.dtype), None


class _LayerNorm(torch.autograd.Function):
    """LayerNorm keeping its input and fp32 mean and rstd (TE's / CUDA's native LayerNorm)."""

    @staticmethod
    def forward(ctx, x, w, b, eps):
        xf = x.float()
        mean = xf.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)
        ctx.save_for_backward(x, mean, rstd, w)
        return ((xf - mean) * rstd).to(x.dtype) * w + b

    @staticmethod
    def backward(ctx, dy):
        x, mean, rstd, w = ctx.saved_tensors
        xh = (x.float() - mean) * rstd
        g = dy.float() * w.float()
        dx = rstd * (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True))
        return (dx.to(x.dtype), (dy.float() * xh).sum(0).to(w.dtype),
                dy.float().sum(0).to(w.dtype), None)


class _SwiGLU(torch.autograd.Function):
    """silu(gate)·up keeping only its input (Megatron-Core's fused ``bias_swiglu``)."""

    @staticmethod
    def forward(ctx, y):
        ctx.save_for_backward(y)
        g, u = y.chunk(2, -1)
        return F.silu(g) * u

    @staticmethod
    def backward(ctx, dz):
        (y,) = ctx.saved_tensors
        g, u = y.float().chunk(2, -1)
        s = torch.sigmoid(g)
        dg = dz.float() * u * s * (1 + g * (1 - s))
        return torch.cat([dg, dz.float() * g * s], -1).to(y.dtype)


class _Dropout(torch.autograd.Function):
    """Dropout keeping a bool mask (CUDA's ``native_dropout``)."""

    @staticmethod
    def forward(ctx, x, p):
        mask = torch.rand_like(x, dtype=torch.float32) >= p
        ctx.save_for_backward(mask)
        ctx.scale = 1.0 / (1.0 - p)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx, dy):
        (mask,) = ctx.saved_tensors
        return dy * mask * ctx.scale, None


class _Checkpoint(torch.autograd.Function):
    """Megatron's ``tensor_parallel.checkpoint``: run ``fn`` without keeping its graph, keep its
    tensor inputs (``save_for_backward``), recompute it in the backward (same RNG state)."""

    @staticmethod
    def forward(ctx, fn, *args):
        ctx.fn, ctx.rng = fn, torch.get_rng_state()
        ctx.where = [isinstance(a, torch.Tensor) for a in args]
        ctx.others = [None if t else a for a, t in zip(args, ctx.where)]
        ctx.save_for_backward(*[a for a, t in zip(args, ctx.where) if t])
        with torch.no_grad():
            return fn(*args)

    @staticmethod
    def backward(ctx, *grads):
        saved = iter(ctx.saved_tensors)
        args = [next(saved).detach().requires_grad_(True) if t else a
                for a, t in zip(ctx.others, ctx.where)]
        state = torch.get_rng_state()
        torch.set_rng_state(ctx.rng)
        with torch.enable_grad():
            out = ctx.fn(*args)
        torch.set_rng_state(state)
        torch.autograd.backward(out, grads)
        return (None, *[a.grad if t else None for a, t in zip(args, ctx.where)])


class _GatherLinear(torch.autograd.Function):
    """Sequence-parallel column-parallel GEMM: all-gather (here ``tp`` repeats of the shard),
    GEMM; keeps only the shard and gathers again in the backward (Megatron)."""

    @staticmethod
    def forward(ctx, x, w, tp):
        ctx.save_for_backward(x, w)
        ctx.tp = tp
        return x.repeat(tp, 1) @ w.t()

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        full = x.repeat(ctx.tp, 1)
        dx = (dy @ w).view(ctx.tp, *x.shape).sum(0)    # reduce-scatter
        return dx, dy.t() @ full, None


def saved_bytes(fn, *args, exclude=()) -> tuple[int, object]:
    """Bytes of the unique storages the autograd graph keeps while ``fn(*args)`` runs (storages
    of ``exclude`` — parameters, constant tables — not counted); and ``fn``'s result."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    kept: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in skip and st.nbytes():
            kept[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(kept.values()), out


def sdpa_backend() -> str:
    """The autograd node of a causal SDPA call on this machine (CPU flash or math)."""
    q = torch.randn(1, 2, 8, 4, dtype=DTYPE, requires_grad=True)
    return type(F.scaled_dot_product_attention(q, q, q, is_causal=True).grad_fn).__name__


def _rope(x, cos, sin):
    """Rotary embedding (its backward needs only cos and sin)."""
    a, b = x.chunk(2, -1)
    return x * cos + torch.cat([-b, a], -1) * sin


def _core(q, k, v, attention: str, dropout: float, bias):
    """Core attention on ``[b, heads, s, d]``; GQA K/V at kv width."""
    if attention == "flash":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=k.shape[1] != q.shape[1])
    g = q.shape[1] // k.shape[1]
    if g > 1:          # Megatron's DotProductAttention repeats K and V per query group
        b, kv, s, d = k.shape
        k = k[:, :, None].expand(b, kv, g, s, d).reshape(b, kv * g, s, d)
        v = v[:, :, None].expand(b, kv, g, s, d).reshape(b, kv * g, s, d)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1])) + bias
    probs = torch.softmax(scores, -1)
    if dropout:
        probs = _Dropout.apply(probs, dropout)
    return torch.matmul(probs, v)


class _Block:
    """One transformer block on one TP rank (see the module docstring), bf16 on CPU."""

    def __init__(self, kind: str, *, tp: int, sp: bool, attention: str, batch: int, seq: int,
                 hidden: int, heads: int, kv_heads: int, ffn: int, dropout: float = 0.1):
        self.kind, self.tp, self.sp, self.attention = kind, tp, sp and tp > 1, attention
        self.b, self.s, self.h = batch, seq, hidden
        self.d = hidden // heads
        self.a, self.f = heads // tp, ffn // tp
        self.kv = max(1, kv_heads // tp)          # KV heads replicated when tp exceeds them
        self.p = dropout if kind == "gpt" else 0.0
        g = torch.Generator().manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g) * 0.05).to(DTYPE).requires_grad_()

        d = self.d
        self.params = {"n1": w(hidden), "n2": w(hidden), "b1": w(hidden), "b2": w(hidden),
                       "qkv": w((self.a + 2 * self.kv) * d, hidden), "o": w(hidden, self.a * d),
                       "fc1": w((2 if kind == "llama" else 1) * self.f, hidden),
                       "fc2": w(hidden, self.f)}
        pos = torch.arange(seq, dtype=torch.float32)[:, None]
        freq = pos / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
        ang = torch.cat([freq, freq], -1)
        self.cos, self.sin = ang.cos().to(DTYPE), ang.sin().to(DTYPE)
        self.bias = torch.full((seq, seq), -1e4).triu(1).to(DTYPE)
        self.constants = [self.cos, self.sin, self.bias]

    def norm(self, x, i):
        if self.kind == "llama":
            return _RMSNorm.apply(x, self.params[f"n{i}"], 1e-5)
        return _LayerNorm.apply(x, self.params[f"n{i}"], self.params[f"b{i}"], 1e-5)

    def col(self, x, name):
        if self.sp:
            return _GatherLinear.apply(x, self.params[name], self.tp)
        return F.linear(x, self.params[name])

    def row(self, x, name):
        y = F.linear(x, self.params[name])
        if self.sp:            # reduce-scatter: this rank keeps 1/tp of the tokens
            y = y[: y.shape[0] // self.tp].contiguous()
        return y

    def residual(self, x, y):
        return x + (_Dropout.apply(y, self.p) if self.p else y)

    def attention_half(self, x, recompute: str):
        b, s, d, a, kv = self.b, self.s, self.d, self.a, self.kv
        qkv = self.col(self.norm(x, 1), "qkv")
        q, k, v = qkv.split([a * d, kv * d, kv * d], -1)
        q = q.view(b, s, a, d).transpose(1, 2)
        k = k.view(b, s, kv, d).transpose(1, 2)
        v = v.reshape(b, s, kv, d).transpose(1, 2)
        if self.kind == "llama":
            q, k = _rope(q, self.cos, self.sin), _rope(k, self.cos, self.sin)
            v = v.contiguous()
        p = self.p if self.attention == "standard" else 0.0
        if recompute == "selective":
            o = _Checkpoint.apply(_core, q, k, v, self.attention, p, self.bias)
        else:
            o = _core(q, k, v, self.attention, p, self.bias)
        o = o.transpose(1, 2).reshape(b * s, a * d)
        return self.residual(x, self.row(o, "o"))

    def mlp_half(self, x):
        y = self.col(self.norm(x, 2), "fc1")
        y = _SwiGLU.apply(y) if self.kind == "llama" else F.gelu(y)
        return self.residual(x, self.row(y, "fc2"))

    def forward(self, x, recompute: str = "none"):
        if recompute == "full":
            return _Checkpoint.apply(self.forward, x, "none")
        return self.mlp_half(self.attention_half(x, recompute))

    def input(self):
        tokens = self.b * self.s // (self.tp if self.sp else 1)
        g = torch.Generator().manual_seed(1)
        return torch.randn(tokens, self.h, generator=g).to(DTYPE).requires_grad_()


def measure_block(kind: str, *, tp: int = 1, sp: bool = False, attention: str = "flash",
                  recompute: str = "none", batch: int = 2, seq: int = 32, hidden: int = 64,
                  heads: int = 8, kv_heads: int = 2, ffn: int = 96, backward: bool = False) -> dict:
    """Bytes one block (``kind`` ``llama`` or ``gpt``) keeps for its backward on one TP rank.

    Returns ``{"bytes": int, "grad_fn": str}``; ``backward=True`` also runs the backward (to
    check that the graph the count saw is a working one).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # tiny shapes: OpenMP workers only spin on a shared machine
    try:
        blk = _Block(kind, tp=tp, sp=sp, attention=attention, batch=batch, seq=seq,
                     hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn)
        x = blk.input()
        n, out = saved_bytes(blk.forward, x, recompute,
                             exclude=list(blk.params.values()) + blk.constants)
        if backward:
            out.float().sum().backward()
    finally:
        torch.set_num_threads(threads)
    return {"bytes": n, "grad_fn": type(out.grad_fn).__name__}
