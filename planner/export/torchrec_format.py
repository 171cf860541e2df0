"""The ``clusterplan.torchrec-plan`` format's names, placements, context hash and JSON text
(:mod:`planner.export.torchrec` writes such a document, :mod:`planner.export.torchrec_check`
checks one, :mod:`planner.export.torchrec_load` loads one into TorchRec)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from simulator.errors import SpecError

__all__ = ["FORMAT", "SCHEMA_VERSION", "TORCHREC_VERSION", "SHARDING_PLAN_FORMAT",
           "SUPPORTED_TYPES", "KERNELS", "MAX_WORLD", "FIX_EXPORT", "spec_error",
           "is_sharding_plan", "placement", "parse_placement", "context_sha256", "table_shapes",
           "torchrec_plan_json"]

FORMAT = "clusterplan.torchrec-plan"
SCHEMA_VERSION = 1
#: the TorchRec release the format was checked against (formats.md §2.9)
TORCHREC_VERSION = "1.8.0"
SHARDING_PLAN_FORMAT = "clusterplan.sharding-plan"
_SHARDING_PLAN_VERSION = 1

#: sharding types the loader accepts (TorchRec's strings); grid_shard is not produced here
SUPPORTED_TYPES = ("table_wise", "column_wise", "table_column_wise", "row_wise",
                   "table_row_wise", "data_parallel")
#: TorchRec's ``compute_kernel`` values (formats.md §2.1)
KERNELS = ("dense", "fused", "fused_uvm", "fused_uvm_caching", "quant", "quant_uvm",
           "quant_uvm_caching", "key_value", "customized_kernel", "ssd_virtual_table",
           "dram_virtual_table")
_DEVICES = ("cpu", "cuda")
_PLACEMENT = re.compile(r"^rank:(\d+)/(cpu|cuda(?::(\d+))?)$")
FIX_EXPORT = "export it again with `clusterplan export PLAN.json --to torchrec`"
#: the most ranks a plan may have (the largest topology clusterplan builds)
MAX_WORLD = 262_144


def spec_error(msg: str, field: str, fix: str, source: str | None = None) -> SpecError:
    """A :class:`SpecError` of a plan document."""
    return SpecError(msg, source=source, field=field, fix=fix)


def is_sharding_plan(doc: Any) -> bool:
    """Whether ``doc`` is a clusterplan embedding sharding plan (not an LLM plan)."""
    return isinstance(doc, Mapping) and doc.get("format") == SHARDING_PLAN_FORMAT


def placement(rank: int, device: str, local_world_size: int) -> str:
    """TorchRec's remote-device string for ``rank``.

    >>> placement(3, "cpu", 2), placement(3, "cuda", 2)
    ('rank:3/cpu', 'rank:3/cuda:1')
    """
    if device == "cpu":
        return f"rank:{rank}/cpu"
    return f"rank:{rank}/cuda:{rank % local_world_size}"


def parse_placement(text: Any) -> tuple[int, str] | None:
    """``"rank:3/cuda:1"`` → ``(3, "cuda")``; None when it is not a placement string."""
    m = _PLACEMENT.match(text) if isinstance(text, str) else None
    return (int(m.group(1)), m.group(2).split(":")[0]) if m else None


def context_sha256(tables: Mapping[str, Any], world_size: int, local_world_size: int,
                   batch_size: Any = None, topology: Any = None) -> str:
    """SHA-256 of the inputs a plan was made for (table shapes in name order, world size,
    local world size, batch size, topology), over canonical JSON."""
    canon = {"tables": {str(k): [int(v[0]), int(v[1])] for k, v in sorted(tables.items())},
             "world_size": int(world_size), "local_world_size": int(local_world_size),
             "batch_size": batch_size, "topology": topology}
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def table_shapes(doc: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """``{table: (rows, dim)}`` of a checked ``clusterplan.torchrec-plan`` document."""
    return {k: (int(v[0]), int(v[1])) for k, v in doc["context"]["tables"].items()}


_NUMBER_LIST = re.compile(r"\[([-\d,\s]+)\]")
_SMALL_OBJECT = re.compile(r"\{\n\s*([^{}]*?)\n\s*\}")


def torchrec_plan_json(doc: Mapping[str, Any]) -> str:
    """The document as JSON text: indented, lists of numbers on one line, a trailing newline."""
    text = json.dumps(doc, indent=1, ensure_ascii=False)
    text = _NUMBER_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(","))
                            + "]", text)
    text = _SMALL_OBJECT.sub(_one_line, text)
    return text + "\n"


def _one_line(m: re.Match) -> str:
    lines = [x.strip() for x in m.group(1).split("\n")]
    if len(lines) > 4 or any(x.endswith("[") for x in lines):
        return m.group(0)
    return "{" + " ".join(lines) + "}"
