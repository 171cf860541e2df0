"""The per-rank feature row a sharding plan is priced by, and the cost components summed into
a step (:class:`~.cost.CostModel`).

A rank's features are additive over its shards: :data:`FEATURES` (seconds, bytes per sample
and bytes, named by the ``F_*`` column indices), then one count of shards per fused lookup
group (:func:`kernel_groups`). Planners add and subtract feature rows to score moves; the
cost model turns a row into the seconds of :data:`BREAKDOWN_KEYS`.
"""

from __future__ import annotations

import numpy as np

from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import ModelSpec

__all__ = ["FEATURES", "BREAKDOWN_KEYS", "K", "F_FWD", "F_BWD", "F_OUT", "F_IDS", "F_RW",
           "F_DP", "F_HRS", "F_MEM", "step_cost_of", "kernel_groups"]

#: per-rank additive features of a plan (see :meth:`.cost.CostModel.shard_features`):
#: lookup seconds forward and backward, all-to-all bytes per sample of pooled outputs and of
#: ids, row-wise, data-parallel and table-row-wise collective bytes, memory bytes
FEATURES = ("fwd_s", "bwd_s", "out_Bps", "ids_Bps", "rw_bytes", "dp_bytes", "twrw_bytes",
            "mem_bytes")
F_FWD, F_BWD, F_OUT, F_IDS, F_RW, F_DP, F_HRS, F_MEM = range(len(FEATURES))
#: the additive features every model has; a model's own lookup groups follow them (see
#: :func:`kernel_groups`), so a feature row is ``CostModel.width`` long
K = len(FEATURES)

#: the embedding part of a step, component by component (seconds per rank)
BREAKDOWN_KEYS = ("lookup_fwd_s", "lookup_bwd_s", "input_a2a_s", "output_a2a_fwd_s",
                  "output_a2a_bwd_s", "row_wise_comm_s", "table_row_wise_comm_s",
                  "data_parallel_allreduce_s")


def step_cost_of(components) -> np.ndarray | float:
    """Σ over :data:`BREAKDOWN_KEYS` of the slowest rank's time (last axis), seconds: the
    embedding part of a step whose ranks wait for each other at every collective."""
    total = sum(np.asarray(components[k], dtype=float).max(axis=-1) for k in BREAKDOWN_KEYS
                if k in components)
    return float(total) if np.ndim(total) == 0 else total


def kernel_groups(model: ModelSpec) -> tuple[tuple[ShardingType, str], ...]:
    """The fused lookup groups a rank's shards of ``model`` can fall in: one per sharding type
    and weight precision (TorchRec's ``EmbeddingSharding`` per type, then ``group_tables``'s
    data type; the kernel follows the type here: fused, data-parallel dense)."""
    precisions = sorted({t.precision for t in model.tables})
    return tuple((st, p) for st in ShardingType for p in precisions)
