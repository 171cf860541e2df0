"""This host's gloo calibration, measured once and kept: the first ``clusterplan validate`` that
needs one measures it (``clusterplan calibrate gloo``'s microbenchmarks, never a validated
run) with a progress bar and stores it under a fingerprint of the host; later runs read it, and
``clusterplan calibrate gloo`` measures it again (refreshes it).

The fingerprint is what the timings depend on and a person cannot see change: CPU model and
cores, last-level cache, memory, Python, torch, fbgemm_gpu and torchrec versions, and the world
size. A different host, an upgraded torch or another world size gets its own file. The folder is
``$CLUSTERPLAN_CACHE``, else ``$XDG_CACHE_HOME/clusterplan``, else ``~/.cache/clusterplan``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
from pathlib import Path

import yaml

from simulator.fileio import atomic_write_text

from planner.machine import installed_description

__all__ = ["host_fingerprint", "cache_path", "cached_calibration", "store_calibration"]

_KEYS = ("cpu_model", "cpu_count", "last_level_cache_bytes", "python", "torch", "fbgemm_gpu",
         "memory_bytes")


def host_fingerprint(world: int) -> str:
    """12 hex digits naming this host's software and hardware and the world size."""
    info = installed_description()
    try:
        info["torchrec"] = md.version("torchrec")
    except md.PackageNotFoundError:
        info["torchrec"] = None
    try:
        info["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        info["memory_bytes"] = None
    fields = {k: info.get(k) for k in _KEYS + ("torchrec",)}
    fields["world"] = int(world)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_path(world: int) -> Path:
    """Where this host's calibration for ``world`` processes is kept."""
    root = os.environ.get("CLUSTERPLAN_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "clusterplan")
    return Path(root) / f"gloo-{host_fingerprint(world)}-w{int(world)}.yaml"


def store_calibration(doc: dict, world: int) -> Path:
    """Keep ``doc`` (a ``calibrate gloo`` profile) as this host's calibration; its path."""
    path = cache_path(world)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "# clusterplan calibrate gloo (cached for this host; see "
                            "planner/measure/validate/cache.py)\n"
                      + yaml.safe_dump(doc, sort_keys=False, width=100))
    return path


def cached_calibration(world: int, *, measure=None) -> tuple[Path, bool]:
    """The path of this host's calibration for ``world`` processes, measuring it first with
    ``measure(world) -> dict`` when there is none; ``(path, measured_now)``."""
    path = cache_path(world)
    if path.is_file():
        return path, False
    if measure is None:
        raise FileNotFoundError(path)
    return store_calibration(measure(world), world), True
