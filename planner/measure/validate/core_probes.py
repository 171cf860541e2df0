"""The probes of ``clusterplan calibrate gloo`` that time one core, run on every rank at the same
time (:mod:`.calibrate` assembles the profile): fp32 GEMMs shaped as a small transformer's, causal
attention, elementwise adds, a one-element add (dispatch), new tensors against reused ones (page
faults), the wake-up cost of a small all-reduce after compute, and eager PyTorch's host time per
block pass. Units: seconds, bytes, FLOPs."""

from __future__ import annotations

import statistics
import time

from planner.measure.validate.comm import Recorder
from planner.measure.validate.comm_timing import time_calls
from planner.model.llm.spec import ModelSpec

__all__ = ["sync_time", "time_compute", "time_wake", "time_host", "WAKE_SEGMENTS",
           "WAKE_PROBE_BYTES"]

GEMM_T = (32, 128, 512)                                # tokens
GEMM_K = (64, 256, 1024, 2048)                         # input width
GEMM_N = (64, 256, 1024, 4096)                         # output width
GEMM_MAX_FLOPS = 2.2e9                                 # shapes above are left out (time)
COLD_POOL_BYTES = 96 * 2 ** 20                         # > the 32 MiB L3: operands come cold
HOST_SAMPLES = 31                                      # cold passes per host-time figure
MEMORY_BYTES = tuple(4096 * 4 ** i for i in range(8))  # per array, 4 KiB .. 64 MiB
#: new tensors timed against reused ones (page faults above glibc's mmap threshold)
FRESH_BYTES = (16 * 2 ** 20, 64 * 2 ** 20, 256 * 2 ** 20)
ATTN_HEADS = (2, 4, 8)                                 # causal SDPA, KV heads = heads / 4
ATTN_SEQ = (32, 64, 128, 256)
ATTN_HEAD_DIM = (32, 64)
WAKE_SEGMENTS = (1, 3, 10, 30)                         # compute segments between two calls
WAKE_PROBE_BYTES = 32768


def loop_length(dist, torch, one_s: float, min_s: float) -> int:
    """Calls per timed loop, the same on every rank: enough for ``min_s`` on the slowest."""
    k = torch.tensor([max(1, int(min_s / max(one_s, 1e-7)))])
    dist.all_reduce(k, op=dist.ReduceOp.MAX)
    return int(k)


def sync_time(dist, torch, fn, min_s: float, samples: int = 3) -> float:
    """Seconds per call of ``fn`` with every rank running it at the same time: the same loop
    length k on every rank (calls for at least ``min_s``), a barrier before each of
    ``samples`` loops, the median loop's mean per call."""
    fn()
    t0 = time.perf_counter()
    fn()
    k = loop_length(dist, torch, time.perf_counter() - t0, min_s)
    return statistics.median(time_calls(dist, fn, repeats=samples, calls=k, warmup=0))


