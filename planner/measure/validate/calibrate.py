"""``clusterplan calibrate gloo``: measure this machine as the simulator's ``localhost-gloo``.

Runs on the validation pool (:mod:`planner.measure.validate.runner`: spawned ranks, one thread each,
a rank that dies or hangs is named) and measures, with every rank doing the same work at the
same time (as in a step, so shared caches and memory bandwidth are loaded as they will be):

- **collectives** per kind and size (4 B to 256 MiB, ×4 steps; nccl-tests byte convention:
  per-rank buffer for all-reduce, broadcast and all-to-all, the full output of all-gather, the
  full input of reduce-scatter, the message of send/recv): a barrier, then k calls back to
  back (k = 32 at ≤ 64 KiB down to 1 at ≥ 2 MiB, so one barrier's skew between the ranks is
  spread over many calls, as a step issues them), the mean per call; per repetition the
  slowest rank's, then the median. Reduce-scatter and all-gather get
  tables of their own (gloo runs them 2-3× slower per byte than all-reduce). ``alltoallv`` is
  the all-to-all TorchRec makes (split lists: another gloo code path), keyed by the bytes a
  rank sends to the *other* ranks, as a plan's byte matrix counts them: on 2 processes the
  equal call's table, keyed by its whole buffer, priced those calls 26-40% low.
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
from planner.measure.validate.comm_timing import alltoallv_chunk, time_comm
from planner.measure.validate.core_probes import (
    WAKE_PROBE_BYTES,
    WAKE_SEGMENTS,
    sync_time,
    time_compute,
    time_host,
    time_wake,
)
from planner.measure.validate.lookup_probe import time_lookup_probe
from planner.measure.validate.uneven_a2a import UNEVEN_BYTES, time_uneven_a2a, uneven_section
from planner.measure.validate.dlrm_linear import linear_section, time_linear_probe
from planner.measure.validate.dlrm_permute import permute_section, time_permute_probe
from planner.measure.validate.load import LoadMeter
from planner.measure.validate.runner import Pool
from planner.measure.validate.worker import pin_main_thread, unpin

__all__ = ["GlooCalibration", "measure_gloo", "measure_gloo_raw", "profile_from_raw",
           "profile_document", "SIZES"]

SIZES = tuple(4 * 4 ** i for i in range(14))          # 4 B .. 256 MiB
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "broadcast",
         "sendrecv")


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
        out["compute"][rnd] = time_compute(dist, torch, _compute_sample_s(cfg), quick=cfg.quick,
                                            note=note)
        if cfg.linear and rnd == cfg.rounds - 1:     # one round: 273 GEMMs, 3 samples each
            note("linear-layer probes")
            min_s = _compute_sample_s(cfg)
            out.setdefault("linear", {})[rnd] = time_linear_probe(
                torch, lambda fn: sync_time(dist, torch, fn, min_s), quick=cfg.quick)
        note("host probes")
        out["host"][rnd] = time_host(dist, torch, cfg.world, rank)
        note("wake probes")
        out.setdefault("wake", {})[rnd] = time_wake(dist, torch)
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


def _compute_sample_s(cfg: GlooCalibration) -> float:
    """Shortest loop per compute sample: ``min_sample_s``, or ten times it when there are more
    processes than cores, so that every loop spans several scheduler slices and measures the
    share of a core a rank gets while all compute (a 2 ms loop often runs in one slice, at a
    whole core's speed, which a 100 ms step never does)."""
    cores = os.cpu_count() or 1
    return cfg.min_sample_s * (10.0 if cfg.world > cores else 1.0)


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
    """The bytes a ``kind`` probe of ``size`` moved, in its table's convention."""
    if kind == "alltoallv":
        return 4 * alltoallv_chunk(size, world) * (world - 1)
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
