"""Facts about this machine recorded beside measurements (CPU model, cores, caches, versions),
and the one place that says how to install torch when a command needs it. Imports no torch
unless asked to."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import os
import platform
from pathlib import Path

import numpy as np

from simulator.errors import SpecError

__all__ = ["INSTALL_HINT", "MMAP_THRESHOLD_BYTES", "require_torch", "last_level_cache_bytes",
           "l2_cache_bytes",
           "platform_description", "cpu_description", "installed_description", "cache_dir",
           "make_cache_dir", "host_fingerprint", "other_host"]


#: glibc's largest dynamic mmap threshold on 64-bit (mallopt(3): DEFAULT_MMAP_THRESHOLD_MAX):
#: a block above it is always mapped anew (page faults on first touch) and returned when freed
MMAP_THRESHOLD_BYTES = 32 * 2 ** 20

INSTALL_HINT = "install with `make setup-torchrec` (torch 2.13.0 CPU, fbgemm-gpu-cpu 1.8.0)"


def require_torch(what: str = "measuring embedding kernels"):
    """Import torch or raise a SpecError (exit 2) saying how to install it."""
    try:
        import torch
    except ImportError:
        raise SpecError(f"{what} needs torch, which is not installed", source="torch",
                        fix=INSTALL_HINT) from None
    return torch


def _cache_sizes() -> dict[int, int]:
    """Bytes of cpu0's caches by level from sysfs (the largest per level; {} when unknown)."""
    out: dict[int, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for d in base.glob("index*"):
            text = (d / "size").read_text().strip()
            mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
            num = text[:-1] if text[-1:] in "KMG" else text
            level = int((d / "level").read_text().strip())
            out[level] = max(out.get(level, 0), int(num) * mult)
    except (OSError, ValueError):
        return {}
    return out


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (from sysfs), or 32 MiB when unknown."""
    return max(_cache_sizes().values(), default=0) or 32 * 1024 ** 2


def l2_cache_bytes() -> int:
    """Size of one core's level-2 cache (from sysfs), or 1 MiB when unknown."""
    return _cache_sizes().get(2) or 1024 ** 2


def platform_description() -> dict:
    """Platform, cores, Python and numpy versions and the CPU model (no torch import)."""
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return info


def cpu_description() -> dict:
    """Machine facts recorded beside measurements (model, cores, versions)."""
    info = platform_description()
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        import fbgemm_gpu
        info["fbgemm_gpu"] = getattr(fbgemm_gpu, "__version__", "?")
    except Exception:
        pass
    info["last_level_cache_bytes"] = last_level_cache_bytes()
    return info


def installed_description(threads: int = 1) -> dict:
    """:func:`platform_description` plus the installed torch and fbgemm_gpu versions (read from
    package metadata, so nothing heavy is imported), the last-level cache, ``threads`` and the
    embedding kernel backend those packages give."""
    info = platform_description()
    for dist, key in (("torch", "torch"), ("fbgemm-gpu-cpu", "fbgemm_gpu"),
                      ("fbgemm-gpu", "fbgemm_gpu")):
        try:
            info.setdefault(key, md.version(dist))
        except md.PackageNotFoundError:
            pass
    info["last_level_cache_bytes"] = last_level_cache_bytes()
    info["threads"] = int(threads)
    info["backend"] = "fbgemm" if "fbgemm_gpu" in info else "torch"
    return info


#: what a host's timings depend on and a person cannot see change
FINGERPRINT_KEYS = ("cpu_model", "cpu_count", "last_level_cache_bytes", "python", "torch",
                    "fbgemm_gpu", "memory_bytes", "torchrec")


def cache_dir() -> Path:
    """Where this host's calibrations are kept: ``$CLUSTERPLAN_CACHE``, else
    ``$XDG_CACHE_HOME/clusterplan``, else ``~/.cache/clusterplan``."""
    root = os.environ.get("CLUSTERPLAN_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "clusterplan"


def make_cache_dir() -> Path:
    """:func:`cache_dir`, created when missing; a folder that cannot be made is a SpecError
    naming it (exit 2), not a traceback."""
    d = cache_dir()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(f"cannot create the calibration cache folder {d}: {exc.strerror}",
                        source=str(d), field="CLUSTERPLAN_CACHE",
                        fix="set CLUSTERPLAN_CACHE to a writable folder, or pass --out") from None
    return d


def host_fingerprint(world: int | None = None) -> str:
    """12 hex digits naming this host's hardware and software (:data:`FINGERPRINT_KEYS`) and,
    when given, the world size: a different host, an upgraded torch or another world size gets
    its own calibration."""
    info = installed_description()
    try:
        info["torchrec"] = md.version("torchrec")
    except md.PackageNotFoundError:
        info["torchrec"] = None
    try:
        info["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        info["memory_bytes"] = None
    fields = {k: info.get(k) for k in FINGERPRINT_KEYS}
    if world is not None:
        fields["world"] = int(world)
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def other_host(machine: dict) -> str | None:
    """How a recorded ``machine`` (CPU model, cores, last-level cache) differs from this host,
    or None when it is this kind of host."""
    here = platform_description()
    here["last_level_cache_bytes"] = last_level_cache_bytes()
    diffs = []
    for key, unit in (("cpu_model", ""), ("cpu_count", " cores"),
                      ("last_level_cache_bytes", " B last-level cache")):
        if key in machine and key in here and machine[key] != here[key]:
            diffs.append(f"{machine[key]}{unit} (this host: {here[key]}{unit})")
    return "; ".join(diffs) or None
