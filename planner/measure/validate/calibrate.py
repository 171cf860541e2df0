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
  embedding profile scales the lookups of validated DLRM plans; also read between the stages
  of every round (:class:`~planner.measure.validate.lookup_probe.ProbeSeries`), because a
  shared VM's cores switch speed within seconds and a plan's measured steps (seconds of them)
  span several switches: the profile keeps the mean of all readings;
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

import os
import time
import warnings
from dataclasses import dataclass, field

from planner.measure.heap import DEFAULT_HEAP
from planner.measure.runner import init_group
from planner.measure.validate.calibrate_dlrm import measure_torchrec
from planner.measure.validate.calibrate_profile import KINDS, profile_from_raw
from planner.measure.validate.comm_timing import time_comm
from planner.measure.validate.core_probes import sync_time, time_compute, time_host, time_wake
from planner.measure.validate.dlrm_linear import time_linear_probe
from planner.measure.validate.dlrm_permute import time_permute_probe
from planner.measure.validate.load import LoadMeter
from planner.measure.validate.lookup_probe import ProbeSeries, time_lookup_probe
from planner.measure.validate.runner import Pool
from planner.measure.validate.uneven_a2a import UNEVEN_BYTES, time_uneven_a2a
from planner.measure.validate.rank_steps import pin_main_thread, unpin

__all__ = ["GlooCalibration", "measure_gloo", "measure_gloo_raw", "SIZES"]

SIZES = tuple(4 * 4 ** i for i in range(14))          # 4 B .. 256 MiB


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
    series = ProbeSeries(dist, enabled=cfg.lookup)
    for rnd in range(cfg.rounds):
        def note(what: str, rnd: int = rnd) -> None:
            """Publish progress: a phase may run minutes with 4 processes on 2 cores (one
            round of the collective sweep took over 75 s on a slower VM), and the runner
            takes a rank silent past its timeout for a hung one."""
            progress.begin(rank, f"{what} round {rnd}", rnd)
            progress.end(rank)
        series.sample(rnd)
        for kind in KINDS:
            for size in cfg.sizes:
                note(f"{kind} {size} B")
                out["comm"][(rnd, kind, size)] = time_comm(dist, torch, kind, size, cfg.world,
                                                           rank, cfg.repeats)
            if not cfg.quick:
                series.sample(rnd)
        note("uneven all-to-all")
        out.setdefault("uneven", {})[rnd] = time_uneven_a2a(
            dist, torch, rank, cfg.world, repeats=3 if cfg.quick else 5,
            sizes=UNEVEN_BYTES[:1] if cfg.quick else UNEVEN_BYTES)
        out["compute"][rnd] = time_compute(dist, torch, _compute_sample_s(cfg), quick=cfg.quick,
                                            note=note)
        series.sample(rnd)
        if cfg.linear and rnd == cfg.rounds - 1:     # one round: 273 GEMMs, 3 samples each
            note("linear-layer probes")
            min_s = _compute_sample_s(cfg)
            out.setdefault("linear", {})[rnd] = time_linear_probe(
                torch, lambda fn: sync_time(dist, torch, fn, min_s), quick=cfg.quick)
        note("host probes")
        out["host"][rnd] = time_host(dist, torch, cfg.world, rank)
        note("wake probes")
        out.setdefault("wake", {})[rnd] = time_wake(dist, torch)
        if not cfg.quick:
            series.sample(rnd)
        if cfg.lookup:
            note("lookup probe")
            out.setdefault("lookup", {})[rnd] = time_lookup_probe(
                dist, repeats=3 if cfg.quick else 9, pairs=1 if cfg.quick else 3)
            note("permute probe")
            out.setdefault("permute", {})[rnd] = time_permute_probe(
                dist, repeats=3 if cfg.quick else 7)
    if cfg.lookup:
        out["lookup_series"] = series.readings
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


def measure_gloo_raw(cfg: GlooCalibration | None = None, *, pool=None) -> dict:
    """Run the calibration (on ``pool`` when given) and return its raw parts: the ranks' rows,
    the TorchRec probes section (or None) and the cores other processes used meanwhile.
    :func:`~planner.measure.validate.calibrate_profile.profile_from_raw` makes the profile of
    one or several such runs."""
    cfg = cfg or GlooCalibration()
    meter = LoadMeter()

    def both(p):
        # TorchRec probe plans on the same ranks, right after (calibrate_dlrm.py)
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


def measure_gloo(cfg: GlooCalibration | None = None, *, pool=None) -> dict:
    """Run the calibration (on ``pool`` when given) and return the profile mapping; the load
    of other processes during it is recorded (``measured.other_cores``)."""
    return profile_from_raw([measure_gloo_raw(cfg, pool=pool)])
