"""``clusterplan calibrate gloo``: measure this machine as the simulator's ``localhost-gloo``.

Runs on the validation pool (:mod:`planner.measure.validate.runner`: spawned ranks, one thread each,
a rank that dies or hangs is named) and measures, with every rank doing the same work at the
same time (as in a step, so shared caches and memory bandwidth are loaded as they will be):

- **collectives** per kind and size (4 B to 16 MiB, ×4 steps; nccl-tests byte convention:
  per-rank buffer for all-reduce, broadcast and all-to-all, the full output of all-gather, the
  full input of reduce-scatter, the message of send/recv): a barrier, then k calls back to
  back (k = 32 at ≤ 64 KiB down to 1 at ≥ 2 MiB, so one barrier's skew between the ranks is
  spread over many calls, as a step issues them), the mean per call; per repetition the
  slowest rank's, then the median. Reduce-scatter and all-gather get
  tables of their own (gloo runs them 2-3× slower per byte than all-reduce).
- **compute on one core**: fp32 GEMMs shaped as a small transformer's (``F.linear`` forward
  and both backward products, with the weights, or the saved input, taken from a pool larger
  than the caches, as a step finds them) for the matmul efficiency curve, causal scaled-dot-product
  attention (forward, and backward as forward+backward minus forward) for the attention
  curves, charged the simulator's FLOPs (:func:`planner.model.llm.kernels.block_kernels`),
  elementwise adds of 4 KiB to 64 MiB for the memory curve, a one-element add for the per-op
  dispatch time; every rank runs the same loop at the same time, each result is the slowest
  rank's median;
- **wake-up after compute**: a small all-reduce issued after the rank computed for 0.1-10 ms
  costs up to ~2 ms more than one issued back to back (the process's gloo threads slept
  through the compute and are woken by the peer's data: 0.3 ms back to back, 0.7 ms after
  0.1-0.4 ms of GEMMs, 2.4 ms after 7 ms, measured here); the extra time per gap is recorded
  (``wake_penalty_s``) and charged by the simulator per call from the rank's idle time since
  its last communication;
- **host time** of the validation model's block (:class:`planner.measure.validate.model.Block`) at
  tiny sizes: eager PyTorch's dispatch and autograd per block, forward and backward; the
  median of 31 single passes of 8 blocks, each after the caches were swept (as in a real
  step, where GEMMs and collectives run between a block's host work);
- **lookups under the run's conditions**: one fused embedding kernel on every rank at once
  (:func:`planner.measure.validate.lookup_probe.time_lookup_probe`), whose ratio to the CPU
  embedding profile scales the lookups of validated DLRM plans;
- **TorchRec's reorder of column-wise pooled embeddings** (FBGEMM's permute, forward and
  backward) at a few shapes on every rank at once (:mod:`planner.measure.validate.dlrm_permute`);
- **a DLRM's linear layers by shape**: each of a layer's three GEMMs on a grid of batches and
  widths, every rank at once (:mod:`planner.measure.validate.dlrm_linear`), where the FLOP-keyed
  matmul curve misprices narrow layers on large batches.

Everything is measured ``rounds`` times (2 by default); the profile keeps the per-entry median
over rounds and records the spread between rounds beside it (``noise``). The machine's load
from other processes during the measurement is recorded too.
"""

from __future__ import annotations

import datetime
import os
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace

from simulator.gloo_profile import CommTable, gloo_profile_from_dict

from planner.machine import MMAP_THRESHOLD_BYTES, platform_description
from planner.measure.heap import DEFAULT_HEAP
from planner.measure.runner import init_group
from planner.measure.validate.calibrate_dlrm import (
    lookup_sections,
    measure_torchrec,
    merge_torchrec,
)
from planner.measure.validate.comm import Recorder
from planner.measure.validate.comm_timing import time_calls, time_comm
from planner.measure.validate.lookup_probe import time_lookup_probe
from planner.measure.validate.uneven_a2a import UNEVEN_BYTES, time_uneven_a2a, uneven_section
from planner.measure.validate.dlrm_linear import linear_section, time_linear_probe
from planner.measure.validate.dlrm_permute import permute_section, time_permute_probe
from planner.measure.validate.load import LoadMeter
from planner.measure.validate.runner import Pool
from planner.measure.validate.worker import pin_main_thread, unpin
from planner.model.llm.spec import ModelSpec

