"""This host's calibrations, measured once and kept: the first ``clusterplan validate unseen``
that needs one measures it with a line of progress per stage and stores it under a fingerprint
of the host (never from a validated run): the gloo calibration per world size (``clusterplan
calibrate gloo``'s microbenchmarks) and the CPU embedding profile (``clusterplan calibrate
embedding``'s kernel and collective sweeps). Later runs read them; the two ``calibrate``
commands measure them again (refresh them).

The fingerprint is what the timings depend on and a person cannot see change: CPU model and
cores, last-level cache, memory, Python, torch, fbgemm_gpu and torchrec versions, and the world
size. A different host, an upgraded torch or another world size gets its own file. The folder is
``$CLUSTERPLAN_CACHE``, else ``$XDG_CACHE_HOME/clusterplan``, else ``~/.cache/clusterplan``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.fileio import atomic_write_text

from planner.machine import cache_dir, host_fingerprint, make_cache_dir
from planner.measure.heap import DEFAULT_HEAP
from planner.measure.validate.calibrate import SIZES
from planner.measure.tables.fit import calibrate, write_profile
from planner.model.tables.cpu_profile import CPU_PROFILE_PATH, host_profile_path, load_cpu_profile

__all__ = ["host_fingerprint", "cache_path", "cached_calibration", "store_calibration",
           "ensure_host_profile"]


#: bumped when the calibration gains a section the predictions read, or reads one differently
#: (2: ``linear_layers``; 3: the ``alltoallv`` tables; 4: ``lookup.measured_s`` the mean of
#: readings spread over the calibration), so that a calibration kept from before is measured
#: again rather than read without it
CACHE_SCHEMA = 4


def cache_path(world: int, heap: str = DEFAULT_HEAP) -> Path:
    """Where this host's calibration for ``world`` processes with the heap policy ``heap``
    (:mod:`planner.measure.heap`) is kept. The name holds the largest collective size measured
    (:data:`~planner.measure.validate.calibrate.SIZES`) and :data:`CACHE_SCHEMA`, so that a
    calibration made before the sizes grew, or before a probe was added, is measured again
    rather than extrapolated from."""
    top = SIZES[-1] // 2 ** 20
    return cache_dir() / (f"gloo-{host_fingerprint(world)}-w{int(world)}-{heap}-{top}MiB"
                          f"-s{CACHE_SCHEMA}.yaml")


def store_calibration(doc: dict, world: int, heap: str | None = None) -> Path:
    """Keep ``doc`` (a ``calibrate gloo`` profile) as this host's calibration for the heap
    policy it was measured with (``heap`` when given); its path."""
    make_cache_dir()
    path = cache_path(world, heap or (doc.get("measured") or {}).get("heap", "system"))
    atomic_write_text(path, "# clusterplan calibrate gloo (cached for this host; see "
                            "planner/measure/validate/cache.py)\n"
                      + yaml.safe_dump(doc, sort_keys=False, width=100))
    return path


def cached_calibration(world: int, *, measure=None, heap: str = DEFAULT_HEAP
                       ) -> tuple[Path, bool]:
    """The path of this host's calibration for ``world`` processes and heap policy ``heap``,
    measuring it first with ``measure(world) -> dict`` when there is none; ``(path,
    measured_now)``."""
    path = cache_path(world, heap)
    if path.is_file():
        return path, False
    if measure is None:
        raise FileNotFoundError(path)
    return store_calibration(measure(world), world, heap), True


def ensure_host_profile(worlds, *, kernel_points: int = 120, progress=None,
                        announce=None) -> tuple[Path, bool]:
    """This host's CPU embedding profile (kernel sweep and gloo collectives of ``worlds``):
    the one kept under its fingerprint, else the committed one when it was measured on this kind
    of host, else measured now (``clusterplan calibrate embedding``; a few minutes);
    ``(path, measured_now)``; ``announce()`` is called just before measuring. Plans and
    predictions on localhost-gloo read it from then on."""
    path = host_profile_path()
    if path.is_file():
        return path, False
    committed = load_cpu_profile(str(CPU_PROFILE_PATH)) if CPU_PROFILE_PATH.is_file() else None
    if committed is not None and committed.other_host is None:
        return CPU_PROFILE_PATH, False
    if announce is not None:
        announce()
    make_cache_dir()
    ws = tuple(sorted({int(w) for w in worlds}))
    doc = calibrate(kernel_points=kernel_points, worlds=ws, repeats=5, rounds=1,
                    command=f"clusterplan calibrate embedding --kernel-points {kernel_points} "
                            f"--worlds {','.join(map(str, ws))} --repeats 5 --rounds 1",
                    progress=progress)
    write_profile(doc, str(path))
    load_cpu_profile.cache_clear()
    return path, True
