"""The sharding planner a command's flags name: ``--planner NAME``, ``--planner-set KEY=VALUE``
(repeatable: a planner's own settings), and the older ``--mip-solver`` and
``--column-slice-threshold``. Used by ``plan TABLES`` and ``simulate TABLES``.

>>> planner_settings(["mode=auto", "mem_comm_bw_ratio=9", "dp_threshold_gb=0.008"], "hugectr_auto")
{'mode': 'auto', 'mem_comm_bw_ratio': 9.0, 'dp_threshold_gb': 0.008}
"""

from __future__ import annotations

import argparse
import math

from simulator.errors import SpecError

from planner.sharding.planners import PLANNER_NAMES, get_planner
from planner.sharding.protocols import Planner

__all__ = ["planner_arguments", "planner_settings", "planner_from_args", "PLANNER_SETTINGS"]

#: each planner's ``--planner-set`` keys and their types (a planner not listed takes none)
PLANNER_SETTINGS: dict[str, dict[str, type]] = {
    "hugectr_auto": {"mode": str, "mem_comm_bw_ratio": float, "mem_comm_work_ratio": float,
                     "memory_cap_gb": float, "dp_threshold_gb": float, "max_iterations": int},
    "memory_balanced": {"column_slice_threshold": float},
    "local_search": {"start": str},
    "best": {"incumbent": str, "confidence": float},
}

_EXAMPLE = {float: "9", int: "20", str: "auto"}


def planner_arguments(p: argparse.ArgumentParser, *, default: str = "greedy") -> None:
    """Add ``--planner`` and ``--planner-set``."""
    p.add_argument("--planner", default=default, metavar="NAME",
                   help=f"one of {', '.join(PLANNER_NAMES)} (default {default})")
    p.add_argument("--planner-set", action="append", default=[], metavar="KEY=VALUE",
                   help="one setting of the planner (repeatable): " + "; ".join(
                       f"{name}: {', '.join(keys)}" for name, keys in PLANNER_SETTINGS.items()))


def planner_settings(pairs, planner: str) -> dict:
    """``KEY=VALUE`` strings → the planner's settings, each converted to its type; a key the
    planner does not take, or a value of the wrong type, is a SpecError naming it."""
    keys = PLANNER_SETTINGS.get(planner, {})
    out: dict = {}
    for pair in pairs or ():
        key, sep, raw = str(pair).partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(f"{pair!r} is not KEY=VALUE", source="--planner-set",
                            fix="write e.g. --planner-set mem_comm_bw_ratio=9")
        if key not in keys:
            raise SpecError(f"planner {planner!r} has no setting {key!r}",
                            source="--planner-set", field=key,
                            fix=(f"use {', '.join(keys)}" if keys else
                                 f"{planner} takes no settings: drop --planner-set"))
        try:
            value = keys[key](raw.strip())
        except ValueError:
            raise SpecError(f"{key}={raw!r} is not a {keys[key].__name__}",
                            source="--planner-set", field=key,
                            fix=f"write a {keys[key].__name__}, e.g. {key}={_EXAMPLE[keys[key]]}"
                            ) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise SpecError(f"{key}={raw!r} is not finite", source="--planner-set", field=key,
                            fix="pass a finite number")
        out[key] = value
    return out


def planner_from_args(args: argparse.Namespace) -> Planner:
    """The planner ``args`` name, with its settings."""
    name = args.planner
    if name not in PLANNER_NAMES:
        raise SpecError(f"unknown planner {name!r}", source="--planner",
                        fix=f"use one of: {', '.join(PLANNER_NAMES)}")
    opts = planner_settings(getattr(args, "planner_set", None), name)
    if name == "mip" and getattr(args, "mip_solver", None):
        opts["solver"] = args.mip_solver
    threshold = getattr(args, "column_slice_threshold", None)
    if threshold is not None:
        if name != "memory_balanced":
            raise SpecError("--column-slice-threshold is an option of --planner memory_balanced",
                            source="--column-slice-threshold",
                            fix="pass --planner memory_balanced, or drop the option")
        opts["column_slice_threshold"] = threshold
    if "column_slice_threshold" in opts and not 0 < opts["column_slice_threshold"] < math.inf:
        raise SpecError(f"--column-slice-threshold must be a positive number of elements, "
                        f"got {opts['column_slice_threshold']}", source="--column-slice-threshold",
                        fix="pass elements (rows x dim), e.g. 1e9")
    return get_planner(name, **opts)
