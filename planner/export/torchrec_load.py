"""Load a ``clusterplan.torchrec-plan`` file as TorchRec's ``ShardingPlan`` (trainer side).

>>> plan = load_sharding_plan("plan.torchrec.json", world_size=4, tables=ebc)  # doctest: +SKIP
>>> model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan,
...                                  sharders=[sharder])                       # doctest: +SKIP

The file is checked first (:func:`~planner.export.torchrec_check.check_torchrec_plan`: format,
schema version, context hash, shards tiling each table, TorchRec's row-wise blocks), then against
the trainer: the world size, the local world size, and the tables (names and ``[rows, dim]``).
Any mismatch is a :class:`~simulator.errors.SpecError` naming the file, the field and the fix,
never a plan that DistributedModelParallel would run wrongly. TorchRec is imported only here,
only when called.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Mapping

from simulator.errors import SpecError
from simulator.fileio import read_json_file

from planner.export.torchrec_check import check_torchrec_plan, empty_row_shards
from planner.export.torchrec_format import parse_placement, placement, table_shapes

__all__ = ["load_sharding_plan", "read_torchrec_plan", "model_table_shapes"]

_INSTALL = ("install torch 2.13.0 (CPU), fbgemm-gpu-cpu 1.8.0 and torchrec 1.8.0 --no-deps "
            "(`make setup-torchrec`)")


def read_torchrec_plan(path_or_dict: Any) -> tuple[dict[str, Any], str | None]:
    """``(checked document, source name)`` from a path, JSON text's file, or a dict."""
    if isinstance(path_or_dict, Mapping):
        return check_torchrec_plan(path_or_dict, source=None), None
    if not isinstance(path_or_dict, (str, os.PathLike)):
        raise SpecError(f"expected a file path or a dict, got {type(path_or_dict).__name__}",
                        field="path_or_dict", fix="pass the JSON file `clusterplan export "
                        "PLAN.json --to torchrec --out FILE` wrote")
    source = os.fspath(path_or_dict)
    doc = read_json_file(source, field="PLAN",
                         missing_fix="write one with `clusterplan export plan.json --to torchrec "
                                     "--out FILE`",
                         json_fix="pass the file `clusterplan export PLAN.json --to torchrec` "
                                  "wrote")
    return check_torchrec_plan(doc, source=source), source


def model_table_shapes(tables: Any) -> dict[str, tuple[int, int]]:
    """``{name: (rows, dim)}`` of an ``EmbeddingBagCollection`` / ``EmbeddingCollection``, a
    list of TorchRec table configs, or a mapping ``name → (rows, dim)`` or ``name → config``."""
    if hasattr(tables, "embedding_bag_configs"):
        tables = tables.embedding_bag_configs()
    elif hasattr(tables, "embedding_configs"):
        tables = tables.embedding_configs()
    out: dict[str, tuple[int, int]] = {}
    if isinstance(tables, Mapping):
        for name, v in tables.items():
            if hasattr(v, "num_embeddings"):
                out[str(name)] = (int(v.num_embeddings), int(v.embedding_dim))
            else:
                rows, dim = v
                out[str(name)] = (int(rows), int(dim))
        return out
    if isinstance(tables, Iterable):
        for c in tables:
            out[str(c.name)] = (int(c.num_embeddings), int(c.embedding_dim))
        return out
    raise SpecError(f"cannot read table shapes from a {type(tables).__name__}", field="tables",
                    fix="pass the EmbeddingBagCollection, its configs or {name: (rows, dim)}")


def _check_tables(doc: Mapping[str, Any], tables: Any, source: str | None) -> None:
    planned = table_shapes(doc)
    have = model_table_shapes(tables)
    fix = ("export the plan for this model: `clusterplan plan TABLES --devices N --out "
           "plan.json` with the model's tables, then `clusterplan export plan.json --to torchrec`")
    extra = sorted(set(planned) - set(have))
    if extra:
        raise SpecError(f"the plan has tables {extra} that the model lacks", source=source,
                        field="context.tables", fix=fix)
    missing = sorted(set(have) - set(planned))
    if missing:
        raise SpecError(f"the model's tables {missing} are not in the plan (TorchRec needs a "
                        "sharding for every table)", source=source, field="context.tables",
                        fix=fix)
    for name, shape in planned.items():
        if tuple(have[name]) != tuple(shape):
            raise SpecError(f"table {name!r} is [{shape[0]}, {shape[1]}] in the plan but "
                            f"[{have[name][0]}, {have[name][1]}] in the model", source=source,
                            field=f"context.tables.{name}", fix=fix)