__all__ = ["GlooCalibration", "measure_gloo", "measure_gloo_raw", "profile_from_raw",
           "profile_document", "SIZES"]

SIZES = tuple(4 * 4 ** i for i in range(14))          # 4 B .. 256 MiB
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")
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


@dataclass(frozen=True, kw_only=True)
class GlooCalibration:
    """A calibration job for :func:`planner.measure.validate.runner.run` (picklable)."""

    world: int = 2
    rounds: int = 2
    repeats: int = 7
    min_sample_s: float = 0.002
    timeout_s: float = 60.0
    sizes: tuple = SIZES
    quick: bool = False                  # a few shapes only (tests): same document, coarser
    torchrec: bool = True                # TorchRec probe plans (calibrate_dlrm.py) if installed
    torchrec_rounds: int | None = None   # runs per probe (None: 2, 1 when quick)
    lookup: bool = True                  # the co-running lookup probe (calibrate_dlrm.py)
    linear: bool = True                  # DLRM layers' GEMMs by shape (dlrm_linear.py)
    heap: str = DEFAULT_HEAP             # the ranks' heap policy (planner/measure/heap.py)
    steps: int = 1                       # the runner's progress bar: one "step"
    warmup: int = 0
    trace_dir: str | None = None
    fault: object = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"world": self.world, "rounds": self.rounds, "repeats": self.repeats,
                "heap": self.heap}

    def rank_main(self, rank: int, rdzv: str, progress, report, state: dict) -> dict:
        return _rank_main(self, rank, rdzv, progress, report)


def _rank_main(cfg: GlooCalibration, rank: int, rdzv: str, progress, report) -> dict:

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)   # reduce_scatter_tensor's rename
    init_group("gloo", rank, cfg.world, rdzv, cfg.timeout_s)
    report("ready", None)
    pin_main_thread(rank)
    out = {"rank": rank, "comm": {}, "compute": {}, "host": {}, "cpu": []}
    t_cpu0, w0 = _proc_cpu(), time.monotonic()
    for rnd in range(cfg.rounds):
        def note(what: str, rnd: int = rnd) -> None:
            """Publish progress: a phase may run minutes with 4 processes on 2 cores (one
            round of the collective sweep took over 75 s on a slower VM), and the runner
            takes a rank silent past its timeout for a hung one."""
            progress.begin(rank, f"{what} round {rnd}", rnd)
            progress.end(rank)
        for kind in KINDS:
            for size in cfg.sizes:
                note(f"{kind} {size} B")
                out["comm"][(rnd, kind, size)] = time_comm(dist, torch, kind, size, cfg.world,
                                                           rank, cfg.repeats)
        note("uneven all-to-all")
        out.setdefault("uneven", {})[rnd] = time_uneven_a2a(
            dist, torch, rank, cfg.world, repeats=3 if cfg.quick else 5,
            sizes=UNEVEN_BYTES[:1] if cfg.quick else UNEVEN_BYTES)
        out["compute"][rnd] = _time_compute(dist, torch, _compute_sample_s(cfg), quick=cfg.quick,
                                            note=note)
        if cfg.linear and rnd == cfg.rounds - 1:     # one round: 273 GEMMs, 3 samples each
            note("linear-layer probes")
            min_s = _compute_sample_s(cfg)
            out.setdefault("linear", {})[rnd] = time_linear_probe(
                torch, lambda fn: _sync_time(dist, torch, fn, min_s), quick=cfg.quick)
        note("host probes")
        out["host"][rnd] = _time_host(dist, torch, cfg.world, rank)
        note("wake probes")
        out.setdefault("wake", {})[rnd] = _time_wake(dist, torch)
        if cfg.lookup:
            note("lookup probe")
            out.setdefault("lookup", {})[rnd] = time_lookup_probe(
                dist, repeats=3 if cfg.quick else 9, pairs=1 if cfg.quick else 3)
            note("permute probe")
            out.setdefault("permute", {})[rnd] = time_permute_probe(
                dist, repeats=3 if cfg.quick else 7)
    out["cpu"] = [_proc_cpu() - t_cpu0, time.monotonic() - w0]
    dist.barrier()
    dist.destroy_process_group()
    unpin()
    return out


