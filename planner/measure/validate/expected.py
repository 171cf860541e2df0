"""The simulator's side of a validation run: the expanded step, its events and its timing.

The plan is simulated as :func:`planner.workloads.llm.step.build_step` builds it with
``expand_collectives=True`` (every TP collective an op on its group, exact per-rank parameter
counts), ``sequence_parallel=False`` (what the real run does) and the run's
``p2p_scatter_gather``, on the ``localhost-gloo`` topology sized to the run's processes with
the CPU compute profile (``traces/efficiency/cpu.yaml``).

With a calibration (:class:`simulator.gloo_profile.GlooProfile`, ``clusterplan calibrate
gloo``) the step is timed as this machine runs it: one core's compute rates, eager PyTorch's
measured host time per block added to the kernels', collectives and messages from the
measured per-size tables, and communication taking turns with compute on each rank's core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.compute import ComputeProfile, load_compute_profile
from simulator.engine import simulate
from simulator.result import SimResult
from simulator.gloo_profile import GlooProfile
from simulator.topology import Topology, load_topology

from planner.measure.validate.config import RunConfig
from planner.model.llm.host import HostOverhead
from planner.workloads.llm.comm_events import CommEvent, comm_events
from planner.workloads.llm.step import StepPlan, build_step, resolve_parallel

__all__ = ["Expected", "expected_step", "predicted_by_kind", "KIND_OF_CATEGORY"]

KIND_OF_CATEGORY = {"fwd": "compute", "bwd": "compute", "optimizer": "compute", "pass": "compute",
                    "tp": "tp", "cp": "tp", "dp": "dp", "pp": "pp"}


@dataclass
class Expected:
    plan: StepPlan
    topology: Topology
    profile: ComputeProfile
    events: dict[int, list[CommEvent]]
    sim: SimResult | None = None
    calibration: GlooProfile | None = None

    def simulate(self) -> SimResult:
        if self.sim is None:
            self.sim = simulate(self.topology, self.plan.workload, compute=self.profile,
                                measured_comm=self.calibration)
        return self.sim


def expected_step(cfg: RunConfig, *, dp_buckets: int | None = None,
                  topology: str = "localhost-gloo",
                  calibration: GlooProfile | None = None) -> Expected:
    """The simulator's step for ``cfg`` and every rank's expected events (``dp_buckets``
    overrides the run's, to build a deliberately wrong expectation); timed with
    ``calibration`` when given (see the module docstring)."""
    topo = load_topology(f"{topology}:node.gpus={cfg.world}")
    prof = calibration.compute if calibration is not None else load_compute_profile(topo.gpu)
    host: HostOverhead | str = "measured"
    if calibration is not None:
        hb = calibration.host_block_s
        if cfg.spec.model.ffn != "swiglu" and calibration.host_block_gelu_s:
            hb = calibration.host_block_gelu_s
        host = HostOverhead(forward_s=hb["forward"], backward_s=hb["backward"],
                            recompute_s=hb["forward"], source=calibration.source)
    p = resolve_parallel(cfg.spec, cfg.parallel, topo.num_gpus)
    plan = build_step(cfg.spec, p, topo, order=cfg.order, profile=prof,
                      schedule_name=cfg.schedule,
                      dp_buckets=cfg.dp_buckets if dp_buckets is None else dp_buckets,
                      sequence_parallel=False, expand_collectives=True,
                      p2p_scatter_gather=cfg.p2p_scatter_gather,
                      host=host, host_serial=calibration is not None)
    events = {r: comm_events(plan.workload, plan.layout, r) for r in range(cfg.world)}
    return Expected(plan=plan, topology=topo, profile=prof, events=events,
                    calibration=calibration)


def predicted_by_kind(exp: Expected, rank: int) -> dict[str, float]:
    """Simulated seconds per op kind (compute, tp, dp, pp) on ``rank``'s stage representative
    (DP collectives of ``rank`` itself), per step."""
    sim = exp.simulate()
    lay = exp.plan.layout
    rep = exp.plan.representatives[lay.coords(rank)["pp"]]
    out = {"compute": 0.0, "tp": 0.0, "dp": 0.0, "pp": 0.0}
    dur = sim.ops.duration_s.to_numpy()
    for op in exp.plan.workload.ops:
        kind = KIND_OF_CATEGORY.get(op.category, "compute")
        who = rank if op.category == "dp" else rep
        if who in op.ranks and np.isfinite(dur[op.id]):
            out[kind] += float(dur[op.id])
    return out
