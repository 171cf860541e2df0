"""The cost model's measured constants on a CPU target (``localhost-gloo``): lookup bandwidth
and overheads from kernel microbenchmarks and the gloo collective fits per world size, read
from ``traces/calibration/cpu-embedding.yaml`` (written by ``clusterplan calibrate embedding``,
:mod:`planner.measure.tables.fit`). See the *CPU profile* part of :mod:`.cost`."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text

from planner.machine import cache_dir, host_fingerprint, other_host
from planner.model.tables.comm_model import CommModel, SyncCommModel
from planner.model.tables.gpu_lookup import FitRange

__all__ = ["BackwardTerms", "CpuProfile", "load_cpu_profile", "CPU_PROFILE_PATH",
           "host_profile_path"]


#: the committed CPU profile (``clusterplan calibrate embedding --out`` rewrites it)
CPU_PROFILE_PATH = (Path(__file__).resolve().parents[3] / "traces" / "calibration"
                    / "cpu-embedding.yaml")

def host_profile_path() -> Path:
    """Where ``clusterplan calibrate embedding`` keeps this host's profile (keyed by its
    fingerprint, :func:`planner.machine.host_fingerprint`); the cost model prefers it to the
    committed one on a CPU topology."""
    return cache_dir() / f"cpu-embedding-{host_fingerprint()}.yaml"


_LOOKUP_FIELDS = ("lookup_Bps", "lookup_overhead_bytes", "repeat_hit_ratio", "backward_multiplier",
                  "shard_overhead_s", "kernel_launch_s")


@dataclass(frozen=True)
class BackwardTerms:
    """The backward lookup of a fused CPU TBE (exact SGD fused into it) term by term, each in
    byte-equivalents at the forward lookup bandwidth, so what scales the forward scales it too.

    FBGEMM's CPU backward sorts a shard's ids by row, then for every distinct row sums the
    pooled-output gradients of the samples that looked it up and updates the row in place. Its
    time therefore follows ids (the sort), ids × columns (each id reads its sample's fp32
    gradient row) and distinct rows × columns (each row read, updated and written once), not a
    multiple of the forward: the forward's per-id row gather is replaced by a per-id gradient
    gather, whose cost per column differs (measured: backward/forward grows from ~1 at dim 4 to
    ~5 at dim 64, batch 65,536).

    Attributes
    ----------
    call_s, shard_s : float
        Seconds per backward call of a rank's fused kernel and per shard in it.
    id_bytes : float
        Per id.
    grad_element_bytes : float
        Per id and column.
    update_element_bytes, half_update_element_bytes : float
        Per distinct row and column, fp32 rows and fp16/bf16 rows (converted both ways).
    walk_bytes : float
        Per distinct row and ``log2(shard bytes / page_reach_bytes)`` (address translation).
    spill_element_bytes, grad_reach_bytes : float
        Per id and column and ``log2(samples × columns × 4 / grad_reach_bytes)``: the output
        gradient rows an id reads stop fitting in the core's cache as the batch grows.
    bag_element_bytes : float
        Per sample (pooled bag) and column: each bag's output-gradient row is read once for
        the bag, however many ids it holds (0 in profiles fitted before 2026-11-29).
    """

    call_s: float
    shard_s: float
    id_bytes: float
    grad_element_bytes: float
    update_element_bytes: float
    half_update_element_bytes: float
    walk_bytes: float
    spill_element_bytes: float = 0.0
    grad_reach_bytes: float = 2.0 ** 18
    bag_element_bytes: float = 0.0

    def scaled(self, factor: float) -> "BackwardTerms":
        """The same terms with the seconds ones × ``factor`` (the byte ones follow the
        bandwidth they are charged at)."""
        return replace(self, call_s=self.call_s * factor, shard_s=self.shard_s * factor)

    def variable_bytes(self, ids: float, unique: float, cols: int, half: bool,
                       walk: float, samples: float) -> float:
        """Byte-equivalents of one shard's backward: ``ids`` lookups of ``unique`` distinct
        rows of ``cols`` columns for ``samples`` pooled outputs; ``walk`` = log2 of its bytes
        over the page reach (≥ 0)."""
        upd = self.half_update_element_bytes if half else self.update_element_bytes
        spill = math.log2(max(1.0, samples * cols * 4.0 / self.grad_reach_bytes))
        return (ids * (self.id_bytes + cols * (self.grad_element_bytes
                                               + spill * self.spill_element_bytes))
                + unique * (cols * upd + walk * self.walk_bytes)
                + samples * cols * self.bag_element_bytes)


@dataclass(frozen=True)
class CpuProfile:
    """Measured constants of the cost model on a CPU target (see the module docstring).

    Attributes
    ----------
    lookup_Bps : float
        Effective bytes per second of a one-thread fused lookup (replaces HBM × efficiency).
    lookup_overhead_bytes, repeat_hit_ratio, backward_multiplier, shard_overhead_s, kernel_launch_s
        As in :class:`CostConfig`, fitted.
    element_bytes : Mapping[str, float]
        Byte-equivalents per element of fp16/bf16 rows in the lookup terms (a CPU converts
        half-precision rows, so they cost about what fp32 ones do, not half).
    backward : BackwardTerms or None
        The backward term by term (profiles before 2026-11-26 have none: the backward is then
        ``backward_multiplier`` × the forward).
    row_walk_bytes, page_reach_bytes, bag_bytes : float
        As in :class:`CostConfig`, fitted (``bag_bytes`` 0 in profiles before 2026-11-29).
    comm : Mapping[int, Mapping[str, Any]]
        Per calibrated world size: ``a2a_alpha_s``, ``a2a_Bps``, optionally
        ``a2a_uneven_weight`` (:class:`~.comm_model.SyncCommModel`) and, for ``allreduce``,
        ``reducescatter``, ``allgather``, ``{alpha_s, Bps}``.
    source : str
        The file and how it was measured.
    """

    lookup_Bps: float
    lookup_overhead_bytes: float
    repeat_hit_ratio: float
    backward_multiplier: float
    shard_overhead_s: float
    kernel_launch_s: float
    comm: Mapping[int, Mapping[str, Any]]
    source: str = ""
    element_bytes: Mapping[str, float] = field(default_factory=dict)
    row_walk_bytes: float = 0.0
    page_reach_bytes: float = 1048576.0
    bag_bytes: float = 0.0
    fit_range: FitRange | None = None
    backward: BackwardTerms | None = None
    #: how the machine it was measured on differs from this host (None: this kind of host)
    other_host: str | None = None
    #: the lookup fit's mean relative error, forward + backward, on its own kernel points
    #: (``lookup_fit.total_mape``; None: the file does not say)
    fit_error: float | None = None

    def cost_overrides(self) -> dict:
        """The :class:`CostConfig` fields this profile sets."""
        return {"backward": self.backward,
                "lookup_overhead_bytes": self.lookup_overhead_bytes,
                "repeat_hit_ratio": self.repeat_hit_ratio,
                "backward_multiplier": self.backward_multiplier,
                "shard_overhead_s": self.shard_overhead_s,
                "kernel_launch_s": self.kernel_launch_s,
                "row_walk_bytes": self.row_walk_bytes,
                "page_reach_bytes": self.page_reach_bytes,
                "bag_bytes": self.bag_bytes}

    def world_fit(self, n: int) -> tuple[int, Mapping[str, Any]]:
        """The calibrated world size used for ``n`` ranks (the nearest in log₂, ties upward)
        and its fits."""
        if not self.comm:
            raise ValueError("the CPU profile has no collective fits")
        sizes = sorted(self.comm)
        w = min(sizes, key=lambda s: (abs(math.log2(s) - math.log2(max(n, 1))), -s))
        return w, self.comm[w]

    def comm_model(self, n: int, like: CommModel | None = None) -> CommModel:
        """A :class:`CommModel` for ``n`` ranks on one host from the gloo fits."""
        if n < 2 or not self.comm:
            base = like or CommModel(n=n, node_of=np.zeros(n, dtype=int),
                                     node_size=np.full(n, float(n)), a2a_alpha_s=0.0,
                                     intra_Bps=math.inf, inter_Bps=math.inf)
            return base
        w, e = self.world_fit(n)
        fits = {}
        for kind in ("reducescatter", "allgather", "allreduce"):
            if kind in e:
                fits[kind] = (float(e[kind]["alpha_s"]), float(e[kind]["Bps"]))
        if "reducescatter" in fits:
            fits["host_reducescatter"] = fits["reducescatter"]
        if "allgather" in fits:
            fits["host_allgather"] = fits["allgather"]
        note = "" if w == n else f" (world {n} uses the world-{w} fit)"
        return SyncCommModel(n=n, node_of=np.zeros(n, dtype=int), node_size=np.full(n, float(n)),
                         a2a_alpha_s=float(e["a2a_alpha_s"]), intra_Bps=float(e["a2a_Bps"]),
                         inter_Bps=math.inf, fits=fits,
                         uneven_weight=float(e.get("a2a_uneven_weight", 1.0)),
                         source=f"gloo fits from {self.source}{note}")


def _fit_error(fit: Any, where: str) -> float | None:
    """``lookup_fit.total_mape`` as a fraction in [0, 10], or None when absent."""
    v = fit.get("total_mape") if isinstance(fit, dict) else None
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0.0 <= v <= 10.0:
        raise SpecError(f"total_mape must be a fraction between 0 and 10, got {v!r}",
                        source=where, field="lookup_fit.total_mape",
                        fix="rewrite it with `clusterplan calibrate embedding`")
    return float(v)


def _points_range(points: Any, name: str) -> FitRange | None:
    """The dims, pooling factors and batches of the profile's kernel points (None: no points)."""
    kernels = (points or {}).get("kernels") if isinstance(points, dict) else None
    dims, pools, batches = [], [], []
    for k in kernels or []:
        try:
            batches.append(float(k["batch"]))
            for t in k["tables"]:
                dims.append(float(t[1]))
                pools.append(float(t[2]))
        except (KeyError, TypeError, IndexError, ValueError):
            continue
    if not dims:
        return None
    return FitRange(source=name, embedding_dim=(min(dims), max(dims)),
                    pooling_factor=(min(pools), max(pools)), batch=(min(batches), max(batches)))