def _proc_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _loop_length(dist, torch, one_s: float, min_s: float) -> int:
    """Calls per timed loop, the same on every rank: enough for ``min_s`` on the slowest."""
    k = torch.tensor([max(1, int(min_s / max(one_s, 1e-7)))])
    dist.all_reduce(k, op=dist.ReduceOp.MAX)
    return int(k)


def _compute_sample_s(cfg: GlooCalibration) -> float:
    """Shortest loop per compute sample: ``min_sample_s``, or ten times it when there are more
    processes than cores, so that every loop spans several scheduler slices and measures the
    share of a core a rank gets while all compute (a 2 ms loop often runs in one slice, at a
    whole core's speed, which a 100 ms step never does)."""
    cores = os.cpu_count() or 1
    return cfg.min_sample_s * (10.0 if cfg.world > cores else 1.0)


def _sync_time(dist, torch, fn, min_s: float, samples: int = 3) -> float:
    """Seconds per call of ``fn`` with every rank running it at the same time: the same loop
    length k on every rank (calls for at least ``min_s``), a barrier before each of
    ``samples`` loops, the median loop's mean per call."""
    fn()
    t0 = time.perf_counter()
    fn()
    k = _loop_length(dist, torch, time.perf_counter() - t0, min_s)
    return statistics.median(time_calls(dist, fn, repeats=samples, calls=k, warmup=0))


