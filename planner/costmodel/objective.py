"""The learned objective of a sharding state: per-rank cost in ms with the learned compute and
communication models, the memory each piece needs, and the state's layouts.

A state is the table- and column-wise pieces ("units" ``(table, k, width)`` with their ranks)
and a set of row-wise tables. Per rank::

    cost_r = C_r + A_bw,r + A_fw,r + RW_r

- ``C_r``: the learned fused forward+backward lookup time of everything rank ``r`` looks up —
  its units, merged per table (parts of one table on one rank are one shard), and a row block
  of every row-wise table. A row block is costed as a table of the block's rows, the full
  width and the block's share of the lookups (``pooling × block rows / rows``: distinct rows
  are spread over the table by hashing, so a block receives that share of the ids and keeps
  the table's accesses-per-row histogram), which is how the measured evaluator runs it.
- ``A_bw``, ``A_fw``: the learned pooled-embedding all-to-alls on the ranks' table/column-wise
  dim sums, the forward one with the straggler waits ``w_r = (C_r + A_bw,r + RW_r) − min``.
- ``RW_r``: row-wise tables' reduce-scatter/all-gather of ``batch × dim`` partial sums, from the
  analytic model (the learned comm nets know only the all-to-alls); it depends only on which
  tables are row-wise, so it is memoised per set.

No ids all-to-all term, as in NeuroShard: adding the analytic model's (calibrated) one was
tried (bench run 9, 2026-11-23) and made the learned cost over-predict the measured plans by
9% at the median (0% without it, runs 7-8) and rank them worse (tau 0.21 against 0.35); the
learned all-to-all nets, trained on measured exchanges, already absorb part of it.

Without comm nets for this device count every communication term comes from the analytic model
on the state's layouts. The shipped model was trained at one batch (:attr:`Predictor.batch`);
rows are scaled by ``factor = batch_trained / batch`` and times back by ``1 / factor``.
"""

from __future__ import annotations

import numpy as np

from planner.model.tables.access import default_reuse_bins, zipf_reuse
from planner.model.tables.memory import shard_memory_bytes
from planner.model.tables.plan import evaluate_shardings
from planner.model.tables.shards import ShardingType, column_wise, row_blocks, row_wise, table_wise

__all__ = ["Objective", "table_records", "COMM_KEYS"]

COMM_KEYS = ("input_a2a_s", "output_a2a_fwd_s", "output_a2a_bwd_s", "row_wise_comm_s",
             "table_row_wise_comm_s", "data_parallel_allreduce_s")


def _bins(t, batch: int):
    if t.reuse_bins is not None:
        return list(t.reuse_bins)
    if t.zipf_exponent is not None:
        return list(zipf_reuse(float(t.zipf_exponent), int(t.num_embeddings),
                               float(batch * t.pooling_factor))[0])
    return list(default_reuse_bins())


def table_records(model, pred) -> tuple[list, float]:
    """The predictor's per-table records ``[rows, dim, pooling, bins…]`` at its training batch
    (rows scaled by ``factor = batch_trained / batch``), and that factor."""
    factor = pred.batch / model.batch_size
    recs = [[max(1.0, round(t.num_embeddings * factor)), t.embedding_dim,
             t.pooling_factor] + _bins(t, model.batch_size) for t in model.tables]
    return recs, factor


