"""``--planner neuroshard``: NeuroShard's greedy grid search over the learned cost (table-wise).

For each cap ``s`` in {1.0, 1.05, …, 1.5}: tables sorted by their predicted single-table cost,
largest first; each goes to the device with the lowest predicted fused cost among the devices
where its memory fits and the device's dim sum stays ≤ ``s ×`` the mean dim sum per device
(ties: less memory used); the device's cost is then re-predicted on its whole table multiset
(memoised). Every feasible grid point's plan is scored with the full objective and the best
kept: ``max_r C_r + A_bw,r + A_fw,r`` with the learned compute ``C`` and, when comm nets for
this device count were shipped, the learned all-to-alls (the forward one with the straggler
waits ``w_r = (C_r + A_bw,r) − min``); otherwise the analytic model's communication terms of
the plan.

The shipped model was trained at one global batch (:attr:`Predictor.batch`, 4,096); a task with
another batch is mapped to it by scaling rows by ``batch_trained / batch`` and the predicted
times back by ``batch / batch_trained`` (distinct rows and lookups scale alike) — exact for
tasks scaled like the training data, an approximation otherwise. Tables that fit no single
device go row-wise (when allowed) and are costed by the analytic model only. Column-wise beam
search (NeuroShard's second stage) is not implemented.
"""

from __future__ import annotations

import time

import numpy as np

from planner.sharding.access import default_reuse_bins, zipf_reuse
from planner.sharding.memory import check_feasible, shard_memory_bytes
from planner.sharding.plan import Plan, PlannerStats, evaluate_shardings, make_plan
from planner.sharding.shards import ShardingType, table_wise
from planner.sharding.task import ShardingTask, prepare

__all__ = ["NeuroShardPlanner", "GRID"]

GRID = tuple(round(1.0 + 0.05 * i, 2) for i in range(11))
_COMM_KEYS = ("input_a2a_s", "output_a2a_fwd_s", "output_a2a_bwd_s", "row_wise_comm_s",
              "table_row_wise_comm_s", "data_parallel_allreduce_s")


def _bins(t, batch: int):
    if t.reuse_bins is not None:
        return list(t.reuse_bins)
    if t.zipf_exponent is not None:
        return list(zipf_reuse(float(t.zipf_exponent), int(t.num_embeddings),
                               float(batch * t.pooling_factor))[0])
    return list(default_reuse_bins())


