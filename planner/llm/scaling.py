"""MFU against GPU count, and the share of each mechanism that makes it fall with scale.

A step simulated on a perfect cluster runs about as fast on 16,384 GPUs as on 256 when the
work per GPU stays the same. Real runs lose MFU as they grow, and four mechanisms here say why,
each switchable and each from a stated source, none a fitted multiplier:

``ecmp``
    Switches hash each flow onto one equal-cost uplink, so flows collide on some uplinks while
    others idle (:class:`~simulator.topology.model.Routing`; off: ideal spreading).
``variability``
    GPUs of one SKU differ in speed and a synchronous step waits for the slowest of each group
    (:class:`~planner.model.variability.GpuVariability`; off: every GPU the median one).
``stalls``
    Every process pauses now and then (unsynchronised garbage collection) and the step waits
    for the longest pause (:class:`~planner.model.variability.HostStalls`; off: none).
``exposed``
    Trainers that reduce gradients after the backward or block on pipeline sends expose that
    communication (``trainer:`` ``grad_reduce``, ``pp_comm_overlap``; off: both overlapped).

Weak scaling: tp, cp and pp stay as the layout states and dp grows to fill the GPUs. The batch
either keeps its sequences per DP replica (``per-replica``, the default: the global batch grows
with dp) or keeps its global size (``fixed``: fewer micro-batches per replica as dp grows).

Attribution is leave-one-out: the step with every chosen mechanism on, and for each mechanism
the step with all the others on and that one off; its loss is the difference. Mechanisms that
interact (a slower stage hides more of a slower reduction) make the losses not add up to the
total; the remainder is reported as ``interaction``. Stochastic mechanisms (ECMP hash seeds,
GPU draws) are averaged over ``samples`` seeds, the same seeds in every configuration (common
random numbers), and host stalls are added to the simulated step (they sit at the step's
synchronisation points, outside the op graph). With ``ecmp`` on, every configuration runs the
explicit flow mode (hashed routes need it), so no difference comes from the mode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.errors import SpecError
from simulator.topology import Routing, Topology, load_topology

from planner.llm.metrics import LLMResult, simulate_llm
from planner.model.llm.layout import Layout
from planner.model.llm.spec import LLMSpec, ParallelSpec
from planner.model.variability import GpuVariability, HostStalls, layout_coords

__all__ = ["BATCH_POLICIES", "MECHANISMS", "ScalingSetup", "run_scaling", "stage_slowdown"]

MECHANISMS = ("ecmp", "variability", "stalls", "exposed")
BATCH_POLICIES = ("per-replica", "fixed")


@dataclass(frozen=True, kw_only=True)
class ScalingSetup:
    """What :func:`run_scaling` sweeps.

    ``spec`` carries the trainer; ``topology`` is a topology reference resized to each GPU
    count; ``parallel`` gives tp, cp, pp, vpp, fsdp and ep (its dp is ignored); ``per_replica``
    is the sequences per DP replica (``per-replica`` batch; None: the spec's global batch over
    the dp of the smallest GPU count). ``routing`` holds the ECMP settings (its seed is the
    first sample's); ``variability`` and ``stalls`` the distributions (their seeds likewise).
    """

    spec: LLMSpec
    topology: str
    gpus: tuple[int, ...]
    parallel: ParallelSpec
    mechanisms: tuple[str, ...] = MECHANISMS
    batch: str = "per-replica"
    per_replica: int | None = None
    routing: Routing = field(default_factory=lambda: Routing(mode="ecmp"))
    variability: GpuVariability = field(default_factory=GpuVariability)
    stalls: HostStalls = field(default_factory=HostStalls)
    samples: int = 4
    order: str = "tp-cp-dp-pp"
    schedule: str = "1f1b"
    mode: str = "auto"

    def __post_init__(self) -> None:
        bad = [m for m in self.mechanisms if m not in MECHANISMS]
        if bad:
            raise SpecError(f"unknown mechanism {bad[0]!r}", field="--mechanisms",
                            fix=f"use some of: {', '.join(MECHANISMS)}")
        if self.batch not in BATCH_POLICIES:
            raise SpecError(f"unknown batch policy {self.batch!r}", field="--batch",
                            fix=f"use one of: {', '.join(BATCH_POLICIES)}")
        if not self.gpus or min(self.gpus) < 1 or self.samples < 1:
            raise SpecError("give at least one positive GPU count and one sample",
                            field="--gpus", fix="write e.g. --gpus 256,512,1024")


def stage_slowdown(var: GpuVariability, layout: Layout, topo: Topology) -> dict[int, float]:
    """Per pipeline stage, its slowest GPU and that GPU's factor (rank → factor).

    A stage's TP/CP group waits for its slowest member at every block and the gradient
    reduction waits for every replica, so the stage runs at the slowest factor among all its
    GPUs; :func:`~planner.llm.metrics.simulate_llm` applies the largest factor it is given
    per stage to the stage's representative, so one rank per stage says it all."""
    ranks = np.arange(layout.world)
    if topo.hierarchy is not None:
        node = topo.hierarchy.node_of_gpu[ranks]
    else:
        node = np.array([topo.node_of(int(r)) for r in ranks])
    _, first, inverse = np.unique(node, return_index=True, return_inverse=True)
    f = var.factors(layout, ranks, ranks[first][inverse])
    pp = layout_coords(layout, ranks)["pp"]
    out = {}
    for s in range(layout.pp):
        idx = np.flatnonzero(pp == s)
        i = int(idx[np.argmax(f[idx])])
        out[i] = float(f[i])
    return out


class _Point:
    """One GPU count of the sweep: its spec, layout and topologies, and the simulated step
    time of each set of mechanisms (memoised: leave-one-out configurations repeat)."""

    def __init__(self, setup: ScalingSetup, n: int, per_replica: int) -> None:
        self.setup, self.n = setup, n
        p = setup.parallel
        mp = p.tp * p.cp * p.pp
        if n % mp:
            raise SpecError(f"tp·cp·pp = {mp} does not divide {n} GPUs", field="--gpus",
                            fix=f"use GPU counts that are multiples of {mp}")
        self.parallel = replace(p, dp=n // mp)
        dp = self.parallel.dp
        t = setup.spec.training
        gb = per_replica * dp if setup.batch == "per-replica" else t.global_batch_size
        self.spec = replace(setup.spec, training=replace(t, global_batch_size=gb))
        self.layout = Layout(p.tp, p.cp, dp, p.pp, setup.order)
        self.ideal = load_topology(setup.topology, gpus=n,
                                   overrides={"network": {"routing": "ideal"}})
        self.hashed = None
        if "ecmp" in setup.mechanisms:
            r = setup.routing
            net = {"routing": "ecmp", "qps": r.qps, "hash_seed": r.seed}
            if r.port_Bps:
                net["port_bandwidth"] = r.port_Bps
            self.hashed = load_topology(setup.topology, gpus=n, overrides={"network": net})
        # hashed routes always run explicit; the runs they are compared with do the same
        self.mode = "explicit" if setup.mode == "auto" and self.hashed is not None \
            else setup.mode
        self.sims: dict[frozenset, list[LLMResult]] = {}
        self.stall_s = setup.stalls.sampled_stall_s(self.layout, np.arange(n)) \
            if "stalls" in setup.mechanisms else 0.0

    def results(self, on: frozenset) -> list[LLMResult]:
        """Simulated steps with the mechanisms ``on`` (stalls excluded), one per sample
        (a single one when nothing in ``on`` is random)."""
        key = on - {"stalls"}
        if key not in self.sims:
            s = self.setup
            random = bool(key & {"ecmp", "variability"})
            spec = self.spec
            if "exposed" not in key:
                spec = replace(spec, trainer=replace(spec.trainer, grad_reduce="overlapped",
                                                     pp_comm_overlap=True))
            out = []
            for k in range(s.samples if random else 1):
                topo = self.ideal
                if "ecmp" in key:
                    topo = replace(self.hashed, routing=replace(self.hashed.routing,
                                                                seed=s.routing.seed + k))
                slow = stage_slowdown(replace(s.variability, seed=s.variability.seed + k),
                                      self.layout, topo) if "variability" in key else None
                out.append(simulate_llm(spec, self.parallel, topo, mode=self.mode,
                                        order=s.order, schedule_name=s.schedule, slowdown=slow))
            self.sims[key] = out
        return self.sims[key]

    def step_s(self, on: frozenset) -> float:
        """Mean step time (s) with the mechanisms ``on``, host stalls added when on."""
        t = float(np.mean([r.step_time_s for r in self.results(on)]))
        return t + (self.stall_s if "stalls" in on else 0.0)


def _row(pt: _Point) -> dict:
    """The sweep's row for one GPU count: step time and MFU with every mechanism on, without
    any, and each mechanism's leave-one-out loss."""
    mech = pt.setup.mechanisms
    on = frozenset(mech)
    base = pt.results(frozenset())[0]
    t_base = base.step_time_s
    d = base.to_dict()
    t_all = pt.step_s(on)

    def mfu(t: float) -> float:
        """MFU of a step of ``t`` seconds: same FLOPs and GPUs in every configuration."""
        return d["mfu"] * t_base / t
    losses = {}
    for m in mech:
        t_off = pt.step_s(on - {m})
        losses[m] = {"step_time_without_s": t_off, "loss_s": t_all - t_off,
                     "loss_mfu_points": 100 * (mfu(t_off) - mfu(t_all))}
    total = t_all - t_base
    for v in losses.values():
        v["share_of_loss"] = v["loss_s"] / total if total > 0 else 0.0
    first = pt.results(on)[0]
    samples = [r.step_time_s + pt.stall_s * ("stalls" in on) for r in pt.results(on)]
    return {
        "gpus": pt.n, "parallel": d["parallel"], "global_batch_size": d["global_batch_size"],
        "microbatches": d["microbatches"], "step_time_s": t_all, "mfu": mfu(t_all),
        "mfu_megatron": d["mfu_megatron"] * t_base / t_all,
        "step_time_samples_s": samples,
        "baseline": {"step_time_s": t_base, "mfu": d["mfu"]},
        "mechanisms": losses,
        "interaction_s": total - sum(v["loss_s"] for v in losses.values()),
        "interaction_mfu_points": 100 * (d["mfu"] - mfu(t_all))
        - sum(v["loss_mfu_points"] for v in losses.values()),
        "host_stall_s": pt.stall_s,
        "stage_slowdown_sample0": first.plan.info.get("stragglers", {}),
        "breakdown_sample0": first.breakdown(),
        "simulation_mode": first.sim.mode,
        "memory_fits": bool(base.memory.fits),
    }


def run_scaling(setup: ScalingSetup, advance: Callable[[int], None] | None = None) -> dict:
    """Sweep ``setup.gpus``; one row per GPU count (:func:`_row`), plus what was assumed.
    ``advance(1)`` is called after each GPU count (progress)."""
    p = setup.parallel
    gpus = tuple(sorted(set(setup.gpus)))
    per_replica = setup.per_replica
    if setup.batch == "per-replica" and per_replica is None:
        dp0 = gpus[0] // (p.tp * p.cp * p.pp)
        per_replica = max(1, setup.spec.training.global_batch_size // max(1, dp0))
    rows = []
    for n in gpus:
        rows.append(_row(_Point(setup, n, per_replica or 0)))
        if advance:
            advance(1)
    mech = setup.mechanisms
    return {
        "model": setup.spec.model.name, "topology": setup.topology,
        "trainer": setup.spec.trainer.to_dict(),
        "layout": {"tp": p.tp, "cp": p.cp, "pp": p.pp, "vpp": p.vpp, "fsdp": p.fsdp,
                   "ep": p.ep, "order": setup.order, "dp": "grown to fill the GPUs"},
        "batch": {"policy": setup.batch, "sequences_per_replica": per_replica,
                  "global_batch_size": None if setup.batch == "per-replica"
                  else setup.spec.training.global_batch_size},
        "mechanisms": list(mech),
        "settings": {"ecmp": setup.routing.to_dict() if "ecmp" in mech else None,
                     "variability": setup.variability.to_dict() if "variability" in mech
                     else None,
                     "stalls": setup.stalls.to_dict() if "stalls" in mech else None,
                     "exposed": {"grad_reduce": setup.spec.trainer.grad_reduce,
                                 "pp_comm_overlap": setup.spec.trainer.pp_comm_overlap}
                     if "exposed" in mech else None},
        "samples": setup.samples,
        "attribution": "leave-one-out: loss of a mechanism = step with all chosen mechanisms "
                       "on minus the step with that one off; interaction = total loss minus "
                       "their sum",
        "rows": rows,
    }
