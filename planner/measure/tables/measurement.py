"""One measured sharding plan beside its prediction: per-rank seconds by cost component, the
plan's step cost, and the text ``clusterplan measure`` prints (see :mod:`.plans` for how the
numbers are taken)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from simulator.units import format_time

from planner.model.tables.features import BREAKDOWN_KEYS, step_cost_of

__all__ = ["Measurement", "format_measurement", "LOOKUP_KEYS", "COMM_KEYS"]

LOOKUP_KEYS = ("lookup_fwd_s", "lookup_bwd_s")
COMM_KEYS = tuple(k for k in BREAKDOWN_KEYS if k not in LOOKUP_KEYS)


@dataclass
class Measurement:
    """Measured and predicted per-rank cost of one plan (seconds; how: :mod:`.plans`).

    ``measured_s`` and ``predicted_s`` map each of
    :data:`~planner.model.tables.features.BREAKDOWN_KEYS` to a per-rank list.
    """

    devices: int
    measured_s: Mapping[str, list[float]]
    predicted_s: Mapping[str, list[float]]
    settings: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    wall_s: float = 0.0
    #: per key and rank, the timed iterations (lookups) or rounds (collectives) the medians
    #: come from, in the order they ran (:func:`.plans.measure_many` with all plans built together;
    #: else empty): :mod:`.paired` resamples them
    samples_s: Mapping[str, list[list[float]]] = field(default_factory=dict)

    @staticmethod
    def _sum(d: Mapping[str, list[float]], keys) -> list[float]:
        n = len(next(iter(d.values()))) if d else 0
        return [float(sum(d[k][r] for k in keys if k in d)) for r in range(n)]

    @property
    def lookup_s(self) -> list[float]:
        return self._sum(self.measured_s, LOOKUP_KEYS)

    @property
    def comm_s(self) -> list[float]:
        return self._sum(self.measured_s, COMM_KEYS)

    @property
    def total_s(self) -> list[float]:
        return [a + b for a, b in zip(self.lookup_s, self.comm_s)]

    @property
    def max_s(self) -> float:
        return max(self.total_s)

    @property
    def step_s(self) -> float:
        """Measured step cost: each phase's slowest rank, summed (what the step pays, as
        :meth:`~planner.model.tables.cost.CostModel.step_cost` predicts it)."""
        return step_cost_of({k: np.asarray(v) for k, v in self.measured_s.items()})

    @property
    def predicted_step_s(self) -> float:
        return step_cost_of({k: np.asarray(v) for k, v in self.predicted_s.items()})

    @property
    def predicted_lookup_s(self) -> list[float]:
        return self._sum(self.predicted_s, LOOKUP_KEYS)

    @property
    def predicted_comm_s(self) -> list[float]:
        return self._sum(self.predicted_s, COMM_KEYS)

    @property
    def predicted_total_s(self) -> list[float]:
        return [a + b for a, b in zip(self.predicted_lookup_s, self.predicted_comm_s)]

    @property
    def predicted_max_s(self) -> float:
        return max(self.predicted_total_s)

    @property
    def slowest_rank(self) -> int:
        t = self.total_s
        return int(max(range(len(t)), key=lambda r: t[r]))

    def to_dict(self) -> dict:
        return {"devices": self.devices, "measured_step_s": self.step_s,
                "predicted_step_s": self.predicted_step_s,
                "step_error": (self.predicted_step_s - self.step_s) / self.step_s
                if self.step_s > 0 else None,
                "measured_max_s": self.max_s,
                "predicted_max_s": self.predicted_max_s,
                "max_error": (self.predicted_max_s - self.max_s) / self.max_s
                if self.max_s > 0 else None,
                "slowest_rank": self.slowest_rank,
                "per_rank": {"measured_lookup_s": self.lookup_s,
                             "measured_comm_s": self.comm_s,
                             "measured_total_s": self.total_s,
                             "predicted_lookup_s": self.predicted_lookup_s,
                             "predicted_comm_s": self.predicted_comm_s,
                             "predicted_total_s": self.predicted_total_s},
                "measured_breakdown_s": {k: list(v) for k, v in self.measured_s.items()},
                "predicted_breakdown_s": {k: list(v) for k, v in self.predicted_s.items()},
                "settings": dict(self.settings), "notes": list(self.notes),
                "wall_s": self.wall_s}


def format_measurement(m: Measurement) -> str:
    """Per rank: measured lookups, communication, total, and the prediction beside them."""
    s = m.settings
    lines = [f"measured on {s.get('machine', 'this machine')}: {s.get('kernel')} kernels, "
             f"{s.get('threads', 1)} thread, batch {s.get('batch_size'):,}, median of "
             f"{s.get('repeats')} (+{s.get('warmup')} warm-up); collectives: gloo × "
             f"{m.devices} processes, median of {s.get('comm_repeats')}", ""]
    lines.append(f"{'rank':>4} {'lookups':>10} {'comm':>10} {'total':>10}   "
                 f"{'predicted':>10} {'(lookups':>10} {'comm)':>10} {'error':>7}")
    for r in range(m.devices):
        t, p = m.total_s[r], m.predicted_total_s[r]
        err = f"{100 * (p - t) / t:+6.1f}%" if t > 0 else "    -"
        mark = " ◀" if r == m.slowest_rank else ""
        lines.append(f"{r:>4} {format_time(m.lookup_s[r]):>10} {format_time(m.comm_s[r]):>10} "
                     f"{format_time(t):>10}   {format_time(p):>10} "
                     f"{format_time(m.predicted_lookup_s[r]):>10} "
                     f"{format_time(m.predicted_comm_s[r]):>10} {err:>7}{mark}")
    lines.append("")
    err = (m.predicted_max_s - m.max_s) / m.max_s if m.max_s > 0 else 0.0
    lines.append(f"max {format_time(m.max_s)} measured (rank {m.slowest_rank}), "
                 f"{format_time(m.predicted_max_s)} predicted ({100 * err:+.1f}%)")
    err = (m.predicted_step_s - m.step_s) / m.step_s if m.step_s > 0 else 0.0
    lines.append(f"step cost (each phase's slowest rank, summed) {format_time(m.step_s)} "
                 f"measured, {format_time(m.predicted_step_s)} predicted ({100 * err:+.1f}%)")
    for note in m.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
