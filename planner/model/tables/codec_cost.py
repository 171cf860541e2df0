"""Seconds of compressing the pooled-embedding all-to-all (``model.compression``): what each
rank's codec adds to its lookups, and how much the gradients' all-to-all shrinks.

A table-wise, column-wise or table-row-wise shard compresses the pooled outputs it sends to
the other ranks (its rank keeps its own local share uncompressed); every rank decompresses the
outputs it receives (its local batch of every table). With ``compression.backward`` the
gradients go back compressed too: each rank compresses the gradients of its local batch and
each shard decompresses those it gets. Rates are the codec's measured bytes/s on a CPU or GPU
(:meth:`.compression.A2ACompression.throughput_Bps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec

__all__ = ["CodecCosts", "codec_costs"]

#: sharding types whose pooled outputs cross ranks through the all-to-all
_A2A_TYPES = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE,
              ShardingType.SUBSET_ROW_WISE, ShardingType.HIERARCHICAL_ROW_WISE)


@dataclass(frozen=True)
class CodecCosts:
    """The codec's costs for one model on ``n`` ranks (:func:`codec_costs`); all zero and
    every ratio 1 without compression.

    ``out_ratio[i]``: table ``i``'s compression ratio; ``decompress_fwd_s`` and
    ``compress_bwd_s``: each rank's fixed codec seconds (forward, backward);
    ``grad_scale``: the gradients' all-to-all bytes over the compressed forward's (1 when both
    are compressed alike or neither is; else the tables' bytes-weighted ratio, which undoes
    the forward's compression exactly when every table has the same bound)."""

    enabled: bool
    backward: bool
    compress_Bps: float
    decompress_Bps: float
    out_ratio: np.ndarray
    sent_share: float
    decompress_fwd_s: float
    compress_bwd_s: float
    grad_scale: float

    def shard_s(self, batch: float, cols: int, out_bytes: float, st: ShardingType,
                group: int = 1) -> tuple[float, float]:
        """(forward, backward) codec seconds one shard of ``cols`` columns adds on its rank
        for a global batch of ``batch`` samples; ``group``: the ranks of its host, for a
        table-row-wise or hierarchical-row-wise shard (which sends ``1/group`` of its outputs
        across hosts)."""
        if not self.enabled or st not in _A2A_TYPES:
            return 0.0, 0.0
        raw = batch * cols * out_bytes / group * self.sent_share
        return raw / self.compress_Bps, (raw / self.decompress_Bps if self.backward else 0.0)


def codec_costs(model: ModelSpec, n: int, out_bytes: float, device: str) -> CodecCosts:
    """The codec's costs of ``model.compression`` on ``n`` ranks of ``device`` (``"cpu"`` or
    ``"gpu"``), pooled outputs of ``out_bytes`` per element."""
    comp = model.compression
    sent_share = (n - 1) / n
    if comp is None:
        return CodecCosts(False, False, math.inf, math.inf, np.ones(len(model.tables)),
                          sent_share, 0.0, 0.0, 1.0)
    c_Bps, d_Bps = comp.throughput_Bps(device)
    ratio = np.array([comp.ratio(comp.bound(t.name), value_bytes=out_bytes)
                      for t in model.tables])
    pooled = model.batch_size / n * sum(t.embedding_dim for t in model.tables) * out_bytes \
        * sent_share
    grad_scale = 1.0 if comp.backward else comp.effective_ratio(
        [(t.name, t.embedding_dim) for t in model.tables], value_bytes=out_bytes)
    return CodecCosts(True, bool(comp.backward), c_Bps, d_Bps, ratio, sent_share,
                      pooled / d_Bps, pooled / c_Bps if comp.backward else 0.0, grad_scale)
