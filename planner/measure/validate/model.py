"""A GPT-like decoder with Megatron-style tensor parallelism, written for validation runs.

Tensor parallelism is manual, as in Megatron-LM's ``tensor_parallel`` layers: autograd
functions around column- and row-parallel linears (``copy`` = identity forward, all-reduce of
the input gradient backward; ``reduce`` = all-reduce forward, identity backward), a
vocabulary-parallel embedding (all-reduce forward) and a vocabulary-parallel cross entropy
(all-reduces of the max, the target logit and the sum of exponentials, in fp32). Each block
issues 2 all-reduces forward and 2 backward, the counts :mod:`planner.workloads.llm.step` expects.

Why not DTensor: ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` does run on
gloo, but with separate q, k, v (and gate, up) projections it all-reduces each one's input
gradient (4 backward all-reduces per block where Megatron's fused projections issue 2), and its
functional collectives bypass the ``torch.distributed`` Python calls a logging wrapper sees.

Blocks: RMSNorm, fused QKV (grouped-query heads split over TP), causal SDPA, output projection,
RMSNorm, SwiGLU (fused gate/up) or GELU MLP; no biases; untied input and output embeddings.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.model.llm.spec import ModelSpec

__all__ = ["TPGroup", "Chunk", "build_chunk"]


class TPGroup:
    """The tensor-parallel group of a rank and the recorder its collectives go through."""

    def __init__(self, rec, pg, ranks: tuple[int, ...], rank: int) -> None:
        self.rec, self.pg, self.ranks = rec, pg, ranks
        self.size = len(ranks)
        self.index = ranks.index(rank)

    def all_reduce(self, t: torch.Tensor, name: str, op: str = "sum") -> torch.Tensor:
        return self.rec.all_reduce(t, self.pg, self.ranks, name, "tp", op=op)


class _Copy(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (before a column-parallel GEMM)."""

    @staticmethod
    def forward(ctx, x, tp, what, layer):
        ctx.tp, ctx.what, ctx.layer = tp, what, layer
        return x

    @staticmethod
    def backward(ctx, g):
        rec = ctx.tp.rec
        g = g.contiguous().clone()
        ctx.tp.all_reduce(g, f"tp {ctx.what} B {rec.tag}{ctx.layer}")
        return g, None, None, None


class _Reduce(torch.autograd.Function):
    """All-reduce forward (after a row-parallel GEMM); identity backward."""

    @staticmethod
    def forward(ctx, x, tp, what, layer):
        rec = tp.rec
        x = x.contiguous().clone()
        tp.all_reduce(x, f"tp {what} {rec.fwd_label()} {rec.tag}{layer}")
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None, None, None


def copy_to_tp(x, tp: TPGroup, what: str, layer: str = ""):
    return _Copy.apply(x, tp, what, layer) if tp.size > 1 else x


def reduce_from_tp(x, tp: TPGroup, what: str, layer: str = ""):
    return _Reduce.apply(x, tp, what, layer) if tp.size > 1 else x