def _backward_terms(sec: Any, source: str) -> BackwardTerms | None:
    """The ``lookup.backward`` section, or None when the profile has none."""
    if sec is None:
        return None
    names = [f.name for f in BackwardTerms.__dataclass_fields__.values()]
    if not isinstance(sec, dict):
        raise SpecError("lookup.backward must be a mapping", source=source,
                        field="lookup.backward", fix="rewrite it with `clusterplan calibrate "
                                                     "embedding`")
    vals = {}
    for k in names:
        v = sec.get(k, BackwardTerms.__dataclass_fields__[k].default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise SpecError(f"{k} must be a non-negative number, got {v!r}", source=source,
                            field=f"lookup.backward.{k}",
                            fix="rewrite it with `clusterplan calibrate embedding`")
        vals[k] = float(v)
    return BackwardTerms(**vals)


@functools.lru_cache(maxsize=8)
def load_cpu_profile(path: str | None = None) -> CpuProfile | None:
    """Read a CPU profile YAML; by default this host's (:func:`host_profile_path`) when it was
    measured, else the committed :data:`CPU_PROFILE_PATH`; None when neither exists. A bad or
    missing explicit file raises :class:`~simulator.errors.SpecError`."""
    if path:
        p = Path(path)
    else:
        host = host_profile_path()
        p = host if host.is_file() else CPU_PROFILE_PATH
    if not p.is_file():
        if path:
            raise SpecError("CPU profile not found", source=str(p),
                            fix="run `clusterplan calibrate embedding --out FILE` first")
        return None
    doc = parse_yaml(read_text(p), source=str(p))
    look = doc.get("lookup") if isinstance(doc, dict) else None
    if not isinstance(look, dict):
        raise SpecError("no 'lookup' section", source=str(p), field="lookup",
                        fix="rewrite it with `clusterplan calibrate embedding`")
    vals = {}
    for k in _LOOKUP_FIELDS:
        v = look.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise SpecError(f"{k} must be a non-negative number, got {v!r}", source=str(p),
                            field=f"lookup.{k}", fix="rewrite it with `clusterplan calibrate "
                                                    "embedding`")
        vals[k] = float(v)
    if vals["lookup_Bps"] <= 0:
        raise SpecError("lookup_Bps must be positive", source=str(p), field="lookup.lookup_Bps",
                        fix="rewrite it with `clusterplan calibrate embedding`")
    worlds = ((doc.get("comm") or {}).get("worlds") or {})
    comm = {}
    for k, e in worlds.items():
        try:
            w = int(k)
            entry = {"a2a_alpha_s": float(e["a2a_alpha_s"]), "a2a_Bps": float(e["a2a_Bps"])}
            if e.get("a2a_uneven_weight") is not None:
                entry["a2a_uneven_weight"] = float(e["a2a_uneven_weight"])
                if not 0.0 <= entry["a2a_uneven_weight"] <= 1.0:
                    raise ValueError(f"a2a_uneven_weight {entry['a2a_uneven_weight']} is not "
                                     "between 0 and 1")
            for kind in ("allreduce", "reducescatter", "allgather"):
                if kind in e:
                    entry[kind] = {"alpha_s": float(e[kind]["alpha_s"]),
                                   "Bps": float(e[kind]["Bps"])}
        except (TypeError, ValueError, KeyError) as exc:
            raise SpecError(f"bad collective fit for world {k!r}: {exc}", source=str(p),
                            field=f"comm.worlds.{k}",
                            fix="rewrite it with `clusterplan calibrate embedding`") from None
        comm[w] = entry
    elem = {}
    for k, v in (look.get("element_bytes") or {}).items():
        if k not in ("fp16", "bf16") or not isinstance(v, (int, float)) or not v > 0:
            raise SpecError(f"element_bytes.{k} must be a positive number for fp16/bf16",
                            source=str(p), field=f"lookup.element_bytes.{k}",
                            fix="rewrite it with `clusterplan calibrate embedding`")
        elem[k] = float(v)
    for k, default in (("row_walk_bytes", 0.0), ("page_reach_bytes", 1048576.0),
                       ("bag_bytes", 0.0)):
        v = look.get(k, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or v < 0 or (k == "page_reach_bytes" and v <= 0):
            raise SpecError(f"{k} must be a non-negative number, got {v!r}", source=str(p),
                            field=f"lookup.{k}", fix="rewrite it with `clusterplan calibrate "
                                                    "embedding`")
        vals[k] = float(v)
    vals["backward"] = _backward_terms(look.get("backward"), str(p))
    meas = doc.get("measured") or {}
    vals["fit_range"] = _points_range(doc.get("points"), p.name)
    vals["fit_error"] = _fit_error(doc.get("lookup_fit"), str(p))
    machine = meas.get("machine") if isinstance(meas.get("machine"), dict) else {}
    vals["other_host"] = other_host(machine)
    fitted = doc.get("fitted") if isinstance(doc.get("fitted"), dict) else {}
    refit = f", refitted {fitted['date']}" if fitted.get("date") else ""
    src = f"{p.name} (measured {meas.get('date', '?')} on {machine.get('cpu_model', '?')}{refit})"
    return CpuProfile(comm=comm, source=src, element_bytes=elem, **vals)