def _refuse_empty_cpu_shards(doc: Mapping[str, Any], device: str | None,
                             source: str | None) -> None:
    for fqn, name, k, rank in empty_row_shards(doc):
        p = doc["plan"][fqn][name]
        on = device or parse_placement(p["shards"][k]["placement"])[1]
        if on != "cpu":
            continue
        rows = doc["context"]["tables"][name][0]
        where = f"plan.{json.dumps(fqn)}" if fqn == "" else f"plan.{fqn}"
        raise SpecError(f"table {name!r} ({p['sharding_type']}, {rows} rows) has an empty shard "
                        f"on rank {rank}; on CPU FBGEMM 1.8.0's table-batched kernel then fails "
                        "or updates the next table on that rank wrongly", source=source,
                        field=f"{where}.{name}.shards[{k}]",
                        fix="give the table table_wise, column_wise or data_parallel, or plan on "
                            "fewer ranks (allow_empty_shards=True loads it anyway)")


def load_sharding_plan(path_or_dict: Any, *, world_size: int | None = None, tables: Any = None,
                       local_world_size: int | None = None, device: str | None = None,
                       allow_empty_shards: bool = False):
    """TorchRec's ``ShardingPlan`` from a ``clusterplan.torchrec-plan`` file or dict.

    Parameters
    ----------
    path_or_dict : path or dict
        What ``clusterplan export PLAN.json --to torchrec`` wrote (or its parsed JSON).
    world_size : int or None
        The trainer's world size; the plan must have been made for it. None: the initialised
        default process group's size, or no check when there is none.
    tables : EmbeddingBagCollection, configs, mapping or None
        The model's tables (see :func:`model_table_shapes`); names and ``[rows, dim]`` must
        equal the plan's. None: not checked.
    local_world_size : int or None
        Ranks per host when given (it decides table-row-wise blocks); must equal the plan's.
    device : {"cpu", "cuda"} or None
        Rewrite every placement for this device (``rank:R/cpu`` or ``rank:R/cuda:R mod
        local``); None keeps the file's. A ``cuda`` placement fails on a CPU run.
    allow_empty_shards : bool
        Load a plan whose CPU placements include a row-wise shard with no rows anyway. Refused
        by default: FBGEMM 1.8.0's CPU kernel fails or trains the next table wrongly with one
        (:func:`~planner.export.torchrec.empty_row_shards`).

    Returns ``ShardingPlan({fqn: EmbeddingModuleShardingPlan({table: ParameterSharding})})``
    with ``EnumerableShardingSpec`` / ``ShardMetadata`` shards (None for data-parallel tables).
    """
    doc, source = read_torchrec_plan(path_or_dict)
    try:
        import torch.distributed as dist
    except ImportError:
        dist = None
    if world_size is None and dist is not None and dist.is_available() and \
            dist.is_initialized():
        world_size = dist.get_world_size()
    if world_size is not None and world_size != doc["world_size"]:
        raise SpecError(f"the plan is for {doc['world_size']} ranks, the trainer has "
                        f"{world_size}", source=source, field="world_size",
                        fix=f"plan for {world_size} devices: `clusterplan plan TABLES --devices "
                            f"{world_size} --out plan.json`, then export it again")
    lws = doc["local_world_size"]
    if local_world_size is not None and local_world_size != lws:
        raise SpecError(f"the plan has {lws} ranks per host, the trainer {local_world_size}",
                        source=source, field="local_world_size",
                        fix=f"run with LOCAL_WORLD_SIZE={lws} or plan for a topology with "
                            f"{local_world_size} ranks per host")
    if device not in (None, "cpu", "cuda"):
        raise SpecError(f"device {device!r} is not cpu or cuda", field="device",
                        fix="pass cpu, cuda or None (keep the file's placements)")
    if tables is not None:
        _check_tables(doc, tables, source)
    if not allow_empty_shards:
        _refuse_empty_cpu_shards(doc, device, source)
    try:
        from torchrec.distributed.types import (
            EmbeddingModuleShardingPlan,
            EnumerableShardingSpec,
            ParameterSharding,
            ShardingPlan,
            ShardMetadata,
        )
    except ImportError as exc:
        raise SpecError(f"loading a TorchRec plan needs torchrec ({exc.name or exc} is missing)",
                        source=source, fix=_INSTALL) from None
    modules = {}
    for fqn, entries in doc["plan"].items():
        module_plan = EmbeddingModuleShardingPlan()
        for name, p in entries.items():
            spec = None
            if p.get("shards") is not None:
                spec = EnumerableShardingSpec([
                    ShardMetadata(shard_offsets=list(s["shard_offsets"]),
                                  shard_sizes=list(s["shard_sizes"]),
                                  placement=(placement(r, device, lws) if device
                                             else s["placement"]))
                    for r, s in zip(p["ranks"], p["shards"])])
            module_plan[name] = ParameterSharding(sharding_type=p["sharding_type"],
                                                  compute_kernel=p["compute_kernel"],
                                                  ranks=list(p["ranks"]), sharding_spec=spec)
        modules[fqn] = module_plan
    return ShardingPlan(modules)
