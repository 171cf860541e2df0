"""What a simulation produced: :class:`SimResult`, the op table by column (one entry per op,
times in seconds), with the pandas views and the Perfetto trace made from it on demand.
:func:`simulator.engine.simulate` makes one."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simulator.network import NetworkStats
from simulator.topology import Topology
from simulator.trace import chrome_trace, write_chrome_trace
from simulator.workload import Workload

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SimResult", "op_table"]

_COLUMNS = ["op", "name", "kind", "category", "stream", "ranks", "first_rank", "device",
            "start_s", "end_s", "duration_s", "bytes", "flops", "algorithm"]


@dataclass
class SimResult:
    """What a simulation produced.

    Attributes
    ----------
    table : dict of str to numpy.ndarray
        The op table by column: ``op, name, kind, category, stream, ranks`` (count),
        ``first_rank``, ``device`` (of the first rank), ``start_s, end_s, duration_s``
        (seconds), ``bytes``, ``flops``, ``algorithm``. :attr:`ops` is the same as a pandas
        DataFrame, made on first use (pandas costs ~0.3 s to import; a plain simulation does
        without it); :meth:`per_device` expands collectives to one row per member.
    step_time_s : float
        Time at which the last op ended, seconds.
    events : int
        Simulated events: op starts and ends, flow starts and ends, phase boundaries.
    wall_s : float
        Wall-clock time the simulation took, seconds.
    network : NetworkStats
    """

    table: dict
    step_time_s: float
    events: int
    wall_s: float
    network: NetworkStats
    topology: str
    mode: str
    workload: Workload = field(repr=False, default=None)
    device_names: tuple = field(repr=False, default=())
    slowdown: dict = field(default_factory=dict)     # rank → compute slowdown factor applied
    link_faults: tuple = ()                           # LinkFaults applied during the run
    link_bytes: object = field(repr=False, default=None)    # per link, when tracked
    link_busy_s: object = field(repr=False, default=None)   # per link: bytes / capacity

    @cached_property
    def ops(self) -> "pd.DataFrame":
        """The op table (see :attr:`table`) as a DataFrame, one row per op."""
        import pandas as pd

        return pd.DataFrame(self.table, columns=_COLUMNS)

    @property
    def num_ops(self) -> int:
        return len(self.table["op"])

    def compute_busy_s(self) -> dict[int, float]:
        """Seconds of compute per rank that ran any (the input of straggler diagnosis)."""
        df = self.ops[self.ops.kind == "compute"]
        return {int(r): float(v) for r, v in df.groupby("first_rank").duration_s.sum().items()}

    @property
    def events_per_s(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else float("inf")

    def busy_time_s(self, category: str | None = None, kind: str | None = None) -> float:
        """Summed duration of ops (per op, not per rank), optionally filtered."""
        df = self.ops
        if category is not None:
            df = df[df.category == category]
        if kind is not None:
            df = df[df.kind == kind]
        return float(df.duration_s.sum())

    def per_device(self, ranks=None) -> "pd.DataFrame":
        """One row per (op, rank it ran on), with ``rank`` and ``device`` columns.

        ``ranks`` limits the expansion (a 16k-rank collective is 16k rows otherwise).
        """
        keep = None if ranks is None else set(int(r) for r in ranks)
        rows_op, rows_rank = [], []
        for op in self.workload.ops:
            for r in op.ranks:
                if keep is None or r in keep:
                    rows_op.append(op.id)
                    rows_rank.append(r)
        df = self.ops.iloc[rows_op].drop(columns=["first_rank", "device"]).reset_index(drop=True)
        df.insert(1, "rank", rows_rank)
        df.insert(2, "device", [self.device_names[r] for r in rows_rank])
        return df

    def chrome_trace(self, *, max_ranks: int = 64) -> dict:
        """The timeline as a Chrome/Perfetto trace dict (see :mod:`simulator.trace`)."""
        return chrome_trace(self, max_ranks=max_ranks)

    def write_chrome_trace(self, path, *, max_ranks: int = 64) -> None:
        write_chrome_trace(self, path, max_ranks=max_ranks)


def op_table(topo: Topology, ops, start: np.ndarray, end: np.ndarray, algo: list[str]
              ) -> dict[str, np.ndarray]:
    """The :attr:`SimResult.table` columns, one entry per op; times in seconds."""
    n = len(ops)
    cols = {
        "op": np.arange(n), "name": [o.name for o in ops], "kind": [o.kind for o in ops],
        "category": [o.category for o in ops], "stream": [o.stream for o in ops],
        "ranks": [len(o.ranks) for o in ops], "first_rank": [o.ranks[0] for o in ops],
        "device": [topo.gpus[o.ranks[0]] for o in ops],
        "start_s": start, "end_s": end, "duration_s": end - start,
        "bytes": [o.bytes_moved for o in ops], "flops": [o.flops for o in ops],
        "algorithm": algo}
    return {k: np.asarray(v) for k, v in cols.items()}
