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

A plan's turn is a *block* of its steps (``blocks``; :func:`block_steps` sizes them to about a
second), not one step: the first step of a turn finds the caches holding the other plans'
tables, code and activations, and a short step pays for that, which a plan trained on its
own, as a user trains it, does not. Measured on a 2-core Intel Xeon VM (2026-12-02,
``tests/bench/bench_turn_cold.py``, turns of 10 steps, each turn's first step over the median
of its others, median over turns): seed 21's 10 ms set 1.18 / 1.00 / 1.49 / 1.07 and, in a
second run, 1.09 / 0.98 / 1.06 / 1.21 for its four plans; its 30 ms set 0.96-1.05, its
100-200 ms set 0.92-1.06 (``traces/validate/turn-cold-seed21-*``). With turns of many steps
only the turn's first step is cold, and the host's drift, which moves over seconds to
minutes, still falls on all of a set's plans alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner.measure.validate.runner import RunResult

__all__ = ["InterleavedRunConfig", "split_result", "interleaved_steps", "block_steps", "SHARED",
           "BLOCK_SECONDS"]


#: what every plan of an interleaved run shares, and the run takes from them
SHARED = ("world", "local_world", "backend", "heap")

#: predicted seconds of a plan's turn (:func:`block_steps`; ``validate unseen --block-seconds``)
BLOCK_SECONDS = 1.0


@dataclass(frozen=True)
class InterleavedRunConfig:
    """The plans (:class:`planner.measure.validate.dlrm.DLRMRunConfig`, same world, local
    world, backend and heap: :data:`SHARED`) that one run trains side by side, in this order
    each turn, plan ``i`` ``blocks[i]`` steps a turn (one each when ``blocks`` is empty)."""

    plans: tuple
    blocks: tuple = ()
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
        if self.blocks and (len(self.blocks) != len(self.plans)
                            or any(int(b) != b or b < 1 for b in self.blocks)):
            raise ValueError(f"blocks {self.blocks!r}: one whole number >= 1 per plan")
        for name in SHARED:
            object.__setattr__(self, name, getattr(first, name))
        object.__setattr__(self, "host_probe", any(c.host_probe for c in self.plans))
        for name in ("warmup", "steps", "timeout_s"):
            object.__setattr__(self, name, max(getattr(c, name) for c in self.plans))

    def rank_main(self, rank: int, port: int, progress, report, state: dict) -> dict:
        """The rank's run (called by :func:`planner.measure.validate.worker.worker_main`)."""
        return _run_rank(rank, self, port, progress, report, state)


def interleaved_steps(plans, blocks=()) -> list[tuple[int, int]]:
    """``(plan index, step)`` in the order a rank runs them: turn by turn, every plan that
    still has steps (plan ``i`` has ``warmup + steps`` of its own) runs its next ``blocks[i]``
    (default 1), plans in their order.

    >>> from types import SimpleNamespace as C
    >>> interleaved_steps([C(warmup=1, steps=1), C(warmup=1, steps=2)])
    [(0, 0), (1, 0), (0, 1), (1, 1), (1, 2)]
    >>> interleaved_steps([C(warmup=1, steps=3), C(warmup=0, steps=2)], blocks=(2, 1))
    [(0, 0), (0, 1), (1, 0), (0, 2), (0, 3), (1, 1)]
    """
    n = [c.warmup + c.steps for c in plans]
    size = list(blocks) or [1] * len(plans)
    done, out = [0] * len(plans), []
    while any(d < k for d, k in zip(done, n)):
        for i in range(len(plans)):
            end = min(n[i], done[i] + size[i])
            out += [(i, s) for s in range(done[i], end)]
            done[i] = end
    return out


def block_steps(step_s: float, block_s: float = BLOCK_SECONDS) -> int:
    """Steps in a turn of a plan predicted at ``step_s`` seconds a step: about ``block_s``
    seconds of them, at least one (``block_s`` 0: one step a turn).

    >>> block_steps(0.010), block_steps(0.4), block_steps(2.0), block_steps(0.010, 0)
    (100, 3, 1, 1)
    """
    if block_s <= 0:
        return 1
    return max(1, math.ceil(block_s / max(step_s, 1e-6)))


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
        for i, step in interleaved_steps(cfg.plans, cfg.blocks):
            job = jobs[i].active()
            job.rec.barrier()
            t0 = time.perf_counter()
            job.run_step(step)
            steps[i].append((step, t0, time.perf_counter()))
        jobs[-1].rec.barrier()
        return steps
    jobs, steps, probe = run_plans(rank, cfg, cfg.plans, rdzv, progress, report, state, train)
    return {"rank": rank, "plans": [j.result(s, None, probe) for j, s in zip(jobs, steps)]}