class NeuroShardPlanner:
    """Greedy grid search on the learned cost (see the module docstring)."""

    name = "neuroshard"

    def __init__(self, weights=None, grid=GRID) -> None:
        self.weights = weights
        self.grid = tuple(grid)

    def plan(self, task: ShardingTask, devices: int, *, seed: int = 0,
             time_limit_s: float | None = None) -> Plan:
        import warnings
        from .weights import HardwareMismatchWarning, load_predictor
        t0 = time.perf_counter()
        problem = prepare(task, devices)
        check_feasible(problem, (ShardingType.TABLE_WISE, ShardingType.ROW_WISE))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HardwareMismatchWarning)
            pred = load_predictor(self.weights)
        notes = [str(w.message) for w in caught]
        model = problem.model
        n = problem.devices
        factor = pred.batch / model.batch_size
        recs = [[max(1.0, round(t.num_embeddings * factor)), t.embedding_dim,
                 t.pooling_factor] + _bins(t, model.batch_size) for t in model.tables]
        mem = np.array([shard_memory_bytes(t, t.num_embeddings, t.embedding_dim,
                                           ShardingType.TABLE_WISE, model.optimizer)
                        for t in model.tables], dtype=float)
        cap = np.array(problem.capacity_bytes, dtype=float)
        rowwise = [i for i, m in enumerate(mem) if m > cap.max()
                   and problem.allowed(i, ShardingType.ROW_WISE)]
        tw = [i for i in range(model.num_tables) if i not in rowwise]
        dims = np.array([t.embedding_dim for t in model.tables], dtype=float)
        single = pred.compute_ms([[recs[i]] for i in tw])
        order = [tw[k] for k in sorted(range(len(tw)), key=lambda k: (-single[k], tw[k]))]
        mean_dim = dims[tw].sum() / n
        best = None
        tried = 0
        for s in self.grid:
            if time_limit_s is not None and best is not None and \
                    time.perf_counter() - t0 > time_limit_s:
                notes.append(f"time limit: grid stopped before s={s}")
                break
            tried += 1
            ranks = self._grid_point(order, recs, mem, dims, cap, s * mean_dim, n, pred)
            if ranks is None:
                continue
            score, per = self._score(problem, ranks, recs, dims, rowwise, n, pred, factor)
            if best is None or score < best[0] - 1e-12:
                best = (score, s, ranks, per)
        if best is None:      # no grid point kept the dim cap: memory-only greedy
            ranks = self._grid_point(order, recs, mem, dims, cap, float("inf"), n, pred)
            if ranks is None:
                ranks = {i: int(np.argmin(np.zeros(n))) for i in tw}
                notes.append("no device has room for every table; plan is over memory")
            score, per = self._score(problem, ranks, recs, dims, rowwise, n, pred, factor)
            best = (score, None, ranks, per)
        score, s_best, ranks, per = best
        shardings = self._layouts(problem, ranks, rowwise)
        notes.append(f"learned cost: predicted max {score:.3f} ms per step at batch "
                     f"{model.batch_size} (cap s={s_best}, {tried} grid points)")
        if rowwise:
            notes.append(f"{len(rowwise)} tables row-wise (fit no single device)")
        if not problem.topology_ref.startswith("localhost"):
            notes.append(f"the learned model times this machine's CPU kernels, not "
                         f"{problem.topology.gpu.name}: collect and train on the target to plan "
                         "for it")
        if pred.batch != model.batch_size:
            notes.append(f"model trained at batch {pred.batch}: rows scaled by {factor:.4g}")
        stats = PlannerStats(wall_s=time.perf_counter() - t0, status="heuristic", seed=seed,
                             time_limit_s=time_limit_s, notes=tuple(notes))
        return make_plan(problem, shardings, self.name, stats)

    @staticmethod
    def _grid_point(order, recs, mem, dims, cap, dim_cap, n, pred):
        used = np.zeros(n)
        dsum = np.zeros(n)
        cost = np.zeros(n)
        members: list[list[int]] = [[] for _ in range(n)]
        ranks = {}
        for i in order:
            ok = [r for r in range(n) if used[r] + mem[i] <= cap[r]
                  and dsum[r] + dims[i] <= dim_cap + 1e-9]
            if not ok:
                return None
            r = min(ok, key=lambda r: (cost[r], used[r], r))
            ranks[i] = r
            used[r] += mem[i]
            dsum[r] += dims[i]
            members[r].append(i)
            cost[r] = pred.compute_ms([[recs[j] for j in members[r]]])[0]
        return ranks

    @staticmethod
    def _score(problem, ranks, recs, dims, rowwise, n, pred, factor):
        members: list[list[int]] = [[] for _ in range(n)]
        for i, r in ranks.items():
            members[r].append(i)
        comp = pred.compute_ms([[recs[j] for j in m] for m in members]) / factor
        dsum = np.zeros(n)
        for i, r in ranks.items():
            dsum[r] += dims[i]
        comm = None if rowwise else pred.comm_ms(list(dsum), [0.0] * n)
        if comm is not None:
            bwd = comm[1] / factor
            base = comp + bwd
            waits = base - base.min()
            fwd = pred.comm_ms(list(dsum), list(waits * factor))[0] / factor
            per = comp + bwd + fwd
        else:
            ev = evaluate_shardings(problem, NeuroShardPlanner._layouts(problem, ranks, rowwise))
            analytic = sum(np.asarray(ev.breakdown_s[k]) for k in _COMM_KEYS) * 1e3
            per = comp + analytic
        return float(per.max()), per

    @staticmethod
    def _layouts(problem, ranks, rowwise):
        from planner.sharding.shards import row_wise
        out = []
        for i, t in enumerate(problem.model.tables):
            if i in ranks:
                out.append(table_wise(i, t.name, t.num_embeddings, t.embedding_dim, ranks[i]))
            else:
                out.append(row_wise(i, t.name, t.num_embeddings, t.embedding_dim,
                                    problem.devices))
        return tuple(out)
