"""The collectives TorchRec 1.8.0 actually issues in a DLRM step of a sharding plan.

:func:`planner.workloads.dlrm.step.build_step_workload` models a step with three averaged
all-to-alls (ids, pooled forward, pooled backward), one row-wise reduce-scatter / all-gather pair
and two all-reduces. A real ``DistributedModelParallel`` step (seen through a logging wrapper of
``torch.distributed`` on gloo, ``clusterplan validate``) issues more and different calls; this
module lists them as it issues them, for one concrete batch (``ids``), so that every call's
kind, process group, bytes, all-to-all split sizes and order can be compared exactly
(:mod:`planner.workloads.dlrm.torchrec` builds the step around them):

forward, per sharding type with an input dist (table-wise, column-wise, row-wise, table-row-wise,
in the order the types first appear among the tables)
    1. a splits all-to-all per type (``KJTAllToAll``: 3 int64 per rank pair, equal splits);
    2. per type a lengths all-to-all (int64, ``batch/N`` per feature and destination shard) and a
       values all-to-all (int64 ids; row-wise and table-row-wise ids bucketised by row block);
    3. per type the pooled-embedding dist: table-/column-wise an all-to-all of the pooled rows
       (``batch/N × dims`` fp32 per pair), row-wise a reduce-scatter over the world
       (``batch × dims``), table-row-wise a reduce-scatter in each host's group followed by an
       all-to-all across hosts between ranks of the same local index;
backward
    4. the pooled dists' backward in reverse type order (all-to-alls with the transposed splits,
       row-wise all-gather; table-row-wise its cross-host all-to-all): TorchRec's output is a
       ``LazyAwaitable`` whose wait (an autograd node issuing the backward call) happens when
       the pooled embeddings are first read, after the bottom MLP, so the autograd engine runs
       these nodes before the bottom MLP's backward;
    5. the dense part's DDP all-reduce, one per gradient bucket (bucket cap 25 MiB), once the
       bottom MLP's gradients are ready;
    6. the data-parallel tables' DDP all-reduce (1 MiB first bucket, then 25 MiB);
    7. table-row-wise: the in-host all-gather.

Collectives on a group of one rank are not issued. Channels are process groups: ``world``,
``intra`` (the ranks of one host) and ``cross`` (one local index across hosts); order is
compared within a channel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from planner.model.tables.ids import table_ids
from planner.model.tables.shards import HUGECTR_TYPES, ShardingType, TableSharding

__all__ = ["CommOp", "torchrec_comm_ops", "torchrec_step_ops", "rank_events", "ddp_buckets",
           "INPUT_DIST_ORDER", "KJT_SPLITS", "FLOAT_BYTES"]

#: int64 entries per rank pair in KJTAllToAll's first (splits) all-to-all
KJT_SPLITS = 3
ID_BYTES = 8          # int64 lengths and ids
FLOAT_BYTES = 4       # fp32 pooled embeddings and gradients
DENSE_BUCKET_BYTES = 25 * 1024 * 1024       # DMP's DDP (bucket_cap_mb=25 for every bucket)
DP_FIRST_BUCKET_BYTES = 1024 * 1024         # ShardedEBC's DDP of data-parallel lookups: defaults
DP_BUCKET_BYTES = 25 * 1024 * 1024

TW, CW, RW, TWRW, DP = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE,
                        ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL)
INPUT_DIST_ORDER = (TW, CW, RW, TWRW)


@dataclass
class CommOp:
    """One collective of the step on one group.

    ``matrix`` (all-to-alls): bytes rank ``group[i]`` sends to ``group[j]``, the diagonal
    included (what ``all_to_all_single`` is given); ``size`` (others): the full buffer, bytes.
    """

    name: str
    kind: str                      # alltoall | reducescatter | allgather | allreduce
    group: tuple[int, ...]
    channel: str                   # world | intra | cross
    phase: str                     # fwd | bwd
    size: float = 0.0
    matrix: np.ndarray | None = None
    deps: list = field(default_factory=list)

    def event(self, rank: int) -> tuple:
        """``(kind, bytes, send splits, receive splits)`` of ``rank``'s call (bytes: what it
        sends for an all-to-all, the full buffer otherwise)."""
        if self.matrix is None:
            return (self.kind, int(self.size), (), ())
        i = self.group.index(rank)
        send = tuple(int(x) for x in self.matrix[i])
        recv = tuple(int(x) for x in self.matrix[:, i])
        return (self.kind, sum(send), send, recv)


def ddp_buckets(sizes: Sequence[int], first: int, cap: int) -> list[int]:
    """Bytes per DDP gradient bucket: parameters in reverse order, a bucket closes once it
    reaches its limit (``first`` for the first, ``cap`` after)."""
    out, cur, limit = [], 0, first
    for s in reversed(list(sizes)):
        cur += s
        if cur >= limit:
            out.append(cur)
            cur, limit = 0, cap
    if cur:
        out.append(cur)
    return out


def _types_in_order(shardings: Sequence[TableSharding]) -> list[ShardingType]:
    seen: list[ShardingType] = []
    for ts in sorted(shardings, key=lambda t: t.table):
        if ts.sharding_type not in seen:
            seen.append(ts.sharding_type)
    return seen


def torchrec_comm_ops(shardings: Sequence[TableSharding], dims: Sequence[int],
                      lengths: Sequence[np.ndarray], ids: Sequence[np.ndarray], *, world: int,
                      local_world: int, dense_param_sizes: Sequence[int] = (),
                      rebuilt: bool = False) -> list[CommOp]:
    """Every collective of one step, in issue order (see the module docstring).

    ``rebuilt``: DDP has rebuilt its buckets (every step after a model's first): the data-
    parallel tables' gradients then go in one all-reduce of their total, whatever its size
    (measured in real runs: 1.3 MB + 20.6 MB in step 0, one 21.9 MB all-reduce after; six
    buckets of 30.7 MB in step 0, one 175 MB all-reduce after).

    ``lengths[t]`` / ``ids[t]``: the global batch of table ``t`` (bag lengths, ``batch`` of them,
    and the concatenated row ids; rank ``r`` holds samples ``r·B .. (r+1)·B - 1``);
    ``dense_param_sizes``: bytes of each dense parameter in registration order (the DDP of
    ``DistributedModelParallel``)."""
    n, lws = world, local_world
    hugectr = [ts.sharding_type.value for ts in shardings if ts.sharding_type in HUGECTR_TYPES]
    if hugectr:
        raise ValueError(f"{hugectr[0]} is HugeCTR's layout: TorchRec issues no collectives "
                         "for it")
    batch = len(lengths[0]) if len(lengths) else 0
    if batch % n:
        raise ValueError(f"global batch {batch} is not divisible by {n} ranks")
    B = batch // n
    hosts = [tuple(range(h * lws, (h + 1) * lws)) for h in range(n // lws)]
    world_g = tuple(range(n))
    offs = [np.concatenate([[0], np.cumsum(x)]).astype(np.int64) for x in lengths]

    by_type: dict[ShardingType, list[TableSharding]] = {}
    for ts in sorted(shardings, key=lambda t: t.table):
        by_type.setdefault(ts.sharding_type, []).append(ts)
    types = [t for t in _types_in_order(shardings) if t != DP]
    ops: list[CommOp] = []
    # 1. splits all-to-alls
    for st in types:
        _add_alltoall(ops, f"{st.value} kjt splits a2a", world_g, "world", "fwd",
                      np.full((n, n), KJT_SPLITS * ID_BYTES))
    # 2. lengths and values
    for st in types:
        lm, vm = _input_dist_bytes(by_type[st], st, ids, offs, n, B)
        _add_alltoall(ops, f"{st.value} lengths a2a", world_g, "world", "fwd", lm)
        _add_alltoall(ops, f"{st.value} values a2a", world_g, "world", "fwd", vm)
    # 3. pooled dists (forward), remembering each type's backward
    stage1, stage2 = [], []
    for st in types:
        _pooled_dist(ops, st, by_type[st], dims, hosts, lws, n, B, stage1, stage2)
    # 4. pooled dists backward, reverse type order
    for item in reversed(stage1):
        _add_backward(ops, item)
    # 5. dense DDP, 6. data-parallel tables
    if n > 1:
        _add_ddp_allreduces(ops, dense_param_sizes, by_type.get(DP, []), world_g, rebuilt)
    # 7. table-row-wise in-host all-gather
    for item in reversed(stage2):
        _add_backward(ops, item)
    return ops


def _add_alltoall(ops: list[CommOp], name: str, group, channel: str, phase: str, mat) -> None:
    """Append an all-to-all of byte matrix ``mat`` on ``group`` (none on a group of one)."""
    if len(group) > 1:
        ops.append(CommOp(name, "alltoall", tuple(group), channel, phase,
                          matrix=np.asarray(mat, dtype=np.int64)))


def _input_dist_bytes(tables: list[TableSharding], st: ShardingType, ids, offs, n: int,
                      B: int) -> tuple[np.ndarray, np.ndarray]:
    """Bytes rank ``s`` sends rank ``d`` in sharding type ``st``'s lengths and values
    all-to-alls (row-wise types send each shard only the ids in its rows)."""
    lm = np.zeros((n, n), dtype=np.int64)
    vm = np.zeros((n, n), dtype=np.int64)
    for ts in tables:
        t = ts.table
        for s in range(n):
            mine = ids[t][offs[t][s * B]:offs[t][(s + 1) * B]]
            for sh in ts.shards:
                lm[s, sh.rank] += B * ID_BYTES
                if st in (RW, TWRW):
                    k = int(((mine >= sh.row_offset) & (mine < sh.row_offset + sh.rows)).sum())
                else:
                    k = len(mine)
                vm[s, sh.rank] += k * ID_BYTES
    return lm, vm


def _pooled_dist(ops: list[CommOp], st: ShardingType, tables: list[TableSharding],
                 dims: Sequence[int], hosts: list[tuple[int, ...]], lws: int, n: int,
                 B: int, stage1: list, stage2: list) -> None:
    """Append sharding type ``st``'s pooled-embedding dist (forward) to ``ops``, and its
    backward calls as ``(kind, name, group, channel, matrix or size)`` items to ``stage1``
    (issued before the DDP all-reduces) and ``stage2`` (after them); ``lws`` ranks per host."""
    world_g = tuple(range(n))
    if st in (TW, CW):
        per_rank = np.zeros(n, dtype=np.int64)
        for ts in tables:
            for sh in ts.shards:
                per_rank[sh.rank] += sh.cols
        mat = np.repeat((per_rank * B * FLOAT_BYTES)[:, None], n, axis=1)
        _add_alltoall(ops, f"{st.value} pooled a2a", world_g, "world", "fwd", mat)
        stage1.append(("alltoall", f"{st.value} pooled grad a2a", world_g, "world", mat.T))
    elif st == RW:
        d = sum(dims[ts.table] for ts in tables)
        size = n * B * d * FLOAT_BYTES
        if n > 1:
            ops.append(CommOp(f"{st.value} pooled reduce-scatter", "reducescatter", world_g,
                              "world", "fwd", size=size))
        stage1.append(("allgather", f"{st.value} pooled grad all-gather", world_g, "world",
                       size))
    elif st == TWRW:
        dh = [sum(dims[ts.table] for ts in tables if ts.shards[0].rank in hg) for hg in hosts]
        for h, hg in enumerate(hosts):
            if len(hg) > 1:
                ops.append(CommOp(f"{st.value} pooled reduce-scatter host {h}",
                                  "reducescatter", hg, "intra", "fwd",
                                  size=n * B * dh[h] * FLOAT_BYTES))
        cross = []
        for loc in range(lws):
            g = tuple(hg[loc] for hg in hosts)
            mat = np.repeat(np.array([B * dh[h] * FLOAT_BYTES for h in range(len(hosts))],
                                     dtype=np.int64)[:, None], len(hosts), axis=1)
            _add_alltoall(ops, f"{st.value} pooled cross-host a2a l{loc}", g, "cross", "fwd", mat)
            cross.append(("alltoall", f"{st.value} pooled grad cross-host a2a l{loc}", g,
                          "cross", mat.T))
        stage1.append(cross)
        stage2.append([("allgather", f"{st.value} pooled grad all-gather host {h}", hg,
                        "intra", n * B * dh[h] * FLOAT_BYTES)
                       for h, hg in enumerate(hosts)])


def _add_backward(ops: list[CommOp], item) -> None:
    """Append the backward call(s) of one ``stage1``/``stage2`` item (a tuple or a list of
    them; none on a group of one)."""
    for kind, name, g, ch, x in (item if isinstance(item, list) else [item]):
        if len(g) < 2:
            continue
        if kind == "alltoall":
            ops.append(CommOp(name, kind, g, ch, "bwd", matrix=np.asarray(x)))
        else:
            ops.append(CommOp(name, kind, g, ch, "bwd", size=x))


def _add_ddp_allreduces(ops: list[CommOp], dense_param_sizes: Sequence[int],
                        dp: list[TableSharding], world_g: tuple[int, ...], rebuilt: bool) -> None:
    """Append the DDP all-reduces over the world, one per gradient bucket (bytes): the dense
    part's, then the data-parallel tables' (one of their total once DDP has ``rebuilt``)."""
    for k, b in enumerate(ddp_buckets(dense_param_sizes, DENSE_BUCKET_BYTES,
                                      DENSE_BUCKET_BYTES)):
        ops.append(CommOp(f"dense ddp all-reduce b{k}", "allreduce", world_g, "world", "bwd",
                          size=b))
    if dp:
        sizes = [ts.shards[0].rows * ts.shards[0].cols * FLOAT_BYTES for ts in dp]
        buckets = [sum(sizes)] if rebuilt else ddp_buckets(sizes, DP_FIRST_BUCKET_BYTES,
                                                              DP_BUCKET_BYTES)
        for k, b in enumerate(buckets):
            ops.append(CommOp(f"data-parallel tables ddp all-reduce b{k}", "allreduce", world_g,
                              "world", "bwd", size=b))


def rank_events(ops: Sequence[CommOp], rank: int) -> dict[str, list[tuple]]:
    """``{channel: [(kind, bytes, send splits, receive splits, name), ...]}`` of one rank.

    Channels are keyed ``"world"``, ``"intra [0, 1]"``, ``"cross [0, 2]"`` (the group's ranks)."""
    out: dict[str, list[tuple]] = {}
    for op in ops:
        if rank in op.group:
            key = "world" if op.channel == "world" else f"{op.channel} {list(op.group)}"
            out.setdefault(key, []).append(op.event(rank) + (op.name,))
    return out


def torchrec_step_ops(problem, shardings: Sequence[TableSharding], *, seed: int = 0,
                      local_world: int | None = None) -> list[CommOp]:
    """:func:`torchrec_comm_ops` for one seeded global batch drawn from the tables' access
    distributions (:func:`planner.measure.tables.plans.table_ids`), the problem's dense part and
    its hosts (``local_world``: ranks per host, default the topology's)."""
    m = problem.model
    n = problem.devices
    batch = int(m.batch_size)
    if batch % n:
        batch = max(n, batch - batch % n)
    lengths, ids = [], []
    for i, t in enumerate(m.tables):
        x = table_ids(t, batch, seed=seed, index=i)
        lengths.append(np.diff(x.offsets).astype(np.int64))
        ids.append(np.asarray(x.indices, dtype=np.int64))
    lws = local_world or len(problem.hosts[0])
    d = m.dense
    sizes: list[int] = []
    if d is not None:
        sizes = [int(d.param_count([t.embedding_dim for t in m.tables])
                     * m.trainer.gradient_bytes(d.dtype))]
    return torchrec_comm_ops(shardings, [t.embedding_dim for t in m.tables], lengths, ids,
                             world=n, local_world=lws, dense_param_sizes=sizes)
