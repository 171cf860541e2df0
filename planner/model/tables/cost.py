"""Analytic per-rank cost of an embedding sharding, in seconds.

Notation: ``B`` global batch, ``n`` ranks, ``b = B / n`` local batch, a table with ``R`` rows,
pooling factor ``L`` (ids per sample), weight precision ``p`` bytes, pooled-output precision
``o`` bytes (``comm_precision``, or the dense dtype's when narrower and the trainer's
``embedding_output`` is ``dense``), HBM bandwidth ``H`` (``topo.gpu.hbm_bandwidth_Bps``).

**Lookups** (per shard, on its rank): forward and backward seconds from the ids and pooled
outputs it serves, its table's reuse and the device's lookup bandwidth, with the optimizer's
state traffic (:mod:`.lookup_cost`); with ``model.compression``, the codec's seconds
(:mod:`.codec_cost`).
**Kernel calls.** TorchRec groups a rank's shards by sharding type (one ``EmbeddingSharding``
each) and, inside one, by weight precision and kernel (``group_tables``), and runs one fused TBE
per group: a rank holding table-wise and row-wise fp32 shards makes two lookup calls forward and
two backward. Each call pays the fixed costs (the forward's launch, the backward's ``call_s``:
without a measured backward, two launches); a rank with no shard makes none. The per-rank
features count each group's shards (:meth:`CostModel.calls` counts the groups present).

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
its ``1/G`` share; data-parallel tables an all-reduce of their fp32 gradient. A subset-row-wise
shard (HugeCTR's split table) joins both all-to-alls as a table-wise shard does, with its share
of the ids in and a whole partial sum per sample out. All collective times
are ``alpha + size / bandwidth`` fitted to the simulator's own collectives on the plan's topology
(:func:`calibrate_comm`), so a slower fabric or a multi-node plan costs what the simulator says.

**CPU profile.** On a topology whose GPU kind is ``cpu`` (``localhost-gloo``: this machine, one
gloo process per "device") the constants above are not priors but measurements:
:func:`load_cpu_profile` reads ``traces/calibration/cpu-embedding.yaml`` (written by
``clusterplan calibrate embedding`` from kernel and collective microbenchmarks, see
:mod:`planner.measure.tables.fit`) and the model takes from it the lookup bandwidth ``H`` (instead of
HBM × efficiency), ``lookup_overhead_bytes``, ``repeat_hit_ratio``, ``backward_multiplier``,
``shard_overhead_s``, the per-call ``kernel_launch_s`` and the cost of a half-precision element
in byte-equivalents (``element_bytes``: a CPU converts fp16 rows, so they do not cost half of
fp32), and its collectives from the gloo fits for the plan's world size instead of the
simulator: the all-to-all ``alpha + max(sent, received) / Bps`` of the busiest rank, the same for
every rank (:class:`~.comm_model.SyncCommModel`: processes sharing a few cores finish together;
measured per-rank times do not follow per-rank volumes), the others ``alpha + bytes / Bps``.
``CostConfig(device_profile=None)`` turns this off; GPU topologies never use it.

A rank's embedding cost (:meth:`CostModel.rank_costs`) is the sum of its lookups forward and
backward, the ids all-to-all, the output all-to-all forward and backward, and the row-wise,
table-row-wise and data-parallel collectives. The step does not pay the slowest rank's sum:
every all-to-all and collective waits for all its ranks, so each of these phases costs its
own slowest rank, and a plan whose ranks are even in total but not phase by phase (one rank
heavy in lookups, another in outputs) pays both. :meth:`CostModel.step_cost` is that sum of
per-phase maxima, what the planners minimise. The dense part (MLPs and their all-reduce) is
the same on every rank and is reported separately (:meth:`CostModel.dense_costs`), except a
bottom MLP that rank 0 alone runs on the global batch (the trainer's ``bottom_mlp: rank0``,
DeepLearningExamples' PyTorch DLRM): its time joins rank 0's lookup phases and its output
rank 0's pooled all-to-all, so the planners see the rank it loads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from simulator.compute import load_compute_profile
from simulator.topology import Topology

from planner.model.llm.host import host_overhead_for
from planner.model.tables.codec_cost import codec_costs
from planner.model.tables.comm_model import CommModel
from planner.model.tables.cost_config import CostConfig, device_profile_for
from planner.model.tables.cpu_profile import BackwardTerms
from planner.model.tables.dense import DenseTimes
from planner.model.tables.dense_part import DensePart
from planner.model.tables.features import (BREAKDOWN_KEYS, F_BWD, F_DP, F_FWD, F_HRS, F_IDS,
                                           F_MEM, F_OUT, F_RW, K, kernel_groups, step_cost_of)
from planner.model.tables.extrapolation import lookup_extrapolated
from planner.model.tables.gpu_lookup import FitRange, load_gpu_lookup
from planner.model.tables.lookup_cost import (SparseGradPath, shard_lookup_s, shard_traffic,
                                              table_accesses_per_row)
from planner.model.tables.memory import shard_memory_bytes
from planner.model.tables.shards import HOST_REDUCED_TYPES, Shard, ShardingType, TableSharding
from planner.model.tables.spec import PRECISION_BYTES, ModelSpec

__all__ = ["CostModel"]


class CostModel(DensePart):
    """Per-shard features and per-rank costs of a plan for one model on ``n`` ranks.

    Features are additive per rank (:data:`FEATURES`, then one count of shards per lookup
    group, :attr:`groups`); costs are a function of the per-rank feature matrix ``F`` (shape
    ``(..., n, width)``), vectorised over leading candidate axes so planners can score many
    moves at once.
    """

    def __init__(self, model: ModelSpec, topo: Topology, n: int, comm: CommModel,
                 hosts: Sequence[Sequence[int]], config: CostConfig | None = None) -> None:
        self.model = model
        self.topo = topo
        self.n = n
        self.comm = comm
        self.hosts = tuple(tuple(h) for h in hosts)
        self.config = config or CostConfig()
        self.profile = load_compute_profile(topo.gpu)
        self.device_profile = device_profile_for(topo, self.config)
        #: the measured ranges of the lookup fit in use (None: priors, nothing measured)
        self.fit_range: FitRange | None = None
        self.gpu_lookup = None
        if self.device_profile is not None:
            self.config = replace(self.config, **self.device_profile.cost_overrides())
            self.comm = comm = self.device_profile.comm_model(n, comm)
            self.fit_range = self.device_profile.fit_range
        elif self.config.device_profile is not None and topo.gpu.name != "cpu":
            self.gpu_lookup = gl = load_gpu_lookup(topo.gpu.name)
            if gl is not None:
                self.config = replace(self.config, **gl.cost_overrides())
                if gl.backward is not None:
                    self.config = replace(self.config, backward=BackwardTerms(
                        shard_s=0.0, walk_bytes=0.0, **gl.backward))
                self.fit_range = gl.range
        cfg = self.config
        self.hbm_Bps = float(topo.gpu.hbm_bandwidth_Bps) * cfg.hbm_efficiency
        #: byte-equivalents per weight element in the lookup terms (the CPU profile's fitted
        #: cost of half-precision rows; else the storage bytes)
        self.lookup_element_bytes: dict[str, float] = {}
        if self.device_profile is not None:
            self.hbm_Bps = self.device_profile.lookup_Bps
            self.lookup_element_bytes = dict(self.device_profile.element_bytes)
        self.launch_s = (self.profile.launch_overhead_s if cfg.kernel_launch_s is None
                         else cfg.kernel_launch_s)
        scale = float(cfg.lookup_time_scale)
        if not scale > 0:
            raise ValueError(f"lookup_time_scale must be > 0, got {scale}")
        if scale != 1.0:                 # every lookup term scales: bandwidth, overheads, launch
            self.hbm_Bps /= scale
            self.launch_s *= scale
            self.config = cfg = replace(
                cfg, shard_overhead_s=cfg.shard_overhead_s * scale,
                backward=None if cfg.backward is None else cfg.backward.scaled(scale))
        #: fixed seconds of one forward and one backward lookup call
        self.fwd_call_s = self.launch_s
        self.bwd_call_s = (2 * self.launch_s if cfg.backward is None
                           else cfg.backward.call_s)
        #: the trainer's sparse-gradient path (None: the fused backward)
        self.sparse_grad = self._sparse_grad_path()
        #: the lookup groups (one fused call each on a rank that holds any of its shards) and
        #: their feature columns; a feature row is ``width`` long
        self.groups = kernel_groups(model)
        self.group_col = {g: K + i for i, g in enumerate(self.groups)}
        self.width = K + len(self.groups)
        #: bytes per element of the pooled outputs and their gradients (the trainer's
        #: embedding output, at most the spec's comm precision)
        self.out_bytes = model.trainer.pooled_bytes(
            PRECISION_BYTES[model.comm_precision],
            model.dense.dtype if model.dense is not None else None)
        if self.sparse_grad is not None:
            self._price_sparse_grad_calls()
        self.batch = model.batch_size
        self.local_batch = model.batch_size / n
        #: whether the ids cross ranks in the ids all-to-all (not when each loader reads them)
        self.ids_alltoall = model.trainer.ids_alltoall
        self.codec = codec_costs(model, n, self.out_bytes,
                                 "cpu" if topo.gpu.name == "cpu" else "gpu")
        self.out_ratio = self.codec.out_ratio
        self.decompress_fwd_s = self.codec.decompress_fwd_s
        self.compress_bwd_s = self.codec.compress_bwd_s
        self.grad_scale = self.codec.grad_scale
        self.accesses_per_row = np.array([table_accesses_per_row(t, self.batch)
                                          for t in model.tables])
        self._dense_times: DenseTimes | None = None
        #: rank 0 alone runs the bottom MLP on the global batch (the trainer's ``bottom_mlp``)
        self.bottom_on_rank0 = (model.trainer.bottom_on_rank0 and n > 1
                                and model.dense is not None and bool(model.dense.bottom_mlp))
        self._bottom_rank0: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.host_of = np.empty(n, dtype=int)
        for k, hr in enumerate(self.hosts):
            self.host_of[list(hr)] = k

    # -- the sparse-gradient path -------------------------------------------------------
    def _sparse_grad_path(self) -> SparseGradPath | None:
        """The trainer's sparse-gradient path on this device (``embedding_update``
        ``sparse_grad`` or ``scatter_add``): its streamed passes at the memory curve's large-op
        bandwidth; a scaling pass under an fp16 dense part's loss scale, and always under
        ``scatter_add`` with SGD; repeated ids merged for an optimizer with state."""
        if not self.model.trainer.sparse_grad:
            return None
        d = self.model.dense
        sgd = self.model.optimizer == "sgd"
        scale = (d is not None and d.dtype == "fp16") or (
            self.model.trainer.embedding_update == "scatter_add" and sgd)
        stream = float(self.topo.gpu.hbm_bandwidth_Bps) * self.profile.memory.points[-1][1]
        return SparseGradPath(stream_Bps=stream, scale_pass=scale, dedup=not sgd,
                              merged_bags=self.model.trainer.embedding_update == "scatter_add")

    def _price_sparse_grad_calls(self) -> None:
        """Fixed seconds of a lookup call on the sparse-gradient path: one op per pass (the
        lookup, a cast to the embedding output's dtype when narrower, forward; the cast back,
        the scaling pass, the merge of repeated ids, the add, backward), each at least the
        host's dispatch under eager PyTorch."""
        host = (host_overhead_for(self.topo.gpu.name)
                if self.model.trainer.dispatch == "eager" else None)
        fwd_op = max(self.launch_s, host.forward_op_s if host else 0.0)
        bwd_op = max(self.launch_s, host.backward_op_s if host else 0.0)
        cast = int(self.out_bytes < 4.0)
        self.fwd_call_s = fwd_op * (1 + cast)
        path = self.sparse_grad
        self.bwd_call_s = bwd_op * (1 + cast + int(path.scale_pass) + 2 * int(path.dedup))

    # -- all-to-all compression ---------------------------------------------------------
    def shard_codec_s(self, ti: int, shard: Shard, st: ShardingType) -> tuple[float, float]:
        """(forward, backward) codec seconds one shard adds on its rank
        (:meth:`.codec_cost.CodecCosts.shard_s`)."""
        group = len(self.hosts[self.host_of[shard.rank]]) if st in HOST_REDUCED_TYPES else 1
        return self.codec.shard_s(self.batch, shard.cols, self.out_bytes, st, group)

    def plan_codec_s(self, shardings) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the (forward, backward) codec seconds inside its lookup features."""
        fwd, bwd = np.zeros(self.n), np.zeros(self.n)
        for ts in shardings:
            for sh in ts.shards:
                c_f, c_b = self.shard_codec_s(ts.table, sh, ts.sharding_type)
                fwd[sh.rank] += c_f
                bwd[sh.rank] += c_b
        return fwd, bwd

    # -- features ----------------------------------------------------------------------------
    def shard_features(self, ti: int, shard: Shard, st: ShardingType) -> np.ndarray:
        """Additive features (:data:`FEATURES`) one shard puts on its rank."""
        t = self.model.tables[ti]
        cfg = self.config
        f = np.zeros(self.width)
        f[self.group_col[st, t.precision]] = 1.0
        rows, cols = shard.rows, shard.cols
        o, L = self.out_bytes, t.pooling_factor
        ids, outputs = shard_traffic(t, rows, st, self.batch, self.local_batch)
        f[F_FWD], f[F_BWD] = shard_lookup_s(
            t, rows, cols, st, ids=ids, outputs=outputs, apr=self.accesses_per_row[ti],
            cfg=cfg, Bps=self.hbm_Bps, out_bytes=o, optimizer=self.model.optimizer,
            element_bytes=self.lookup_element_bytes.get(t.precision, t.bytes_per_element),
            sparse=self.sparse_grad)
        if st == ShardingType.DATA_PARALLEL:
            f[F_DP] = rows * cols * 4
        r = self.out_ratio[ti]                   # the all-to-all's compression of this table
        c_fwd, c_bwd = self.shard_codec_s(ti, shard, st)
        f[F_FWD] += c_fwd
        f[F_BWD] += c_bwd
        if st in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
            f[F_OUT] = cols * o / r
            f[F_IDS] = L * cfg.id_bytes + cfg.length_bytes
        elif st == ShardingType.ROW_WISE:
            f[F_IDS] = L * cfg.id_bytes * rows / t.num_embeddings + cfg.length_bytes
            f[F_RW] = self.batch * cols * o
        elif st == ShardingType.SUBSET_ROW_WISE:         # partial sums to every sample's rank
            f[F_IDS] = L * cfg.id_bytes * rows / t.num_embeddings + cfg.length_bytes
            f[F_OUT] = cols * o / r
        elif st in HOST_REDUCED_TYPES:       # reduce-scattered in the host, then all-to-all
            g = len(self.hosts[self.host_of[shard.rank]])
            f[F_IDS] = L * cfg.id_bytes * rows / t.num_embeddings + cfg.length_bytes / g
            f[F_OUT] = cols * o / g / r
            f[F_HRS] = self.batch * cols * o
        f[F_MEM] = shard_memory_bytes(t, rows, cols, st, self.model.optimizer)
        return f

    def sharding_features(self, ts: TableSharding) -> np.ndarray:
        """Per-rank features ``(n, width)`` of one table's layout."""
        out = np.zeros((self.n, self.width))
        seen: dict[tuple, np.ndarray] = {}
        for s in ts.shards:
            key = (s.rows, s.cols, len(self.hosts[self.host_of[s.rank]])
                   if ts.sharding_type in HOST_REDUCED_TYPES else 0)
            if key not in seen:       # a shard's features follow its size (and host's size)
                seen[key] = self.shard_features(ts.table, s, ts.sharding_type)
            out[s.rank] += seen[key]
        return out

    def plan_features(self, shardings: Sequence[TableSharding]) -> np.ndarray:
        """Per-rank features ``(n, width)`` of a whole plan."""
        out = np.zeros((self.n, self.width))
        for ts in shardings:
            out += self.sharding_features(ts)
        return out

    # -- costs ------------------------------------------------------------------------------
    def calls(self, F: np.ndarray) -> np.ndarray:
        """Fused lookup calls per rank (groups with a shard there), shape ``F.shape[:-1]``."""
        return np.count_nonzero(np.asarray(F)[..., K:] > 0.5, axis=-1).astype(float)

    def call_s(self, F: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per rank, the fixed seconds of its lookup calls: (forward, backward)."""
        calls = self.calls(F)
        return self.fwd_call_s * calls, self.bwd_call_s * calls

    def components(self, F: np.ndarray) -> dict[str, np.ndarray]:
        """Per-rank cost components (:data:`BREAKDOWN_KEYS`), seconds, shape ``F.shape[:-1]``."""
        F = np.asarray(F, dtype=float)
        b = self.local_batch
        c = self.comm
        fixed_fwd, fixed_bwd = self.call_s(F)
        bottom_fwd, bottom_bwd, bottom_out = self.bottom_rank0_terms()
        out = {"lookup_fwd_s": F[..., F_FWD] + fixed_fwd + self.decompress_fwd_s + bottom_fwd,
               "lookup_bwd_s": F[..., F_BWD] + fixed_bwd + self.compress_bwd_s + bottom_bwd}
        if self.n > 1:
            out["input_a2a_s"] = c.a2a_times(b * F[..., F_IDS]) if self.ids_alltoall \
                else np.zeros(F.shape[:-1])
            sent = F[..., F_OUT] + bottom_out
            a2a = c.a2a_times(b * sent)
            out["output_a2a_fwd_s"] = a2a
            out["output_a2a_bwd_s"] = a2a if self.grad_scale == 1.0 else \
                c.a2a_times(b * (F[..., F_OUT] * self.grad_scale + bottom_out))
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

    def step_cost(self, F: np.ndarray) -> np.ndarray | float:
        """The embedding part of one step, seconds: each component's slowest rank, summed
        (ranks synchronise at every collective, see the module docstring). ``F`` is
        ``(..., ranks, width)``; the result has the leading shape (a float for one plan). Never
        below the slowest rank's :meth:`rank_costs`."""
        return step_cost_of(self.components(F))

    def extrapolated(self) -> list[str]:
        """Where the lookup model is used outside what it was fitted to
        (:func:`.extrapolation.lookup_extrapolated`)."""
        return lookup_extrapolated(self)

    def a2a_matrices(self, F: np.ndarray) -> dict[str, np.ndarray]:
        """Byte matrices ``m[i, j]`` (rank i → j, zero diagonal) of the three all-to-alls."""
        b = self.local_batch
        n = self.n
        off = 1.0 - np.eye(n)
        ids = (b * np.asarray(F)[:, F_IDS])[None, :] * off        # i sends ids for j's shards
        if not self.ids_alltoall:
            ids = np.zeros((n, n))
        out = (b * np.asarray(F)[:, F_OUT])[:, None] * off        # i sends its pooled outputs
        bottom = (b * self.bottom_rank0_terms()[2])[:, None] * off  # rank 0's bottom outputs
        return {"input": ids, "output_fwd": out + bottom,
                "output_bwd": out.T * self.grad_scale + bottom.T}
