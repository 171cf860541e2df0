"""Llama-style transformer blocks and small whole decoders measured on a GPU with PyTorch:
``blocks.csv`` and ``steps.csv`` of ``python -m planner.measure.compute.gpu`` (see that module
for the files and the timing), and the block other GPU measurements reuse
(:func:`block_class`). Times are seconds.
"""

from __future__ import annotations

from planner.measure.compute.gpu_timing import auto_time, flash_ctx, torch_module

__all__ = ["block_class", "BLOCKS", "STEPS", "measure_blocks", "measure_steps"]


def block_class():
    """The block as an ``nn.Module`` class (defined on first use, so importing needs no torch)."""
    torch = torch_module()
    import torch.nn.functional as F
    nn = torch.nn

    class Block(nn.Module):
        """Llama-style block: pre-RMSNorm, fused QKV (GQA), causal SDPA, SwiGLU MLP."""

        def __init__(self, h: int, f: int, heads: int, kv_heads: int):
            super().__init__()
            self.h, self.heads, self.kv = h, heads, kv_heads
            self.d = h // heads
            self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
            self.qkv = nn.Linear(h, h + 2 * kv_heads * self.d, bias=False)
            self.out = nn.Linear(h, h, bias=False)
            self.up = nn.Linear(h, 2 * f, bias=False)
            self.down = nn.Linear(f, h, bias=False)

        def forward(self, x):                                     # x: (b, s, h)
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([self.h, self.kv * self.d, self.kv * self.d],
                                                 dim=-1)
            q = q.view(b, s, self.heads, self.d).transpose(1, 2)
            k = k.view(b, s, self.kv, self.d).transpose(1, 2)
            v = v.view(b, s, self.kv, self.d).transpose(1, 2)
            if self.kv != self.heads:
                k = k.repeat_interleave(self.heads // self.kv, dim=1)
                v = v.repeat_interleave(self.heads // self.kv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(b, s, self.h))
            gate, up = self.up(self.n2(x)).chunk(2, dim=-1)
            return x + self.down(F.silu(gate) * up)

    return Block


BLOCKS = [  # name, hidden, ffn, heads, kv_heads, seq, micro-batch
    ("h1024-s1024-b1", 1024, 2816, 8, 8, 1024, 1),
    ("h1024-s2048-b4", 1024, 2816, 8, 8, 2048, 4),
    ("h2048-s2048-b1", 2048, 5632, 16, 8, 2048, 1),
    ("h2048-s2048-b4", 2048, 5632, 16, 8, 2048, 4),
    ("h4096-s2048-b1", 4096, 14336, 32, 8, 2048, 1),
    ("h4096-s4096-b1", 4096, 14336, 32, 8, 4096, 1),
    ("h4096-s4096-b2", 4096, 14336, 32, 8, 4096, 2),
    ("h4096-s8192-b1", 4096, 14336, 32, 8, 8192, 1),
    ("h8192-s4096-b1", 8192, 28672, 64, 8, 4096, 1),
    ("h8192-s8192-b1", 8192, 28672, 64, 8, 8192, 1),
    ("h5120-s2048-b1-mha", 5120, 13824, 40, 40, 2048, 1),
    ("h512-s512-b1", 512, 1408, 8, 8, 512, 1),
]

STEPS = [  # name, layers, hidden, ffn, heads, kv, vocab, seq, micro-batch
    ("tiny-4L-h1024", 4, 1024, 2816, 8, 8, 32000, 1024, 4),
    ("small-8L-h2048", 8, 2048, 5632, 16, 8, 32000, 2048, 2),
    ("llama8b-4L", 4, 4096, 14336, 32, 8, 128256, 4096, 1),
    ("llama8b-4L-b2", 4, 4096, 14336, 32, 8, 128256, 4096, 2),
    ("llama70b-2L", 2, 8192, 28672, 64, 8, 128256, 4096, 1),
]


def measure_blocks(dev, *, quick: bool, samples: int) -> list[dict]:
    torch = torch_module()
    Block = block_class()
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    rows = []
    todo = BLOCKS if not quick else [("q-h256-s128-b1", 256, 704, 4, 2, 128, 1)]
    ctx = flash_ctx()
    for (name, h, f, heads, kv, s, b) in todo:
        blk = Block(h, f, heads, kv).to(device=dev, dtype=dt)
        x = torch.randn(b, s, h, device=dev, dtype=dt, requires_grad=True)
        g = torch.randn(b, s, h, device=dev, dtype=dt)
        with ctx():
            tf, iqr_f = auto_time(lambda: blk(x), dev, samples=samples)

            def fb():
                blk(x).backward(g)
            tfb, iqr_fb = auto_time(fb, dev, samples=samples)
            # host time alone: the same calls without waiting (GPU work enqueued)
        rows.append(dict(name=name, hidden=h, ffn=f, heads=heads, kv_heads=kv, seq=s,
                         micro_batch=b, dtype=str(dt).split(".")[-1], forward_s=tf,
                         backward_s=tfb - tf, iqr_rel_fwd=iqr_f, iqr_rel_fwd_bwd=iqr_fb))
        del blk, x, g
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure_steps(dev, *, quick: bool, samples: int) -> list[dict]:
    torch = torch_module()
    import torch.nn.functional as F
    nn = torch.nn
    Block = block_class()
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    todo = STEPS if not quick else [("q-2L", 2, 256, 704, 4, 2, 1000, 128, 2)]
    rows = []
    ctx = flash_ctx()
    for (name, L, h, f, heads, kv, V, s, b) in todo:
        class Model(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(V, h)
                self.blocks = nn.ModuleList(Block(h, f, heads, kv) for _ in range(L))
                self.norm = nn.RMSNorm(h)
                self.head = nn.Linear(h, V, bias=False)

            def forward(self, ids, labels):
                x = self.emb(ids)
                for blk in self.blocks:
                    x = blk(x)
                logits = self.head(self.norm(x))
                return F.cross_entropy(logits.float().view(-1, V), labels.view(-1))

        model = Model().to(device=dev, dtype=dt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                fused=dev.type == "cuda")
        ids = torch.randint(0, V, (b, s), device=dev)
        labels = torch.randint(0, V, (b, s), device=dev)
        with ctx():
            def fb():
                model(ids, labels).backward()
            tfb, iqr_fb = auto_time(fb, dev, samples=samples)

            def fwd():
                with torch.no_grad():
                    model(ids, labels)
            tf, iqr_f = auto_time(fwd, dev, samples=samples)
            to, iqr_o = auto_time(lambda: opt.step(), dev, samples=samples)
        params = sum(p.numel() for p in model.parameters())
        rows.append(dict(name=name, layers=L, hidden=h, ffn=f, heads=heads, kv_heads=kv,
                         vocab=V, seq=s, micro_batch=b, params=params,
                         dtype=str(dt).split(".")[-1], forward_s=tf, forward_backward_s=tfb,
                         optimizer_s=to, iqr_rel_fwd_bwd=iqr_fb, iqr_rel_opt=iqr_o))
        del model, opt
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows
