"""What ``plan MODEL`` may choose: ``--constrain`` (axes a user fixes) and ``--for TARGET``
(the layouts the trainer the plan goes to can run), as one predicate for the layout search.

>>> allow = layout_filter("tp=8,fsdp=none|zero1", None)
>>> from planner.model.llm.spec import ParallelSpec
>>> allow(ParallelSpec(tp=8, dp=4, fsdp="zero1"), 1, "tp-cp-dp-pp")
True
>>> allow(ParallelSpec(tp=8, dp=4, fsdp="zero3"), 1, "tp-cp-dp-pp")
False
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Callable

from simulator.errors import SpecError

from planner.export import deepspeed, megatron, torchtitan
from planner.model.llm.spec import FSDP, ParallelSpec

__all__ = ["layout_filter", "TARGETS", "KEYS"]

#: ``--for`` targets: each exporter's own account of the layouts it can express
TARGETS = {"deepspeed": deepspeed.unsupported, "megatron": megatron.unsupported,
           "torchtitan": torchtitan.unsupported}
KEYS = ("tp", "cp", "pp", "dp", "vpp", "ep", "mbs", "fsdp", "order")
_FIX = "write e.g. --constrain tp=8,cp=1,vpp=1,fsdp=none|zero1 (| separates allowed values)"


def _parse(text: str) -> dict[str, set]:
    """``'tp=8,fsdp=none|zero1'`` → ``{"tp": {8}, "fsdp": {"none", "zero1"}}``."""
    out: dict[str, set] = {}
    for item in (text or "").split(","):
        key, eq, values = item.strip().partition("=")
        if not eq or key not in KEYS or not values:
            raise SpecError(f"bad item {item!r} (keys: {', '.join(KEYS)})", field="--constrain",
                            fix=_FIX)
        if key in out:
            raise SpecError(f"{key} is given twice", field="--constrain", fix=f"give {key} once")
        allowed: set = set()
        for v in values.split("|"):
            if key == "fsdp":
                if v not in FSDP:
                    raise SpecError(f"fsdp={v!r} is not one of {', '.join(FSDP)}",
                                    field="--constrain", fix=_FIX)
                allowed.add(v)
            elif key == "order":
                allowed.add(v)
            elif v.isdigit() and int(v) >= 1:
                allowed.add(int(v))
            else:
                raise SpecError(f"{key}={v!r} is not a whole number ≥ 1", field="--constrain",
                                fix=_FIX)
        out[key] = allowed
    return out


def layout_filter(constrain: str | None, target: str | None
                  ) -> Callable[[ParallelSpec, int, str], bool] | None:
    """The predicate ``(parallel, micro_batch_size, order) -> bool`` for the search (None:
    everything allowed)."""
    fixed = _parse(constrain) if constrain else {}
    if target is not None and target not in TARGETS:
        raise SpecError(f"unknown target {target!r}", field="--for",
                        fix=f"use one of: {', '.join(TARGETS)}")
    unsupported = TARGETS.get(target) if target else None
    if not fixed and unsupported is None:
        return None

    def allow(p: ParallelSpec, mbs: int, order: str) -> bool:
        values = {**asdict(p), "mbs": mbs, "order": order}
        if any(values[k] not in allowed for k, allowed in fixed.items()):
            return False
        return unsupported is None or unsupported(asdict(p), order) is None
    return allow
