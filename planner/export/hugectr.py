"""A sharding plan as HugeCTR's embedding collection takes it: ``shard_matrix`` (per GPU, the
tables it holds) and ``shard_strategy`` (``["mp", tables]`` model-parallel, ``["dp",
tables]`` replicated), tables named by their index in the spec as strings, as the MLPerf
DLRM-DCNv2 ``train.py`` passes them (``generate_plan``'s output), and ``comm_strategy``: the
``hugectr.CommunicationStrategy`` of the collection, ``hierarchical`` for a plan with
``hierarchical_row_wise`` tables (``hier_auto``'s: partial sums reduced inside each node
first), else ``uniform``. One collection has one strategy, so a plan mixing
``subset_row_wise`` and ``hierarchical_row_wise`` is refused.

A table in several GPUs' lists is split by key over them, so ``table_wise`` (one list),
``subset_row_wise`` (its ranks' lists), ``row_wise`` (every list) and ``table_row_wise`` (its
host's lists) map onto it, HugeCTR choosing its own key split; ``data_parallel`` goes in every
list and under ``dp``. Column-wise has no HugeCTR form and is refused, naming the table.

>>> doc = {"format": "clusterplan.sharding-plan", "devices": 2, "valid": True, "shards": [
...     {"table": "a", "sharding_type": "table_wise", "ranks": [1]},
...     {"table": "b", "sharding_type": "subset_row_wise", "ranks": [0, 1]},
...     {"table": "c", "sharding_type": "data_parallel", "ranks": [0, 1]}]}
>>> out = export_hugectr_plan(doc)
>>> out["shard_matrix"], out["shard_strategy"]
([['1', '2'], ['0', '1', '2']], [['mp', ['0', '1']], ['dp', ['2']]])
>>> out["comm_strategy"]
'uniform'
"""

from __future__ import annotations

from typing import Any, Mapping

from simulator.errors import SpecError

__all__ = ["export_hugectr_plan", "HUGECTR_FILE", "HUGECTR_FORMAT"]

HUGECTR_FILE = "hugectr_plan.json"
HUGECTR_FORMAT = "clusterplan.hugectr-sharding"

_MP = ("table_wise", "subset_row_wise", "hierarchical_row_wise", "row_wise", "table_row_wise")


def export_hugectr_plan(doc: Mapping[str, Any], *, source: str | None = None) -> dict:
    """``doc`` (a plan JSON) → ``{"format", "tables", "shard_matrix", "shard_strategy"}``."""
    if doc.get("format") != "clusterplan.sharding-plan":
        raise SpecError("not an embedding sharding plan", source=source, field="format",
                        fix="export a plan from `clusterplan plan TABLES --out plan.json`")
    if doc.get("valid") is False:
        raise SpecError("the plan is not valid: a trainer cannot run it", source=source,
                        field="valid", fix="re-plan with more devices or another planner")
    devices = int(doc.get("devices") or 0)
    entries = doc.get("shards") or []
    if devices < 1 or not entries:
        raise SpecError("the plan has no devices or no shards", source=source, field="shards",
                        fix="re-plan with clusterplan plan")
    matrix: list[list[str]] = [[] for _ in range(devices)]
    mp, dp, names = [], [], []
    for i, e in enumerate(entries):
        st, tid = e.get("sharding_type"), str(i)
        names.append(e.get("table"))
        if st not in _MP + ("data_parallel",):
            raise SpecError(f"table {e.get('table')!r} is {st}, which HugeCTR cannot hold",
                            source=source, field=f"shards[{i}].sharding_type",
                            fix="re-plan with --planner hugectr_auto (or without column-wise)")
        ranks = sorted({int(r) for r in e.get("ranks") or []})
        if not ranks or ranks[-1] >= devices or ranks[0] < 0:
            raise SpecError(f"table {e.get('table')!r} has ranks {ranks} outside 0..{devices - 1}",
                            source=source, field=f"shards[{i}].ranks", fix="re-plan")
        (dp if st == "data_parallel" else mp).append(tid)
        for r in ranks:
            matrix[r].append(tid)
    if any(not row for row in matrix):
        raise SpecError("a GPU holds no table, which HugeCTR refuses", source=source,
                        field="shards", fix="re-plan so that every GPU holds a table")
    types = {e.get("sharding_type") for e in entries}
    if {"subset_row_wise", "hierarchical_row_wise"} <= types:
        raise SpecError("the plan mixes subset_row_wise and hierarchical_row_wise tables, but "
                        "one HugeCTR embedding collection has one communication strategy",
                        source=source, field="shards",
                        fix="re-plan with --planner hugectr_auto (mode=auto or mode=hier_auto)")
    comm = "hierarchical" if "hierarchical_row_wise" in types else "uniform"
    return {"format": HUGECTR_FORMAT, "tables": names, "shard_matrix": matrix,
            "shard_strategy": [["mp", mp], ["dp", dp]], "comm_strategy": comm}