def time_compute(dist, torch, min_s: float, *, quick: bool = False, note=None) -> dict:
    import torch.nn.functional as F
    note = note or (lambda what: None)
    rows = {"matmul": [], "memory": [], "launch": [], "attention": [], "attention_backward": [],
            "fresh": []}
    pick = (lambda xs: xs[::2]) if quick else (lambda xs: xs)
    for t in pick(GEMM_T):
        for k in pick(GEMM_K):
            for n in pick(GEMM_N):
                flops = 2.0 * t * k * n
                if flops > GEMM_MAX_FLOPS:
                    continue
                note("matmul probes")
                # operands a step reads from memory come from a pool larger than the caches,
                # a new one each call: the weights (forward, input gradient) and the saved
                # input (weight gradient) were evicted since their last use in a real step;
                # the freshly made activation or gradient is the same (hot) tensor
                copies = max(1, min(64, -(-COLD_POOL_BYTES // (4 * n * k))))
                ws = [torch.randn(n, k) for _ in range(copies)]
                xcopies = max(1, min(64, -(-COLD_POOL_BYTES // (4 * t * k))))
                xs = [torch.randn(t, k) for _ in range(xcopies)]
                x, g = xs[0], torch.randn(t, n)
                it = {"w": 0, "x": 0}

                def nxt(key, pool):
                    it[key] = (it[key] + 1) % len(pool)
                    return pool[it[key]]
                for fn in (lambda: F.linear(x, nxt("w", ws)), lambda: g.t().mm(nxt("x", xs)),
                           lambda: g.mm(nxt("w", ws))):
                    rows["matmul"].append((flops, sync_time(dist, torch, fn, min_s)))
    for heads in pick(ATTN_HEADS):
        for seq in pick(ATTN_SEQ):
            for hd in pick(ATTN_HEAD_DIM):
                kv = max(1, heads // 4)
                note("attention probes")
                q = torch.randn(1, heads, seq, hd, requires_grad=True)
                kk, v = torch.randn(1, kv, seq, hd), torch.randn(1, kv, seq, hd)
                flops = 2.0 * seq * seq * heads * hd    # the simulator's causal flash charge

                def fwd():
                    with torch.no_grad():
                        F.scaled_dot_product_attention(q, kk, v, is_causal=True,
                                                       enable_gqa=kv != heads)

                def fwd_bwd():
                    F.scaled_dot_product_attention(q, kk, v, is_causal=True,
                                                   enable_gqa=kv != heads).sum().backward()
                tf = sync_time(dist, torch, fwd, min_s)
                tfb = sync_time(dist, torch, fwd_bwd, min_s)
                rows["attention"].append((flops, tf))
                rows["attention_backward"].append((2.5 * flops, max(tfb - tf, 1e-7)))
    note("memory probes")
    for nbytes in pick(MEMORY_BYTES):
        a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
        c = torch.empty_like(a)
        rows["memory"].append((3.0 * nbytes, sync_time(dist, torch,
                                                        lambda: torch.add(a, b, out=c), min_s)))
    for nbytes in pick(FRESH_BYTES):
        note("new-tensor probes")
        keep = torch.empty(nbytes // 4)
        reuse = sync_time(dist, torch, lambda: keep.fill_(1.0), min_s)
        fresh = sync_time(dist, torch, lambda: torch.empty(nbytes // 4).fill_(1.0), min_s)
        rows["fresh"].append((float(nbytes), fresh, reuse))
        keep = None                  # freed before the next size
    one, two, out = torch.ones(1), torch.ones(1), torch.empty(1)
    rows["launch"].append(sync_time(dist, torch, lambda: torch.add(one, two, out=out), min_s))
    return rows


def time_wake(dist, torch, *, iters: int = 40) -> list:
    """(gap seconds, extra seconds) per compute gap: a small all-reduce issued after the rank
    computed for ``gap`` costs this much more than the same call back to back. Two effects,
    measured together: the process's gloo threads slept through the gap and are woken by the
    peer's data, and the compute right after a call runs slower (its caches were taken by the
    communication threads). The compute is a transformer-like segment: a norm's elementwise
    ops, two GEMMs and an activation (64 tokens, width 128), repeated."""
    import torch.nn.functional as F
    x, w1, w2 = torch.randn(1, 64, 128), torch.randn(256, 128), torch.randn(128, 128)
    probe = torch.ones(WAKE_PROBE_BYTES // 4)

    def segment():
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        u = F.silu(F.linear(h, w1))
        return F.linear(u[..., :128], w2) + x
    rows = []
    for reps in WAKE_SEGMENTS:
        def loop(with_comm: bool) -> float:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                for _ in range(reps):
                    segment()
                if with_comm:
                    dist.all_reduce(probe)
            return (time.perf_counter() - t0) / iters
        loop(True)
        c = statistics.median(loop(False) for _ in range(7))
        cc = statistics.median(loop(True) for _ in range(7))
        rows.append((c, cc - c))
    return rows


def time_host(dist, torch, world: int, rank: int, *, layers: int = 8) -> dict:
    """Host seconds per block pass of the validation model at tiny sizes, per FFN kind and,
    for ``tp{world}``, on a real tensor-parallel group of every rank, minus the time inside
    its all-reduces (recorded per call): what a TP block's Python, autograd functions,
    copies and dispatch cost around its communication on this machine."""
    from planner.measure.validate.model import Block, TPGroup  # torch at import: ranks only
    res = {}
    rec = Recorder(rank)
    # written before every timed pass: the pass starts with its code and data evicted from
    # the caches, as a block's host work does in a real step, between GEMMs and collectives
    # that sweep the caches (a loop of passes over the same 8 tiny blocks runs cache-hot and
    # reads less; 7 loops of 0.05 s read 3-5x apart from round to round, bench runs H-I)
    flush = torch.empty(COLD_POOL_BYTES // 4)
    for ffn, tp_size in (("swiglu", 1), ("gelu", 1), ("swiglu", world)):
        m = ModelSpec(name="host-probe", layers=layers, hidden_size=32,
                      ffn_hidden_size=64, num_heads=2 * tp_size, num_kv_heads=2 * tp_size,
                      vocab_size=64, seq_len=8, ffn=ffn)
        ranks = tuple(range(tp_size)) if tp_size > 1 else (0,)
        tp = TPGroup(rec, None, ranks, rank if tp_size > 1 else 0)
        blocks = torch.nn.Sequential(*(Block(m, tp, i, "none") for i in range(layers)))
        x = torch.randn(1, 8, m.hidden_size, requires_grad=True)

        def in_comm() -> float:
            return sum(e[7] - e[6] for e in rec.events)

        def fwd():                     # recording the graph, as a training forward does
            blocks(x)

        def fwd_bwd():
            blocks(x).sum().backward()

        def net(fn):
            def timed():
                rec.events.clear()
                t0 = time.perf_counter()
                fn()
                return time.perf_counter() - t0 - in_comm()
            return timed
        f = sync_cold(dist, torch, net(fwd), flush, samples=HOST_SAMPLES)
        fb = sync_cold(dist, torch, net(fwd_bwd), flush, samples=HOST_SAMPLES)
        key = ffn if tp_size == 1 else f"tp{tp_size}"
        res[key] = {"forward": f / layers, "backward": max(fb - f, 0.0) / layers}
    return res


def sync_cold(dist, torch, timed, flush, samples: int) -> float:
    """Median over ``samples`` single calls of ``timed`` (which returns its own net seconds),
    each after a barrier and a write over ``flush`` (untimed), every rank at the same time."""
    timed()
    out = []
    for _ in range(samples):
        dist.barrier()
        flush.fill_(1.0)
        out.append(timed())
    return statistics.median(out)