class Objective:
    """Caches and scoring of states for one prepared problem and predictor."""

    def __init__(self, problem, pred, *, forced_rowwise=()) -> None:
        self._shard_memory_bytes = shard_memory_bytes
        self.problem, self.pred = problem, pred
        self.recs, self.factor = table_records(problem.model, pred)
        self.cap = np.array(problem.capacity_bytes, dtype=float)
        self.n = problem.devices
        #: tables that fit no single device: row-wise in every state
        self.forced_rowwise = frozenset(forced_rowwise)
        self._mem: dict = {}
        self._single: dict = {}
        self._rw_comm: dict = {}
        self._rw_mem: dict = {}

    # -- pieces ----------------------------------------------------------------------------
    @staticmethod
    def units(state):
        """``state``: ((table, (width, …)), …) → units ``(table, k, width)``."""
        return [(t, k, w) for t, widths in state for k, w in enumerate(widths)]

    def rec(self, unit):
        r = list(self.recs[unit[0]])
        r[1] = unit[2]
        return r

    def rw_recs(self, table: int) -> list[list]:
        """Per rank, the record of the row-wise table's row block."""
        t = self.problem.model.tables[table]
        out = []
        for rows in row_blocks(t.num_embeddings, self.n):
            r = list(self.recs[table])
            share = rows / t.num_embeddings
            r[0] = max(1.0, round(rows * self.factor))
            r[2] = t.pooling_factor * share
            out.append(r)
        return out

    def unit_mem(self, unit) -> float:
        key = (unit[0], unit[2])
        if key not in self._mem:
            t = self.problem.model.tables[unit[0]]
            st = ShardingType.TABLE_WISE if unit[2] == t.embedding_dim \
                else ShardingType.COLUMN_WISE
            self._mem[key] = float(self._shard_memory_bytes(t, t.num_embeddings, unit[2], st,
                                                            self.problem.model.optimizer))
        return self._mem[key]

    def rw_mem(self, table: int) -> np.ndarray:
        """Bytes per rank of a row-wise table's blocks."""
        if table not in self._rw_mem:
            t = self.problem.model.tables[table]
            self._rw_mem[table] = np.array([
                float(self._shard_memory_bytes(t, rows, t.embedding_dim, ShardingType.ROW_WISE,
                                               self.problem.model.optimizer))
                for rows in row_blocks(t.num_embeddings, self.n)])
        return self._rw_mem[table]

    def single(self, unit) -> float:
        """Predicted ms (at the training batch) of one unit alone on a device."""
        key = (unit[0], unit[2])
        if key not in self._single:
            self._single[key] = float(self.pred.compute_ms([[self.rec(unit)]])[0])
        return self._single[key]

    def memory(self, units, ranks, rowwise=()) -> np.ndarray:
        used = np.zeros(self.n)
        for u, r in zip(units, ranks):
            used[r] += self.unit_mem(u)
        for t in self.forced_rowwise | frozenset(rowwise):
            used += self.rw_mem(t)
        return used

    # -- scoring ---------------------------------------------------------------------------
    def per_rank(self, units, ranks, rowwise=()) -> np.ndarray:
        """Per-rank cost in ms per step at the task's batch (module docstring)."""
        n, pred, factor = self.n, self.pred, self.factor
        rw = tuple(sorted(self.forced_rowwise | frozenset(rowwise)))
        merged: list[dict] = [{} for _ in range(n)]
        dsum = np.zeros(n)
        for u, r in zip(units, ranks):
            merged[r][u[0]] = merged[r].get(u[0], 0) + u[2]
            dsum[r] += u[2]
        members = [[self.rec((t, 0, w)) for t, w in sorted(m.items())] for m in merged]
        for t in rw:
            for r, rec in enumerate(self.rw_recs(t)):
                members[r].append(rec)
        comp = pred.compute_ms(members) / factor
        comm = pred.comm_ms(list(dsum), [0.0] * n)
        if comm is None:
            ev = evaluate_shardings(self.problem, self.layouts(units, ranks, rw))
            return comp + sum(np.asarray(ev.breakdown_s[k]) for k in COMM_KEYS) * 1e3
        rwc = self.rowwise_comm_ms(rw)
        bwd = comm[1] / factor
        base = comp + bwd + rwc
        waits = base - base.min()
        fwd = pred.comm_ms(list(dsum), list(waits * factor))[0] / factor
        return base + fwd

    def score(self, units, ranks, rowwise=()) -> float:
        """The state's cost: max over ranks of :meth:`per_rank`, ms."""
        return float(self.per_rank(units, ranks, rowwise).max())

    def rowwise_comm_ms(self, rw: tuple) -> np.ndarray:
        """Analytic row-wise communication per rank (ms) when the tables ``rw`` are row-wise."""
        if not rw:
            return np.zeros(self.n)
        if rw not in self._rw_comm:
            model = self.problem.model
            lay = [row_wise(i, t.name, t.num_embeddings, t.embedding_dim, self.n) if i in rw
                   else table_wise(i, t.name, t.num_embeddings, t.embedding_dim, 0)
                   for i, t in enumerate(model.tables)]
            ev = evaluate_shardings(self.problem, lay)
            self._rw_comm[rw] = np.asarray(ev.breakdown_s["row_wise_comm_s"], float) * 1e3
        return self._rw_comm[rw]

    # -- output ----------------------------------------------------------------------------
    def layouts(self, units, ranks, rowwise=()):
        """Table shardings of the state: a table's parts merged per rank (one rank: table-wise,
        several: column-wise), tables without units row-wise."""
        model = self.problem.model
        parts: dict[int, dict[int, int]] = {}
        for u, r in zip(units, ranks):
            per = parts.setdefault(u[0], {})
            per[r] = per.get(r, 0) + u[2]
        out = []
        for i, t in enumerate(model.tables):
            if i not in parts:
                out.append(row_wise(i, t.name, t.num_embeddings, t.embedding_dim, self.n))
            elif len(parts[i]) == 1:
                out.append(table_wise(i, t.name, t.num_embeddings, t.embedding_dim,
                                      next(iter(parts[i]))))
            else:
                rs = sorted(parts[i])
                out.append(column_wise(i, t.name, t.num_embeddings, t.embedding_dim, rs,
                                       [parts[i][r] for r in rs]))
        return tuple(out)
