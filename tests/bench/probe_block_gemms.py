"""Diagnostic: one process, one thread, the validation's scaled Llama (hidden 512, FFN 1792,
4 blocks, 128 tokens, 2 micro-batches, vocab 512): its GEMMs timed alone as the calibration's
probe times them (weights and saved inputs from a pool larger than the caches) against the whole
model's forward (no grad) and forward+backward, three times.

    python tests/bench/probe_block_gemms.py

Shows whether the gap between predicted and measured step time is already there in one process
(no gloo, no second rank) and in which pass; see planner/measure/validate/README.md.
"""
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
h,f,V,L,T,heads,kvh=512,1792,512,4,128,8,2
hd=h//heads
class Blk(nn.Module):
    def __init__(s):
        super().__init__()
        s.qkv=nn.Linear(h,(heads+2*kvh)*hd,bias=False); s.out=nn.Linear(h,h,bias=False)
        s.up=nn.Linear(h,2*f,bias=False); s.down=nn.Linear(f,h,bias=False)
        s.n1=nn.RMSNorm(h); s.n2=nn.RMSNorm(h)
    def forward(s,x):
        b,t,_=x.shape
        q,k,v=s.qkv(s.n1(x)).split([heads*hd,kvh*hd,kvh*hd],-1)
        q=q.view(b,t,heads,hd).transpose(1,2);k=k.view(b,t,kvh,hd).transpose(1,2);v=v.view(b,t,kvh,hd).transpose(1,2)
        a=F.scaled_dot_product_attention(q,k,v,is_causal=True,enable_gqa=True)
        x=x+s.out(a.transpose(1,2).reshape(b,t,h))
        g,u=s.up(s.n2(x)).chunk(2,-1)
        return x+s.down(F.silu(g)*u)
blocks=nn.Sequential(*[Blk() for _ in range(L)]); head=nn.Linear(h,V,bias=False)
x0=torch.randn(1,T,h); tgt=torch.randint(0,V,(1,T))
def step():
    for p in list(blocks.parameters())+[head.weight]: p.grad=None
    for mb in range(2):
        y=head(blocks(x0)); loss=F.cross_entropy(y.view(-1,V),tgt.view(-1)); loss.backward()
def fwd():
    with torch.no_grad():
        for mb in range(2): head(blocks(x0))
def med(fn,k=7):
    for _ in range(2): fn()
    ts=[]
    for _ in range(k):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return statistics.median(ts)
# isolated GEMMs, cold weights pool, as the calibration probe
def gemm_sum():
    tot_f=tot_b=0
    for (n,k) in [(768,h),(h,h),(2*f,h),(h,f)]*L+[(V,h)]:
        pool=[torch.randn(n,k) for _ in range(max(1,min(64,(64<<20)//(4*n*k))))]
        xs=[torch.randn(T,k) for _ in range(max(1,min(64,(64<<20)//(4*T*k))))]
        x=xs[0]; g=torch.randn(T,n); i=[0]
        def nx(p): i[0]=(i[0]+1)%len(p); return p[i[0]]
        tot_f+=med(lambda: F.linear(x,nx(pool)),9)
        tot_b+=med(lambda: g.t().mm(nx(xs)),9)+med(lambda: g.mm(nx(pool)),9)
    return 2*tot_f, 2*tot_b
for r in range(3):
    gf,gb=gemm_sum()
    s=med(step); fo=med(fwd)
    print(f"isolated GEMMs x2 mb: fwd {gf*1e3:.1f} bwd {gb*1e3:.1f} ms | real fwd(no_grad) {fo*1e3:.1f} ms, fwd+bwd {s*1e3:.1f} ms")
# gradient bookkeeping the simulator does not model: the worker's copy into its flat buffer, its
# 1/dp scaling, and the second micro-batch's accumulation
params = list(blocks.parameters()) + [head.weight]
n = sum(p.numel() for p in params)
grads = [torch.randn_like(p) for p in params]
news = [torch.randn_like(p) for p in params]
flat = torch.empty(n)
acc = med(lambda: [g.add_(x) for g, x in zip(grads, news)], 15)
cat = med(lambda: torch.cat([g.reshape(-1) for g in reversed(grads)], out=flat), 15)
div = med(lambda: flat.div_(2), 15)
print(f"{n / 1e6:.1f} M parameters: accumulate {acc * 1e3:.1f} ms, copy into flat buffer "
      f"{cat * 1e3:.1f} ms, 1/dp scaling {div * 1e3:.1f} ms")
