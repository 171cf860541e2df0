"""What every planner shares: the option catalogue and choices.

A *choice* fixes one table's layout and is a plain tuple, so it hashes and sorts the same on
every run:

- ``("tw", d)``: table-wise on rank d;
- ``("cw", k, counts)``: k equal column parts (width a multiple of 4), ``counts[r]`` of them on
  rank r, parts on one rank merged into one shard (so any multiple-of-``dim/k`` widths);
- ``("rw",)``: row-wise over all ranks; ``("dp",)``: data-parallel;
- ``("twrw", h)``: table-row-wise on host h.

Per-rank features are affine in a column block's width, so a column-wise choice costs
``base + c · part`` on a rank holding ``c ≥ 1`` parts; the MIP and the local search rely on it.
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from planner.model.tables.features import BREAKDOWN_KEYS, F_MEM
from planner.model.tables.shards import (
    Shard,
    ShardingType,
    TableSharding,
    column_wise_counts,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from planner.model.tables.task import Problem

__all__ = ["Catalog", "catalog", "Choice", "CW_PARTS", "step_scores"]

Choice = tuple
CW_PARTS = (2, 4, 8)


class Catalog:
    """Features and layouts of every option of every table of one problem (memoised)."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.n = problem.devices
        self.cost = problem.cost
        self.model = problem.model
        self._tw: dict[int, np.ndarray] = {}
        self._cw: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._uni: dict[tuple, np.ndarray] = {}
        self.cap = np.array(problem.capacity_bytes, dtype=float)

    # -- which options exist ----------------------------------------------------------------
    def cw_parts(self, t: int, parts: Sequence[int] = CW_PARTS) -> tuple[int, ...]:
        """Column-part counts ``k`` allowed for table t: dim divisible into k multiples of 4."""
        if self.n < 2 or not self.problem.allowed(t, ShardingType.COLUMN_WISE):
            return ()
        dim = self.model.tables[t].embedding_dim
        return tuple(k for k in parts if dim % (4 * k) == 0)

    def can(self, t: int, st: ShardingType) -> bool:
        """Whether table t may use type ``st`` here (allowed, and meaningful for this cluster)."""
        if st == ShardingType.TABLE_ROW_WISE and len(self.problem.hosts) < 2:
            return False
        if st != ShardingType.TABLE_WISE and self.n < 2:
            return False
        return self.problem.allowed(t, st)

    # -- features ---------------------------------------------------------------------------
    def tw(self, t: int) -> np.ndarray:
        """Features (width,) of table t table-wise on any one rank."""
        if t not in self._tw:
            tab = self.model.tables[t]
            s = Shard(0, 0, 0, tab.num_embeddings, tab.embedding_dim)
            self._tw[t] = self.cost.shard_features(t, s, ShardingType.TABLE_WISE)
        return self._tw[t]

    def cw(self, t: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(base, part)`` features (width,) of table t in k parts; c parts cost base + c·part."""
        key = (t, k)
        if key not in self._cw:
            tab = self.model.tables[t]
            w = tab.embedding_dim // k
            f1 = self.cost.shard_features(t, Shard(0, 0, 0, tab.num_embeddings, w),
                                          ShardingType.COLUMN_WISE)
            f2 = self.cost.shard_features(t, Shard(0, 0, 0, tab.num_embeddings, 2 * w),
                                          ShardingType.COLUMN_WISE)
            part = f2 - f1
            self._cw[key] = (f1 - part, part)
        return self._cw[key]

    def uniform(self, t: int, kind: str, host: int = -1) -> np.ndarray:
        """Per-rank features (n, width) of a row-wise, data-parallel or table-row-wise choice."""
        key = (t, kind, host)
        if key not in self._uni:
            if kind == "twrw" and host >= 0:
                self._uni[key] = self._on_host(t, host)
            else:
                self._uni[key] = self.cost.sharding_features(self.layout(t, (kind,)))
        return self._uni[key]

    def _on_host(self, t: int, host: int) -> np.ndarray:
        """Table t table-row-wise on ``host``: a shard's features depend on its rows and its
        host's size, not on which ranks hold it, so hosts of one size share one computation
        (at 256 ranks, 32 hosts: one instead of 32 per table)."""
        hosts = self.problem.hosts
        ranks = list(hosts[host])
        first = next(h for h, r in enumerate(hosts) if len(r) == len(ranks))
        key = (t, "twrw-blocks", len(ranks))
        if key not in self._uni:
            full = self.cost.sharding_features(self.layout(t, ("twrw", first)))
            self._uni[key] = full[list(hosts[first])]
        out = np.zeros((self.n, self.cost.width))
        out[ranks] = self._uni[key]
        return out

    def contrib(self, t: int, choice: Choice) -> np.ndarray:
        """Per-rank features (n, width) of table t under ``choice``."""
        kind = choice[0]
        out = np.zeros((self.n, self.cost.width))
        if kind == "tw":
            out[choice[1]] = self.tw(t)
        elif kind == "cw":
            base, part = self.cw(t, choice[1])
            c = np.asarray(choice[2], dtype=float)
            out += (c > 0)[:, None] * base[None, :] + c[:, None] * part[None, :]
        elif kind == "twrw":
            out += self.uniform(t, "twrw", choice[1])
        else:
            out += self.uniform(t, kind)
        return out

    # -- layouts ----------------------------------------------------------------------------
    def layout(self, t: int, choice: Choice) -> TableSharding:
        """The TorchRec-rule layout of table t under ``choice``."""
        tab = self.model.tables[t]
        rows, dim, name = tab.num_embeddings, tab.embedding_dim, tab.name
        kind = choice[0]
        if kind == "tw":
            return table_wise(t, name, rows, dim, int(choice[1]))
        if kind == "cw":
            return column_wise_counts(t, name, rows, dim, int(choice[1]), choice[2])
        if kind == "rw":
            return row_wise(t, name, rows, dim, self.n)
        if kind == "dp":
            return data_parallel(t, name, rows, dim, self.n)
        if kind == "twrw":
            h = int(choice[1])
            return table_row_wise(t, name, rows, dim, h, self.problem.hosts[h])
        raise ValueError(f"unknown choice {choice!r}")

    def normalise(self, choice: Choice) -> Choice:
        """Column-wise choices with all parts on one rank become table-wise."""
        if choice[0] == "cw":
            nz = [r for r, c in enumerate(choice[2]) if c > 0]
            if len(nz) == 1:
                return ("tw", nz[0])
            return ("cw", int(choice[1]), tuple(int(c) for c in choice[2]))
        return choice

    def choice_of(self, ts: TableSharding) -> Choice:
        """The choice that reproduces a layout (column-wise: the coarsest equal parts)."""
        st = ts.sharding_type
        if st == ShardingType.TABLE_WISE:
            return ("tw", ts.shards[0].rank)
        if st == ShardingType.ROW_WISE:
            return ("rw",)
        if st == ShardingType.DATA_PARALLEL:
            return ("dp",)
        if st == ShardingType.TABLE_ROW_WISE:
            return ("twrw", ts.host)
        dim = self.model.tables[ts.table].embedding_dim
        for k in (2, 4, 8, 16, 32):
            w = dim // k
            if dim % k == 0 and all(s.cols % w == 0 for s in ts.shards):
                counts = [0] * self.n
                for s in ts.shards:
                    counts[s.rank] += s.cols // w
                return ("cw", k, tuple(counts))
        raise ValueError("column widths are not multiples of an equal part")

    def choices_of(self, shardings: Sequence[TableSharding]) -> list[Choice]:
        out: list[Choice] = [None] * self.model.num_tables
        for ts in shardings:
            out[ts.table] = self.choice_of(ts)
        return out

    def features(self, choices: Sequence[Choice]) -> np.ndarray:
        """Per-rank features (n, width) of the tables that have a choice (None: not placed yet)."""
        F = np.zeros((self.n, self.cost.width))
        for t, ch in enumerate(choices):
            if ch is not None:
                F += self.contrib(t, ch)
        return F

    def layouts(self, choices: Sequence[Choice]) -> tuple[TableSharding, ...]:
        return tuple(self.layout(t, ch) for t, ch in enumerate(choices))


def step_scores(cm, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The planners' key for plans ``F`` (..., ranks, width): the step cost (each phase's slowest
    rank, summed, seconds) and Σ over phases and ranks of the phase's cost² (s²), which
    breaks the step cost's plateaus: among equal step costs it prefers the plan whose ranks
    are even phase by phase (a lookup-heavy table to a rank light in lookups)."""
    comp = cm.components(F)
    step = sum(comp[k].max(axis=-1) for k in BREAKDOWN_KEYS)
    sq = sum((comp[k] ** 2).sum(axis=-1) for k in BREAKDOWN_KEYS)
    return np.asarray(step, dtype=float), np.asarray(sq, dtype=float)


@functools.lru_cache(maxsize=16)
def catalog(problem: Problem) -> Catalog:
    """The (memoised) :class:`Catalog` of a problem."""
    return Catalog(problem)


def rowwise_prepass(cat: Catalog, choices: list) -> list[str]:
    """Put every table that fits on no single device row-wise (when allowed); notes returned."""
    notes = []
    cap = float(cat.cap.max())
    for t in range(cat.model.num_tables):
        if choices[t] is None and cat.tw(t)[F_MEM] > cap and cat.can(t, ShardingType.ROW_WISE):
            choices[t] = ("rw",)
            notes.append(f"{cat.model.tables[t].name}: row-wise (fits no single device)")
    return notes


def place_table_wise(cat: Catalog, order: Sequence[int], choices: list, pick) -> list[str]:
    """Place the tables of ``order`` (those without a choice) table-wise, one by one.

    ``pick(t, candidates, mem)`` returns the rank for table t among the ranks with room. When no
    rank has room the table goes to the rank with the most free memory and a note says so (the
    plan is then invalid).
    """
    mem = cat.features(choices)[:, F_MEM]
    notes = []
    for t in order:
        if choices[t] is not None:
            continue
        need = cat.tw(t)[F_MEM]
        room = np.flatnonzero(mem + need <= cat.cap)
        if room.size == 0:
            d = int(np.argmax(cat.cap - mem))
            notes.append(f"{cat.model.tables[t].name}: fits on no rank with the tables placed "
                         f"before it; put on rank {d} (over capacity)")
        else:
            d = int(pick(t, room, mem))
        choices[t] = ("tw", d)
        mem[d] += need
    return notes
