"""Several DLRM plans of one table set trained side by side in one run, their steps
interleaved: the paired measurement that ranks plans on a host whose speed drifts.

On a shared VM the same plan's measured step moves by 10-20% between runs a few minutes
apart (seed 19's four rounds: 0.55-0.69 s for one plan), while plans of one table set are
often 1-5% apart; measured one after the other, the order of two such plans is the host's
state when each ran. Here every rank builds every plan's ``DistributedModelParallel`` in one
process group and trains them in turn, one step each (plan 0's step, plan 1's, ... then the
next step), so a slow spell of seconds or minutes falls on all of them alike. Each plan keeps
its own recorded calls, steps and losses, so the parent checks and predicts it exactly as a
run of that plan alone (:func:`split_result`, then
:func:`planner.measure.validate.dlrm_report.validate_dlrm`).

What it changes against plans run alone: the other plans' models stay in memory, and a
plan's step follows another plan's step rather than its own, so what its previous step left
in the caches is the other model's. A step of the family's batches streams tens of MiB of
activations through a 32 MiB L3, so little of one step survives to the next either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.measure.validate.runner import RunResult

__all__ = ["InterleavedRunConfig", "split_result", "interleaved_steps", "SHARED"]


#: what every plan of an interleaved run shares, and the run takes from them
SHARED = ("world", "local_world", "backend", "heap")


@dataclass(frozen=True)
class InterleavedRunConfig:
    """The plans (:class:`planner.measure.validate.dlrm.DLRMRunConfig`, same world, local
    world, backend and heap: :data:`SHARED`) that one run trains side by side, in this order
    each step."""

    plans: tuple
    world: int = field(init=False)
    local_world: int = field(init=False)
    backend: str = field(init=False)
    heap: str = field(init=False)
    host_probe: bool = field(init=False)     # any plan's
    warmup: int = field(init=False)          # the most of any plan (the progress bar's)
    steps: int = field(init=False)
    timeout_s: float = field(init=False)     # seconds without progress: one plan's allowance

    def __post_init__(self) -> None:
        if not self.plans:
            raise ValueError("an interleaved run needs at least one plan")
        first = self.plans[0]
        for c in self.plans:
            for name in SHARED:
                if getattr(c, name) != getattr(first, name):
                    raise ValueError(f"interleaved plans differ in {name}: "
                                     f"{getattr(first, name)!r} vs {getattr(c, name)!r}")
            if c.trace_dir or c.fault is not None:
                raise ValueError("an interleaved run takes no trace_dir or fault")
        for name in SHARED:
            object.__setattr__(self, name, getattr(first, name))
        object.__setattr__(self, "host_probe", any(c.host_probe for c in self.plans))
        for name in ("warmup", "steps", "timeout_s"):
            object.__setattr__(self, name, max(getattr(c, name) for c in self.plans))

    def rank_main(self, rank: int, port: int, progress, report, state: dict) -> dict:
        """The rank's run (called by :func:`planner.measure.validate.worker.worker_main`)."""
        return _run_rank(rank, self, port, progress, report, state)


def interleaved_steps(plans) -> list[tuple[int, int]]:
    """``(plan index, step)`` in the order a rank runs them: step by step, every plan that
    still has that step (plan ``i`` has ``warmup + steps`` of its own), plans in their order.

    >>> from types import SimpleNamespace as C
    >>> interleaved_steps([C(warmup=1, steps=1), C(warmup=1, steps=2)])
    [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]
    """
    n = [c.warmup + c.steps for c in plans]
    return [(i, s) for s in range(max(n)) for i in range(len(plans)) if s < n[i]]


def split_result(cfg: InterleavedRunConfig, res: RunResult) -> list[RunResult]:
    """The run's result as one :class:`RunResult` per plan, in ``cfg.plans``' order."""
    return [RunResult(ranks=[r["plans"][i] for r in res.ranks], wall_s=res.wall_s,
                      pids=res.pids, notes=list(res.notes)) for i in range(len(cfg.plans))]


def _run_rank(rank: int, cfg: InterleavedRunConfig, rdzv: str, progress, report,
              state: dict) -> dict:
    from planner.measure.validate.dlrm_worker import run_plans

    def train(jobs) -> list[list]:
        import time
        steps: list[list] = [[] for _ in jobs]
        for i, step in interleaved_steps(cfg.plans):
            job = jobs[i].active()
            job.rec.barrier()
            t0 = time.perf_counter()
            job.run_step(step)
            steps[i].append((step, t0, time.perf_counter()))
        jobs[-1].rec.barrier()
        return steps
    jobs, steps, probe = run_plans(rank, cfg, cfg.plans, rdzv, progress, report, state, train)
    return {"rank": rank, "plans": [j.result(s, None, probe) for j, s in zip(jobs, steps)]}
