"""A collective as the network sees it: a sequence of phases, each a batch of flows.

Within a phase all flows run concurrently and the phase ends when the last one is delivered;
phases run one after another. Pipelined algorithms (NCCL's ring and tree move data in chunks so
every link stays busy) are one phase whose flows carry the whole algorithm's bytes per edge and
whose latency is ``steps × (alpha + path latency)``: the alpha-beta time of the algorithm, with
link sharing decided by the flow solver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.network.route import Routes

__all__ = ["Phase", "CollectivePlan", "KINDS", "BUSBW_FACTOR"]

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")


def BUSBW_FACTOR(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: busbw = algbw × factor."""
    if n <= 1:
        return 1.0
    return {"allreduce": 2 * (n - 1) / n, "allgather": (n - 1) / n,
            "reducescatter": (n - 1) / n, "alltoall": (n - 1) / n}.get(kind, 1.0)


@dataclass(frozen=True, slots=True)
class Phase:
    """One batch of concurrent flows: routes, bytes per flow, and the latency paid first (s)."""

    routes: Routes
    nbytes: np.ndarray
    latency_s: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class CollectivePlan:
    """How one collective runs: kind, algorithm, ranks (global GPU indices), size, phases.

    ``size_bytes`` follows nccl-tests: the buffer per rank for all-reduce and broadcast, the
    full output buffer for all-gather and the full input for reduce-scatter, the send buffer
    per rank for all-to-all.
    """

    kind: str
    algorithm: str
    ranks: tuple[int, ...]
    size_bytes: float
    phases: tuple[Phase, ...]
    channels: int = 1
    notes: dict = field(default_factory=dict)

    @property
    def latency_s(self) -> float:
        return float(sum(p.latency_s for p in self.phases))
