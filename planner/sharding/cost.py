"""Analytic per-rank cost of an embedding sharding, in seconds.

Notation: ``B`` global batch, ``n`` ranks, ``b = B / n`` local batch, a table with ``R`` rows,
pooling factor ``L`` (ids per sample), weight precision ``p`` bytes, pooled-output precision
``o`` bytes (``comm_precision``), HBM bandwidth ``H`` (``topo.gpu.hbm_bandwidth_Bps``).

**Lookups (per shard, on its rank).** A table-wise or column-wise shard of ``c`` columns
serves all ``B·L`` ids of the global batch; a row-wise block of ``r`` rows serves ``B·L·r/R`` of
them (ids spread over rows in proportion to the block, i.e. hashing spreads hot rows evenly);
a data-parallel replica serves its local ``b·L``. Forward time ::

    ids · (miss · c·p  +  overhead  +  id_bytes)  +  outputs · c·o
    ---------------------------------------------------------------  +  shard_overhead_s
                          H · hbm_efficiency

``outputs`` is ``B`` pooled rows (``b`` for data-parallel). ``overhead`` (64 B) is a per-lookup
cost TorchRec omits (index load, offset arithmetic, one memory transaction of latency), so a
lookup into a 4-wide table is not 32× cheaper than one into a 128-wide table.
**Cache-hit discount**: the table's access distribution gives ``u`` = distinct rows / lookups
(``1 / accesses_per_row``, from its 17 reuse bins or its Zipf exponent, and never fewer than
``lookups / R``); a first touch always reads HBM, a repeat hits L2 with probability
``repeat_hit_ratio`` ``h`` (0.8), so ``miss = u + (1 − u)(1 − h)``.
**Backward** = ``backward_multiplier`` (2, TorchRec's) × the forward lookup time + the optimizer's
state traffic (read and write the state of each distinct row touched: Adam 2·c·p, Adagrad c·p,
row-wise Adagrad 4 bytes) + ``shard_overhead_s``. A data-parallel table instead gets a dense
gradient and updates the whole table (weights, gradient and state streamed once).
One TBE kernel launch forward and two backward per rank (the compute profile's launch overhead).

**Communication (per rank).** Table- and column-wise shards join two all-to-alls: ids in
(``L·id_bytes + length_bytes`` per sample and shard) and pooled embeddings out
(``c·o`` per sample), the latter once forward and once backward (gradients, reversed). With
``Y_r`` the bytes per sample owned by rank ``r``, rank ``r`` exchanges ``b·Y_r`` with each peer
one way and ``b·Y_q`` from each peer ``q`` the other way; the time is ::

    alpha + max(send_intra, recv_intra) / bw_intra + max(send_inter, recv_inter) / bw_inter

with intra = peers in the same node and inter = peers elsewhere. The two terms add (a
conservative choice); against :func:`simulator.collectives.simulate_collective` with uneven
splits this is exact inside a DGX node and 3–8% high across 2–4 nodes (checked within 10% in the
tests). Row-wise tables cost a reduce-scatter of the ``B × dim`` partial sums forward and an
all-gather backward; table-row-wise the same inside the host plus the cross-host all-to-all of
its ``1/G`` share; data-parallel tables an all-reduce of their fp32 gradient. All collective times
are ``alpha + size / bandwidth`` fitted to the simulator's own collectives on the plan's topology
(:func:`calibrate_comm`), so a slower fabric or a multi-node plan costs what the simulator says.

The per-rank cost a planner minimises (its maximum) is the sum of lookups forward and backward,
the ids all-to-all, the output all-to-all forward and backward, and the row-wise, table-row-wise
and data-parallel collectives. The dense part (MLPs and their all-reduce) is the same on every
rank and is reported separately (:meth:`CostModel.dense_costs`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from simulator.topology import Topology

from .access import accesses_per_row, default_reuse_bins, zipf_reuse
from .shards import Shard, ShardingType, TableSharding
from .spec import PRECISION_BYTES, ModelSpec, TableSpec
from .memory import shard_memory_bytes

__all__ = ["CostConfig", "CommModel", "CostModel", "calibrate_comm", "FEATURES",
           "BREAKDOWN_KEYS"]

#: per-rank additive features of a plan (see :meth:`CostModel.shard_features`)
FEATURES = ("fwd_s", "bwd_s", "out_Bps", "ids_Bps", "rw_bytes", "dp_bytes", "twrw_bytes",
            "mem_bytes")
F_FWD, F_BWD, F_OUT, F_IDS, F_RW, F_DP, F_HRS, F_MEM = range(len(FEATURES))
K = len(FEATURES)

BREAKDOWN_KEYS = ("lookup_fwd_s", "lookup_bwd_s", "input_a2a_s", "output_a2a_fwd_s",
                  "output_a2a_bwd_s", "row_wise_comm_s", "table_row_wise_comm_s",
                  "data_parallel_allreduce_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class CostConfig:
    """Constants of the analytic model (priors, not measurements; see the module docstring).

    Attributes
    ----------
    hbm_efficiency : float
        Fraction of HBM bandwidth embedding gathers reach.
    lookup_overhead_bytes : float
        Per-lookup cost expressed as extra bytes at that bandwidth.
    repeat_hit_ratio : float
        Probability that a repeated access of a row within a batch hits on-chip cache.
    backward_multiplier : float
        Backward lookup time / forward lookup time.
    id_bytes, length_bytes : int
        Bytes per id (int64) and per (sample, feature) length entry (int32).
    shard_overhead_s : float
        Fixed time per shard per pass (table setup inside the fused kernel), seconds.
    kernel_launch_s : float or None
        Launch time of one TBE kernel, seconds; None uses the GPU compute profile's.
    reserve_fraction : float
        Fraction of HBM kept free (TorchRec's heuristic reservation).
    """

    hbm_efficiency: float = 0.8
    lookup_overhead_bytes: float = 64.0
    repeat_hit_ratio: float = 0.8
    backward_multiplier: float = 2.0
    id_bytes: int = 8
    length_bytes: int = 4
    shard_overhead_s: float = 2e-6
    kernel_launch_s: float | None = None
    reserve_fraction: float = 0.15


@dataclass(frozen=True)
class CommModel:
    """Closed-form collective times for ranks ``0..n-1`` of a topology, fitted to the simulator.

    Attributes
    ----------
    n : int
    node_of : numpy.ndarray
        Host index of each rank.
    node_size : numpy.ndarray
        Ranks of the group in each rank's host.
    a2a_alpha_s : float
        Fixed time of one all-to-all, seconds.
    intra_Bps, inter_Bps : float
        Per-rank all-to-all bandwidth to peers inside / outside the host, bytes/s
        (``inf`` where a rank has no such peers).
    fits : Mapping[str, tuple[float, float]]
        ``(alpha_s, Bps)`` per collective: ``reducescatter``, ``allgather``, ``allreduce``
        over all ranks and ``host_reducescatter``, ``host_allgather`` inside one host;
        time = alpha + size / Bps (nccl-tests sizes).
    source : str
    """

    n: int
    node_of: np.ndarray
    node_size: np.ndarray
    a2a_alpha_s: float
    intra_Bps: float
    inter_Bps: float
    fits: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    source: str = ""

    def time(self, kind: str, size_bytes):
        """Seconds of collective ``kind`` of ``size_bytes`` (0 when the size is 0)."""
        alpha, bw = self.fits.get(kind, (0.0, math.inf))
        s = np.asarray(size_bytes, dtype=float)
        return np.where(s > 0, alpha + s / bw, 0.0)

    def a2a_times(self, owned_bytes: np.ndarray) -> np.ndarray:
        """Per-rank all-to-all time, seconds, when rank r exchanges ``owned_bytes[..., r]`` with
        each peer one way and each peer q exchanges ``owned_bytes[..., q]`` with r the other way:
        ``alpha + max(send, recv)_intra / bw_intra + max(send, recv)_inter / bw_inter``.
        """
        y = np.asarray(owned_bytes, dtype=float)
        total = y.sum(axis=-1, keepdims=True)
        nodes = int(self.node_of.max()) + 1
        if nodes == 1:
            node_sum = total
        else:
            onehot = np.eye(nodes)[self.node_of]                       # (n, nodes)
            node_sum = (y @ onehot) @ onehot.T                         # (..., n)
        g = self.node_size
        send_i = y * (g - 1)
        recv_i = node_sum - y
        t = np.maximum(send_i, recv_i) / self.intra_Bps
        if self.n > g.min():
            send_e = y * (self.n - g)
            recv_e = total - node_sum
            t = t + np.maximum(send_e, recv_e) / self.inter_Bps
        return self.a2a_alpha_s + t


@functools.lru_cache(maxsize=32)
def _calibrate_cached(ref: str, n: int) -> CommModel:
    from simulator.topology import load_topology
    return calibrate_comm(load_topology(ref), n, ref=ref)


def calibrate_comm(topo: Topology, n: int, *, ref: str | None = None) -> CommModel:
    """Fit :class:`CommModel` to the simulator's collectives on ranks ``0..n-1`` of ``topo``.

    Each fit runs the collective alone at 1 MiB and 256 MiB and takes the line through both.
    The all-to-all bandwidths come from one uniform exchange inside a host and one in which every
    rank sends only to other hosts (over at most 4 hosts, to keep calibration fast).
    """
    from simulator.collectives import simulate_collective
    mode = "symmetric" if n > 64 else "explicit"
    node_of = np.array([topo.node_of(r) for r in range(n)])
    _, inv, counts = np.unique(node_of, return_inverse=True, return_counts=True)
    node_of = inv.astype(int)
    node_size = counts[node_of].astype(float)
    s1, s2 = float(2 ** 20), float(2 ** 28)

    def fit(kind: str, ranks: Sequence[int]) -> tuple[float, float]:
        if len(ranks) < 2:
            return 0.0, math.inf
        t1 = simulate_collective(topo, kind, ranks, s1, mode=mode).time_s
        t2 = simulate_collective(topo, kind, ranks, s2, mode=mode).time_s
        bw = (s2 - s1) / max(t2 - t1, 1e-15)
        return max(0.0, t1 - s1 / bw), bw

    ranks = list(range(n))
    host0 = [r for r in ranks if node_of[r] == 0]
    fits = {"reducescatter": fit("reducescatter", ranks), "allgather": fit("allgather", ranks),
            "allreduce": fit("allreduce", ranks),
            "host_reducescatter": fit("reducescatter", host0),
            "host_allgather": fit("allgather", host0)}
    alpha = 0.0
    if n > 1:
        alpha = simulate_collective(topo, "alltoall", ranks, 64.0 * n, mode=mode).time_s
    intra = math.inf
    if len(host0) > 1:
        m = len(host0)
        a0 = simulate_collective(topo, "alltoall", host0, 64.0 * m).time_s
        t = simulate_collective(topo, "alltoall", host0, s2).time_s
        intra = (s2 * (m - 1) / m) / max(t - a0, 1e-15)
    inter = math.inf
    hosts = int(node_of.max()) + 1
    if hosts > 1:
        sub = [r for r in ranks if node_of[r] < min(hosts, 4)]
        k = len(sub)
        per = s2 / k
        mat = np.array([[per if node_of[i] != node_of[j] else 0.0 for j in sub] for i in sub])
        a0 = simulate_collective(topo, "alltoall", sub, 64.0 * k, mode=mode).time_s
        t = simulate_collective(topo, "alltoall", sub, s2, splits=mat, mode=mode).time_s
        inter = float(mat.sum(axis=1).max()) / max(t - a0, 1e-15)
    return CommModel(n=n, node_of=node_of, node_size=node_size, a2a_alpha_s=float(alpha),
                     intra_Bps=float(intra), inter_Bps=float(inter), fits=fits,
                     source=f"fitted to simulate_collective on {ref or topo.name}, "
                            f"ranks 0..{n - 1}")


class CostModel:
    """Per-shard features and per-rank costs of a plan for one model on ``n`` ranks.

    Features are additive per rank (:data:`FEATURES`); costs are a function of the per-rank
    feature matrix ``F`` (shape ``(..., n, K)``), vectorised over leading candidate axes so
    planners can score many moves at once.
    """

    def __init__(self, model: ModelSpec, topo: Topology, n: int, comm: CommModel,
                 hosts: Sequence[Sequence[int]], config: CostConfig | None = None) -> None:
        from simulator.compute import load_compute_profile
        self.model = model
        self.topo = topo
        self.n = n
        self.comm = comm
        self.hosts = tuple(tuple(h) for h in hosts)
        self.config = config or CostConfig()
        self.profile = load_compute_profile(topo.gpu)
        cfg = self.config
        self.hbm_Bps = float(topo.gpu.hbm_bandwidth_Bps) * cfg.hbm_efficiency
        self.launch_s = (self.profile.launch_overhead_s if cfg.kernel_launch_s is None
                         else cfg.kernel_launch_s)
        self.out_bytes = PRECISION_BYTES[model.comm_precision]
        self.batch = model.batch_size
        self.local_batch = model.batch_size / n
        self.accesses_per_row = np.array([self._apr(t) for t in model.tables])
        u = 1.0 / self.accesses_per_row
        h = cfg.repeat_hit_ratio
        self.miss = u + (1.0 - u) * (1.0 - h)
        self.host_of = np.empty(n, dtype=int)
        for k, hr in enumerate(self.hosts):
            self.host_of[list(hr)] = k

    # -- per-table statistics --------------------------------------------------------------
    def _apr(self, t: TableSpec) -> float:
        """Accesses per distinct row in one global batch (≥ lookups / rows, ≥ 1)."""
        lookups = self.batch * t.pooling_factor
        if lookups <= 0:
            return 1.0
        if t.zipf_exponent is not None:
            apr = zipf_reuse(float(t.zipf_exponent), t.num_embeddings, float(lookups))[1]
        else:
            apr = accesses_per_row(t.reuse_bins if t.reuse_bins is not None
                                   else default_reuse_bins())
        return max(1.0, apr, lookups / t.num_embeddings)

    def _state_bytes_per_row(self, t: TableSpec, cols: int) -> float:
        opt = self.model.optimizer
        if opt == "adam":
            return 2.0 * cols * t.bytes_per_element
        if opt == "adagrad":
            return 1.0 * cols * t.bytes_per_element
        if opt == "rowwise_adagrad":
            return 4.0
        return 0.0

    # -- features ----------------------------------------------------------------------------
    def shard_features(self, ti: int, shard: Shard, st: ShardingType) -> np.ndarray:
        """Additive features (:data:`FEATURES`) one shard puts on its rank."""
        t = self.model.tables[ti]
        cfg = self.config
        f = np.zeros(K)
        rows, cols = shard.rows, shard.cols
        p, o = t.bytes_per_element, self.out_bytes
        L = t.pooling_factor
        miss = self.miss[ti]
        if st == ShardingType.DATA_PARALLEL:
            ids = self.local_batch * L
            outputs = self.local_batch
        elif st in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
            ids = self.batch * L * rows / t.num_embeddings
            outputs = self.batch
        else:
            ids = self.batch * L
            outputs = self.batch
        gather = ids * (miss * cols * p + cfg.lookup_overhead_bytes + cfg.id_bytes)
        fwd = (gather + outputs * cols * o) / self.hbm_Bps + cfg.shard_overhead_s
        bwd = cfg.backward_multiplier * (fwd - cfg.shard_overhead_s) + cfg.shard_overhead_s
        if st == ShardingType.DATA_PARALLEL:
            state = self._state_bytes_per_row(t, cols) * rows
            bwd += (rows * cols * (2 * p + 2 * 4) + 2 * state) / self.hbm_Bps
            f[F_DP] = rows * cols * 4
        else:
            unique = min(ids / self.accesses_per_row[ti], rows)
            bwd += 2 * unique * self._state_bytes_per_row(t, cols) / self.hbm_Bps
        f[F_FWD] = fwd
        f[F_BWD] = bwd
        if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
            f[F_OUT] = cols * o
            f[F_IDS] = L * cfg.id_bytes + cfg.length_bytes
        elif st == ShardingType.ROW_WISE:
            f[F_IDS] = L * cfg.id_bytes * rows / t.num_embeddings + cfg.length_bytes
            f[F_RW] = self.batch * cols * o
        elif st == ShardingType.TABLE_ROW_WISE:
            g = len(self.hosts[self.host_of[shard.rank]])
            f[F_IDS] = L * cfg.id_bytes * rows / t.num_embeddings + cfg.length_bytes / g
            f[F_OUT] = cols * o / g
            f[F_HRS] = self.batch * cols * o
        f[F_MEM] = shard_memory_bytes(t, rows, cols, st, self.model.optimizer)
        return f

    def sharding_features(self, ts: TableSharding) -> np.ndarray:
        """Per-rank features ``(n, K)`` of one table's layout."""
        out = np.zeros((self.n, K))
        for s in ts.shards:
            out[s.rank] += self.shard_features(ts.table, s, ts.sharding_type)
        return out

    def plan_features(self, shardings: Sequence[TableSharding]) -> np.ndarray:
        """Per-rank features ``(n, K)`` of a whole plan."""
        out = np.zeros((self.n, K))
        for ts in shardings:
            out += self.sharding_features(ts)
        return out

    # -- costs ------------------------------------------------------------------------------
    def components(self, F: np.ndarray) -> dict[str, np.ndarray]:
        """Per-rank cost components (:data:`BREAKDOWN_KEYS`), seconds, shape ``F.shape[:-1]``."""
        F = np.asarray(F, dtype=float)
        b = self.local_batch
        c = self.comm
        out = {"lookup_fwd_s": F[..., F_FWD] + self.launch_s,
               "lookup_bwd_s": F[..., F_BWD] + 2 * self.launch_s}
        if self.n > 1:
            out["input_a2a_s"] = c.a2a_times(b * F[..., F_IDS])
            a2a = c.a2a_times(b * F[..., F_OUT])
            out["output_a2a_fwd_s"] = a2a
            out["output_a2a_bwd_s"] = a2a
        else:
            z = np.zeros(F.shape[:-1])
            out["input_a2a_s"] = out["output_a2a_fwd_s"] = out["output_a2a_bwd_s"] = z
        out["row_wise_comm_s"] = (c.time("reducescatter", F[..., F_RW])
                                  + c.time("allgather", F[..., F_RW]))
        out["table_row_wise_comm_s"] = (c.time("host_reducescatter", F[..., F_HRS])
                                        + c.time("host_allgather", F[..., F_HRS]))
        out["data_parallel_allreduce_s"] = c.time("allreduce", F[..., F_DP])
        return out

    def rank_costs(self, F: np.ndarray) -> np.ndarray:
        """Per-rank embedding cost, seconds (sum of :meth:`components`)."""
        comp = self.components(F)
        total = np.zeros(np.asarray(F).shape[:-1])
        for k in BREAKDOWN_KEYS:
            total = total + comp[k]
        return total

    def dense_costs(self) -> dict[str, float]:
        """Rank-independent dense part of a step, seconds: ``mlp_fwd_s``, ``mlp_bwd_s``
        (backward = 2 × forward FLOPs) and ``dense_allreduce_s`` (fp32 gradients)."""
        from simulator.compute import op_time
        d = self.model.dense
        if d is None:
            return {"mlp_fwd_s": 0.0, "mlp_bwd_s": 0.0, "dense_allreduce_s": 0.0}
        dims = [t.embedding_dim for t in self.model.tables]
        fwd = 0.0
        bwd = 0.0
        b = self.local_batch
        for block in d.layers(dims).values():
            for i, o in block:
                flops = 2.0 * b * i * o
                bytes_ = 4.0 * (i * o + b * (i + o))
                fwd += op_time(self.profile, flops=flops, bytes_moved=bytes_, dtype=d.dtype)
                bwd += 2 * op_time(self.profile, flops=flops, bytes_moved=bytes_, dtype=d.dtype)
        ar = float(self.comm.time("allreduce", d.param_count(dims) * 4.0)) if self.n > 1 else 0.0
        return {"mlp_fwd_s": fwd, "mlp_bwd_s": bwd, "dense_allreduce_s": ar}

    def a2a_matrices(self, F: np.ndarray) -> dict[str, np.ndarray]:
        """Byte matrices ``m[i, j]`` (rank i → j, zero diagonal) of the three all-to-alls."""
        b = self.local_batch
        n = self.n
        off = 1.0 - np.eye(n)
        ids = (b * np.asarray(F)[:, F_IDS])[None, :] * off        # i sends ids for j's shards
        out = (b * np.asarray(F)[:, F_OUT])[:, None] * off        # i sends its pooled outputs
        return {"input": ids, "output_fwd": out, "output_bwd": out.T.copy()}
