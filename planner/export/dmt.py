"""A tower layout as TorchRec's embedding-tower sharding (``EmbeddingTowerCollectionSharder``).

TorchRec 1.8.0 (``torchrec/distributed/embedding_tower_sharding.py``) shards an
``EmbeddingTowerCollection`` whose every tower's tables sit on one host, and its sharder offers
only ``table_row_wise`` and ``table_column_wise``; inside the host it rewrites them to
``row_wise`` and ``column_wise`` over the host's ranks. So each table's intra-host layout maps
to:

- row-wise over the host → ``table_row_wise``, ranks = the host's ranks in order;
- column-wise → ``table_column_wise``, one shard per column block;
- table-wise → ``table_column_wise`` with a single shard (TorchRec's sharder has no table-wise
  type for towers; one column block is the same layout).

The output is plain JSON data (per table: type, ranks, shards with offsets, sizes and
placement ``rank:R/cuda:L``; the towers' table names in order and their hosts), not TorchRec
objects. TorchRec's ``ShardedEmbeddingTowerCollection`` returns the towers' outputs by host
(physical tower), then by tower within the host, not in the collection's order;
:func:`to_parameter_shardings` builds the ``ParameterSharding`` objects when TorchRec is
installed.
"""

from __future__ import annotations

from typing import Sequence

from planner.model.dmt.layout import HostPlan, TowerLayout
from planner.model.tables.shards import ShardingType

__all__ = ["tower_sharding_plan", "to_parameter_shardings", "EXPORT_FORMAT"]

EXPORT_FORMAT = "clusterplan.torchrec-embedding-tower-plan"


def tower_sharding_plan(model, layout: TowerLayout, host_plans: Sequence[HostPlan],
                        host_ranks: Sequence[Sequence[int]], *, compute_kernel: str = "fused"
                        ) -> dict:
    """Per-table TorchRec tower shardings with global ranks (see the module docstring)."""
    G = layout.gpus_per_host
    tables = {}
    for hp in host_plans:
        if hp.plan is None:
            continue
        ranks_g = host_ranks[hp.host]
        for ts in hp.plan.shardings:
            name = model.tables[hp.tables[ts.table]].name
            if ts.sharding_type == ShardingType.ROW_WISE:
                kind = "table_row_wise"
            else:
                kind = "table_column_wise"
            shards = [{"rank": int(ranks_g[s.rank]), "offsets": [s.row_offset, s.col_offset],
                       "sizes": [s.rows, s.cols],
                       "placement": f"rank:{int(ranks_g[s.rank])}/cuda:{int(ranks_g[s.rank]) % G}"}
                      for s in ts.shards]
            tables[name] = {"sharding_type": kind, "compute_kernel": compute_kernel,
                            "ranks": [sh["rank"] for sh in shards], "host": hp.host,
                            "intra_host_type": ts.sharding_type.value, "shards": shards}
    return {"format": EXPORT_FORMAT, "format_version": 1, "torchrec_version": "1.8.0",
            "module": "torchrec.modules.embedding_tower.EmbeddingTowerCollection",
            "sharder": "torchrec.distributed.embedding_tower_sharding."
                       "EmbeddingTowerCollectionSharder",
            "towers": [[model.tables[t].name for t in tw.tables] for tw in layout.towers],
            "tower_hosts": [tw.host for tw in layout.towers],
            "tables": tables}


def to_parameter_shardings(doc: dict, *, device_type: str = "cuda") -> dict:
    """``{table: ParameterSharding}`` from :func:`tower_sharding_plan`'s output (needs TorchRec)."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.types import ParameterSharding
    out = {}
    for name, e in doc["tables"].items():
        md = [ShardMetadata(shard_offsets=list(s["offsets"]), shard_sizes=list(s["sizes"]),
                            placement=s["placement"] if device_type == "cuda"
                            else f"rank:{s['rank']}/{device_type}")
              for s in e["shards"]]
        out[name] = ParameterSharding(sharding_type=e["sharding_type"],
                                      compute_kernel=e["compute_kernel"], ranks=list(e["ranks"]),
                                      sharding_spec=EnumerableShardingSpec(md))
    return out