class RMSNorm(nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


def _linear(n_in: int, n_out: int) -> nn.Linear:
    lin = nn.Linear(n_in, n_out, bias=False)
    nn.init.normal_(lin.weight, std=0.02)
    return lin


class Block(nn.Module):
    """One transformer block on one TP rank (1/tp of the heads and of the FFN)."""

    def __init__(self, m: ModelSpec, tp: TPGroup, layer: int, recompute: str) -> None:
        super().__init__()
        self.tp, self.layer, self.recompute = tp, f" l{layer}", recompute
        self.heads = m.num_heads // tp.size
        self.kv_heads = m.num_kv_heads // tp.size
        self.hd = m.head_dim
        self.swiglu = m.ffn == "swiglu"
        ffn = m.ffn_hidden_size // tp.size
        self.norm1 = RMSNorm(m.hidden_size)
        self.qkv = _linear(m.hidden_size, (self.heads + 2 * self.kv_heads) * self.hd)
        self.out = _linear(self.heads * self.hd, m.hidden_size)
        self.norm2 = RMSNorm(m.hidden_size)
        self.up = _linear(m.hidden_size, (2 if self.swiglu else 1) * ffn)
        self.down = _linear(ffn, m.hidden_size)

    def _attention(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                              enable_gqa=self.kv_heads != self.heads)

    def forward(self, x):
        b, s, _ = x.shape
        h = copy_to_tp(self.norm1(x), self.tp, "attn", self.layer)
        q, k, v = self.qkv(h).split([self.heads * self.hd, self.kv_heads * self.hd,
                                     self.kv_heads * self.hd], dim=-1)
        q = q.view(b, s, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.hd).transpose(1, 2)
        if self.recompute == "selective":
            from torch.utils.checkpoint import checkpoint
            a = checkpoint(self._attention, q, k, v, use_reentrant=False)
        else:
            a = self._attention(q, k, v)
        a = self.out(a.transpose(1, 2).reshape(b, s, self.heads * self.hd))
        x = x + reduce_from_tp(a, self.tp, "attn", self.layer)
        h = copy_to_tp(self.norm2(x), self.tp, "mlp", self.layer)
        u = self.up(h)
        if self.swiglu:
            g, u = u.chunk(2, dim=-1)
            u = F.silu(g) * u
        else:
            u = F.gelu(u)
        return x + reduce_from_tp(self.down(u), self.tp, "mlp", self.layer)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over vocabulary-sharded logits (Megatron's algorithm): all-reduce the
    per-token max, the target logit and the sum of exponentials (fp32) over TP."""

    @staticmethod
    def forward(ctx, logits, target, tp: TPGroup, start: int):
        rec = tp.rec
        logits = logits.float()
        mx = logits.max(dim=-1).values
        tp.all_reduce(mx, f"tp xent max F {rec.tag}", op="max")
        logits = logits - mx.unsqueeze(-1)
        n = logits.shape[-1]
        outside = (target < start) | (target >= start + n)
        local = (target - start).masked_fill(outside, 0)
        picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        tp.all_reduce(picked, f"tp xent target F {rec.tag}")
        exp = logits.exp()
        total = exp.sum(dim=-1)
        tp.all_reduce(total, f"tp xent sumexp F {rec.tag}")
        ctx.save_for_backward(exp.div_(total.unsqueeze(-1)), local, outside)
        return torch.log(total) - picked

    @staticmethod
    def backward(ctx, g):
        soft, local, outside = ctx.saved_tensors
        grad = soft.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), -(~outside).float().unsqueeze(-1))
        return grad * g.unsqueeze(-1), None, None, None


class Chunk(nn.Module):
    """The blocks of one virtual pipeline stage, with the embedding on the first and the final
    norm, output layer and loss on the last."""

    def __init__(self, m: ModelSpec, tp: TPGroup, layers: range, *, first: bool, last: bool,
                 recompute: str) -> None:
        super().__init__()
        self.tp, self.first, self.last = tp, first, last
        self.full_recompute = recompute == "full"
        v_local = m.vocab_size // tp.size
        self.v_start = tp.index * v_local
        if first:
            self.embed = nn.Embedding(v_local, m.hidden_size)
            nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(m, tp, i, recompute) for i in layers)
        if last:
            self.norm = RMSNorm(m.hidden_size)
            self.head = _linear(m.hidden_size, v_local)

    def embed_tokens(self, tokens):
        n = self.embed.num_embeddings
        outside = (tokens < self.v_start) | (tokens >= self.v_start + n)
        x = self.embed((tokens - self.v_start).masked_fill(outside, 0))
        x = x.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(x, self.tp, "embed")

    def forward(self, x):
        if self.first:
            x = self.embed_tokens(x)
        for blk in self.blocks:
            if self.full_recompute:
                from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
                # Megatron recomputes the whole block, its closing all-reduce included; torch's
                # default early stop would end the recompute before that all-reduce
                with set_checkpoint_early_stop(False):
                    x = checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return x

    def loss(self, x, target, microbatches: int):
        h = copy_to_tp(self.norm(x), self.tp, "logits")
        logits = self.head(h)
        per_token = _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.shape[-1]),
                                                     target.reshape(-1), self.tp, self.v_start)
        return per_token.mean() / microbatches


def build_chunk(m: ModelSpec, tp: TPGroup, layers: range, *, first: bool, last: bool,
                recompute: str, seed: int) -> Chunk:
    """A chunk initialised from ``seed`` (the same on every data-parallel replica)."""
    torch.manual_seed(seed)
    return Chunk(m, tp, layers, first=first, last=last, recompute=recompute)


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())

