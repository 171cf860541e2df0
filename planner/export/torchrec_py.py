"""An embedding sharding plan as a Python module that needs only torch and TorchRec.

``clusterplan export plan.json --to torchrec-py --out sharding_plan.py`` writes it; the trainer
imports it and passes its plan to ``DistributedModelParallel``, with no clusterplan installed::

    from sharding_plan import sharding_plan
    model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=sharding_plan(ebc),
                                     sharders=[EmbeddingBagCollectionSharder()])

The module holds the plan as plain literals (world size, ranks per host, each table's
``[rows, dim]`` and its shards) and builds TorchRec's own ``ParameterSharding`` objects from them,
exactly as :func:`planner.export.torchrec_load.load_sharding_plan` does from the JSON export.
Before building, it checks what a wrong trainer would get wrong silently: the world size (of
the initialised process group) and the tables of the module given (names and shapes), raising
``ValueError`` naming the table or the size. Row-wise shards with no rows on CPU are refused
here, at export (FBGEMM 1.8.0's CPU kernel fails or trains the next table wrongly with one).
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from planner.export.torchrec_check import empty_row_shards, empty_shard_error

__all__ = ["torchrec_plan_module", "TORCHREC_PY_FILE"]

TORCHREC_PY_FILE = "sharding_plan.py"

_BODY = '''

def _check(ebc, world_size):
    try:
        import torch.distributed as dist
        if world_size is None and dist.is_available() and dist.is_initialized():
            world_size = dist.get_world_size()
    except ImportError:
        pass
    if world_size is not None and world_size != WORLD_SIZE:
        raise ValueError(f"this plan is for {WORLD_SIZE} ranks, the trainer has {world_size}: "
                         "plan and export again for that many devices")
    if ebc is None:
        return
    have = {c.name: (c.num_embeddings, c.embedding_dim) for c in ebc.embedding_bag_configs()}
    for name in sorted(set(have) | set(TABLES)):
        if have.get(name) != TABLES.get(name):
            raise ValueError(f"table {name!r} is {TABLES.get(name)} [rows, dim] in the plan "
                             f"and {have.get(name)} in the model: plan for this model")


def sharding_plan(ebc=None, world_size=None):
    """TorchRec's ShardingPlan of this plan; with ``ebc`` (the EmbeddingBagCollection) its
    tables are checked against the plan's, and the world size against ``world_size`` or the
    initialised process group's."""
    from torchrec.distributed.types import (
        EmbeddingModuleShardingPlan,
        EnumerableShardingSpec,
        ParameterSharding,
        ShardingPlan,
        ShardMetadata,
    )
    _check(ebc, world_size)
    modules = {}
    for fqn, entries in PLAN.items():
        module_plan = EmbeddingModuleShardingPlan()
        for name, (kind, kernel, ranks, shards) in entries.items():
            spec = None if shards is None else EnumerableShardingSpec([
                ShardMetadata(shard_offsets=list(offsets), shard_sizes=list(sizes),
                              placement=where) for offsets, sizes, where in shards])
            module_plan[name] = ParameterSharding(sharding_type=kind, compute_kernel=kernel,
                                                  ranks=list(ranks), sharding_spec=spec)
        modules[fqn] = module_plan
    return ShardingPlan(modules)
'''


def torchrec_plan_module(doc: Mapping[str, Any], source: str | None = None) -> str:
    """The module's text for a checked ``clusterplan.torchrec-plan`` document (what
    :func:`~planner.export.torchrec.export_torchrec_plan` returns); same document, same bytes."""
    empty = [(fqn, name, k, rank) for fqn, name, k, rank in empty_row_shards(doc)
             if doc["plan"][fqn][name]["shards"][k]["placement"].endswith("/cpu")]
    if empty:
        fqn, name, k, rank = empty[0]
        raise empty_shard_error(name, rank, source=source, field=f"shards.{name}")
    ctx, src = doc["context"], doc.get("source") or {}
    lines = [f'"""TorchRec sharding plan: {src.get("task") or "task"} on {doc["world_size"]} '
             f'ranks ({doc["local_world_size"]} per host, {doc["device"]}), planned by '
             f'clusterplan ({src.get("planner")}).',
             "",
             "Needs torch and TorchRec only (written for TorchRec "
             f'{doc.get("torchrec_version")}):',
             "",
             "    from sharding_plan import sharding_plan",
             "    model = DistributedModelParallel(ebc, device=..., plan=sharding_plan(ebc),",
             "                                     sharders=[EmbeddingBagCollectionSharder()])",
             "",
             f'Plan context sha256 {ctx.get("sha256")}.',
             '"""', "",
             f"WORLD_SIZE = {int(doc['world_size'])}",
             f"LOCAL_WORLD_SIZE = {int(doc['local_world_size'])}",
             "#: each table's [rows, dim] as planned",
             "TABLES = {"]
    lines += [f"    {json.dumps(name)}: ({int(r)}, {int(d)}),"
              for name, (r, d) in ctx["tables"].items()]
    lines += ["}", "#: module path -> table -> (sharding type, compute kernel, ranks, shards as "
              "(offsets, sizes, placement); None: data-parallel)", "PLAN = {"]
    for fqn, entries in doc["plan"].items():
        lines.append(f"    {json.dumps(fqn)}: {{")
        for name, p in entries.items():
            shards = "None" if p.get("shards") is None else "[" + ", ".join(
                f"({list(s['shard_offsets'])}, {list(s['shard_sizes'])}, "
                f"{json.dumps(s['placement'])})" for s in p["shards"]) + "]"
            lines.append(f"        {json.dumps(name)}: ({json.dumps(p['sharding_type'])}, "
                         f"{json.dumps(p['compute_kernel'])}, {list(p['ranks'])}, {shards}),")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n" + _BODY