def _time_compute(dist, torch, min_s: float, *, quick: bool = False, note=None) -> dict:
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
                    rows["matmul"].append((flops, _sync_time(dist, torch, fn, min_s)))
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
                tf = _sync_time(dist, torch, fwd, min_s)
                tfb = _sync_time(dist, torch, fwd_bwd, min_s)
                rows["attention"].append((flops, tf))
                rows["attention_backward"].append((2.5 * flops, max(tfb - tf, 1e-7)))
    note("memory probes")
    for nbytes in pick(MEMORY_BYTES):
        a, b = torch.ones(nbytes // 4), torch.ones(nbytes // 4)
        c = torch.empty_like(a)
        rows["memory"].append((3.0 * nbytes, _sync_time(dist, torch,
                                                        lambda: torch.add(a, b, out=c), min_s)))
    for nbytes in pick(FRESH_BYTES):
        note("new-tensor probes")
        keep = torch.empty(nbytes // 4)
        reuse = _sync_time(dist, torch, lambda: keep.fill_(1.0), min_s)
        fresh = _sync_time(dist, torch, lambda: torch.empty(nbytes // 4).fill_(1.0), min_s)
        rows["fresh"].append((float(nbytes), fresh, reuse))
        del keep
    one, two, out = torch.ones(1), torch.ones(1), torch.empty(1)
    rows["launch"].append(_sync_time(dist, torch, lambda: torch.add(one, two, out=out), min_s))
    return rows


def _time_wake(dist, torch, *, iters: int = 40) -> list:
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


def _time_host(dist, torch, world: int, rank: int, *, layers: int = 8) -> dict:
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
        f = _sync_cold(dist, torch, net(fwd), flush, samples=HOST_SAMPLES)
        fb = _sync_cold(dist, torch, net(fwd_bwd), flush, samples=HOST_SAMPLES)
        key = ffn if tp_size == 1 else f"tp{tp_size}"
        res[key] = {"forward": f / layers, "backward": max(fb - f, 0.0) / layers}
    return res


def _sync_cold(dist, torch, timed, flush, samples: int) -> float:
    """Median over ``samples`` single calls of ``timed`` (which returns its own net seconds),
    each after a barrier and a write over ``flush`` (untimed), every rank at the same time."""
    timed()
    out = []
    for _ in range(samples):
        dist.barrier()
        flush.fill_(1.0)
        out.append(timed())
    return statistics.median(out)


def _median_rel_spread(values: list[float]) -> float:
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def profile_document(ranks: list[dict], cfg: GlooCalibration, *, load: dict | None = None
                     ) -> dict:
    """The profile mapping (``format: clusterplan.gloo-profile``) from the ranks' raw rows."""
    world, rounds = cfg.world, cfg.rounds
    comm, noise_comm = {}, {}
    for kind in KINDS:
        rows = []
        spreads = []
        for size in cfg.sizes:
            per_round = []
            for rnd in range(rounds):
                reps = zip(*(r["comm"][(rnd, kind, size)] for r in ranks))
                per_round.append(statistics.median(max(rep) for rep in reps))
            rows.append([float(_bytes(kind, size, world)), _sig(statistics.median(per_round))])
            spreads.append(_median_rel_spread(per_round))
        # sizes rounded to a multiple of the world can coincide (4 and 8 B on 4 ranks): keep
        # the first of each, so the table's sizes increase
        rows = [r for i, r in enumerate(rows) if i == 0 or r[0] > rows[i - 1][0]]
        # a size measured no slower than a larger one keeps the table monotone in time
        for i in range(len(rows) - 2, -1, -1):
            rows[i][1] = min(rows[i][1], rows[i + 1][1])
        comm[f"{kind}@{world}"] = rows
        noise_comm[kind] = {"median": _sig(statistics.median(spreads)),
                            "max": _sig(max(spreads))}
    # compute: per round the slowest rank's time (they ran side by side), median over rounds
    def merged(key: str):
        out = []
        n = len(ranks[0]["compute"][0][key])
        for i in range(n):
            per_round = [max(r["compute"][rnd][key][i][1] if key != "launch"
                             else r["compute"][rnd][key][i] for r in ranks)
                         for rnd in range(rounds)]
            size = ranks[0]["compute"][0][key][i][0] if key != "launch" else 0.0
            out.append((size, statistics.median(per_round), _median_rel_spread(per_round)))
        return out
    launch = merged("launch")[0][1]
    mm = merged("matmul")
    def net(t: float) -> float:        # an op's time without its dispatch (at least half)
        return max(t - launch, 0.5 * t)
    rates = [(f, f / net(t)) for f, t, _ in mm]
    peak = max(r for _, r in rates)
    by_flops: dict[float, list[float]] = {}
    for f, r in rates:
        by_flops.setdefault(f, []).append(r / peak)
    matmul_curve = [[f, _sig(statistics.median(v), 3)] for f, v in sorted(by_flops.items())]
    attn = {}
    for key in ("attention", "attention_backward"):
        by: dict[float, list[float]] = {}
        for f, t, _ in merged(key):
            by.setdefault(f, []).append(f / net(t) / peak)
        attn[key] = [[f, _sig(min(1.0, statistics.median(v)), 3)] for f, v in sorted(by.items())]
    mem = merged("memory")
    mrates = [(b, b / net(t)) for b, t, _ in mem]
    mpeak = max(r for _, r in mrates)
    memory_curve = [[b, _sig(r / mpeak, 3)] for b, r in mrates]
    host, host_rounds = {}, {}
    for key in ranks[0]["host"][0]:
        per = {k: [max(r["host"][rnd][key][k] for r in ranks) for rnd in range(rounds)]
               for k in ("forward", "backward")}
        host[key] = {k: _sig(statistics.median(v)) for k, v in per.items()}
        host_rounds[key] = {k: [_sig(x) for x in v] for k, v in per.items()}
    # wake-up: per gap the slowest rank's extra time, minus the back-to-back call's time;
    # single points are noisy (the ranks' skew after a long segment varies from run to run),
    # so a line extra = a + b·gap (a, b ≥ 0) is fitted through them and written at the gaps
    probe = CommTable("allreduce", world, tuple(r[0] for r in comm[f"allreduce@{world}"]),
                      tuple(r[1] for r in comm[f"allreduce@{world}"])).time_s(WAKE_PROBE_BYTES)
    raw = []
    for i in range(len(WAKE_SEGMENTS)):
        gap = statistics.median(max(r["wake"][rnd][i][0] for r in ranks) for rnd in range(rounds))
        extra = statistics.median(max(r["wake"][rnd][i][1] for r in ranks)
                                  for rnd in range(rounds))
        raw.append([_sig(gap), _sig(max(0.0, extra - probe))])
    raw.sort()
    wake = [[g, _sig(e)] for g, e in _nonneg_line(raw)]
    cpu_used = sum(r["cpu"][0] for r in ranks)
    wall = max(r["cpu"][1] for r in ranks)
    return {
        "format": "clusterplan.gloo-profile",
        "version": 1,
        "what": "torch.distributed gloo on this machine, measured by clusterplan calibrate gloo",
        "measured": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                     "machine": _machine(), "processes": world, "threads_per_process": 1,
                     "heap": cfg.heap,
                     "rounds": rounds, "repeats": cfg.repeats, "wall_s": _sig(wall),
                     "our_cpu_s": _sig(cpu_used), **(load or {})},
        "shared_core": True,
        "comm": comm,
        "wake_penalty_s": wake,
        "wake_penalty_measured_s": raw,
        "compute": {"peak_fp32_flops": _sig(peak), "memory_bandwidth_Bps": _sig(mpeak),
                    "launch_overhead_s": _sig(launch),
                    "matmul_fp32": matmul_curve, "memory": memory_curve,
                    "attention_fp32": attn["attention"],
                    "attention_backward_fp32": attn["attention_backward"]},
        **(lookup_sections([r["lookup"] for r in ranks], world, os.cpu_count() or 1)
           if "lookup" in ranks[0] else {}),
        **({"permute_pooled": permute_section([r["permute"] for r in ranks])}
           if "permute" in ranks[0] else {}),
        **({"linear_layers": linear_section([r["linear"] for r in ranks])}
           if "linear" in ranks[0] else {}),
        **(uneven_section([r["uneven"] for r in ranks]) if "uneven" in ranks[0] else {}),
        **({"fresh_alloc": _fresh_section(ranks, rounds)}
           if ranks[0]["compute"][0].get("fresh") else {}),
        "host_block_s": host["swiglu"],
        "host_block_gelu_s": host["gelu"],
        f"host_block_tp{world}_s": host[f"tp{world}"],
        "noise": {"what": "relative spread (max-min)/median between rounds, per entry",
                  "comm": noise_comm,
                  "matmul": {"median": _sig(statistics.median(s for *_, s in mm)),
                             "max": _sig(max(s for *_, s in mm))},
                  "memory": {"median": _sig(statistics.median(s for *_, s in mem)),
                             "max": _sig(max(s for *_, s in mem))},
                  "host": {key: {k: _sig(_median_rel_spread(v)) for k, v in per.items()}
                           for key, per in host_rounds.items()},
                  "host_rounds_s": host_rounds},
    }


def _nonneg_line(points: list) -> list:
    """Least-squares a + b·x through (x, y) points with a, b ≥ 0, evaluated at each x."""
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else 0.0
    a = my - b * mx
    if a < 0:                               # through the origin instead
        a, b = 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return [(x, a + b * x) for x in xs]


def _fresh_section(ranks: list[dict], rounds: int) -> dict:
    """Page-fault cost of new tensors: per size the slowest rank's extra time of a new tensor
    over a reused one (median over rounds), and the bytes per second above the mmap threshold."""
    points = []
    for i, row in enumerate(ranks[0]["compute"][0]["fresh"]):
        extra = statistics.median(max(r["compute"][rnd]["fresh"][i][1]
                                      - r["compute"][rnd]["fresh"][i][2] for r in ranks)
                                  for rnd in range(rounds))
        points.append([row[0], _sig(max(0.0, extra))])
    above = [b / e for b, e in points if b > MMAP_THRESHOLD_BYTES and e > 0]
    return {"what": "extra seconds of torch.empty(n).fill_ over filling a kept tensor, by bytes",
            "threshold_bytes": MMAP_THRESHOLD_BYTES, "points": points,
            "Bps": _sig(statistics.median(above)) if above else None}


def _bytes(kind: str, size: int, world: int) -> int:
    n = max(1, size // 4)
    if kind in ("allgather", "reducescatter", "alltoall"):
        n = max(world, n - n % world)
    return 4 * n


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _machine() -> dict:
    """This machine as the other measurements describe it, plus the torch version."""
    import torch

    return {**platform_description(), "torch": str(torch.__version__)}


def measure_gloo_raw(cfg: GlooCalibration | None = None, *, pool=None) -> dict:
    """Run the calibration (on ``pool`` when given) and return its raw parts: the ranks' rows,
    the TorchRec probes section (or None) and the cores other processes used meanwhile.
    :func:`profile_from_raw` makes the profile of one or several such runs."""
    cfg = cfg or GlooCalibration()
    meter = LoadMeter()

    def both(p):
        # TorchRec probe plans on the same ranks, right after (planner/measure/validate/calibrate_dlrm.py)
        return p.run(cfg), (measure_torchrec(p, cfg.world, quick=cfg.quick,
                                             rounds=cfg.torchrec_rounds)
                            if cfg.torchrec else None)
    if pool is None:
        with Pool(cfg.world, cfg.heap) as p:
            res, torchrec = both(p)
    else:
        res, torchrec = both(pool)
    return {"cfg": cfg, "ranks": sorted(res.ranks, key=lambda r: r["rank"]),
            "torchrec": torchrec, "other_cores": meter.other_cores()}


def _renumbered(rank_rows: list[dict], rounds: list[int]) -> dict:
    """One rank's rows of several runs as one run's, rounds numbered on from run to run."""
    out = {"rank": rank_rows[0]["rank"], "comm": {}, "compute": {}, "host": {}, "wake": {},
           "cpu": [0.0, 0.0]}
    base = 0
    for rows, n in zip(rank_rows, rounds):
        for (rnd, kind, size), v in rows["comm"].items():
            out["comm"][(base + rnd, kind, size)] = v
        for key in ("compute", "host", "wake", "lookup", "permute", "uneven", "linear"):
            for rnd, v in rows.get(key, {}).items():
                out.setdefault(key, {})[base + rnd] = v
        out["cpu"] = [a + b for a, b in zip(out["cpu"], rows["cpu"])]
        base += n
    return out


def profile_from_raw(raws: list[dict]) -> dict:
    """The profile mapping of one or several :func:`measure_gloo_raw` runs of the same
    calibration (several: each run's rounds count as rounds of one calibration, so runs spread
    over a benchmark average the machine's slow and fast spells as its measurements do)."""
    if not raws:
        raise ValueError("profile_from_raw needs at least one run")
    rounds = [r["cfg"].rounds for r in raws]
    cfg = replace(raws[0]["cfg"], rounds=sum(rounds))
    ranks = [_renumbered([r["ranks"][i] for r in raws], rounds)
             for i in range(len(raws[0]["ranks"]))]
    other = statistics.fmean(r["other_cores"] for r in raws)
    doc = profile_document(ranks, cfg, load={"other_cores": _sig(other, 3),
                                             "runs": len(raws)})
    torchrec = merge_torchrec([r["torchrec"] for r in raws if r["torchrec"] is not None])
    if torchrec is not None:
        doc["torchrec"] = torchrec
    gloo_profile_from_dict(doc)          # what we write must load
    return doc


def measure_gloo(cfg: GlooCalibration | None = None, *, pool=None) -> dict:
    """Run the calibration (on ``pool`` when given) and return the profile mapping; the load
    of other processes during it is recorded (``measured.other_cores``)."""
    return profile_from_raw([measure_gloo_raw(cfg, pool=pool)])
