"""Measured row-gather constants of the lookup model on a GPU, and the ranges they were
measured over.

``traces/calibration/embedding-<gpu>.yaml`` (written by ``clusterplan calibrate gpu-embedding``
from a GPU's ``embedding.csv``, :mod:`planner.measure.tables.fit_gpu`) holds the fraction of HBM
bandwidth an embedding gather reaches (``hbm_efficiency``) and its per-lookup cost in bytes
(``lookup_overhead_bytes``), fitted to forward lookups of tables several times the GPU's L2.
Where a GPU kind has no such file the cost model keeps its priors (0.8 and 64 bytes) and says so.

:class:`FitRange` is what any fitted lookup model (this file, or the CPU profile) saw: the
embedding dims, pooling factors and batches of its microbenchmarks. :meth:`FitRange.outside`
lists a model's tables that lie outside them, so the output can flag a prediction as
extrapolated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.fileio import parse_yaml

__all__ = ["FitRange", "GpuLookup", "load_gpu_lookup", "gpu_lookup_file"]

_RANGE_KEYS = ("embedding_dim", "pooling_factor", "batch")


@dataclass(frozen=True)
class FitRange:
    """Inclusive ``(low, high)`` of each input a lookup fit was measured over, and the file."""

    source: str
    embedding_dim: tuple[float, float]
    pooling_factor: tuple[float, float]
    batch: tuple[float, float]

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], *, source: str) -> "FitRange":
        vals = {}
        for k in _RANGE_KEYS:
            v = doc.get(k)
            ok = (isinstance(v, (list, tuple)) and len(v) == 2
                  and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                          and math.isfinite(x) for x in v) and 0 <= v[0] <= v[1])
            if not ok:
                raise SpecError(f"range.{k} must be [low, high], got {v!r}", source=source,
                                field=f"range.{k}", fix="rewrite the file with clusterplan "
                                                       "calibrate")
            vals[k] = (float(v[0]), float(v[1]))
        return cls(source=source, **vals)

    def to_dict(self) -> dict:
        return {k: list(getattr(self, k)) for k in _RANGE_KEYS}

    def outside(self, model) -> list[str]:
        """One line per input of ``model`` (a table spec's :class:`ModelSpec`) outside the
        measured range, naming up to three tables; empty when everything was measured. The
        batch is the global batch: what a table- or column-wise shard's kernel serves."""
        out = []
        for key, unit in (("embedding_dim", ""), ("pooling_factor", "")):
            lo, hi = getattr(self, key)
            bad = [t for t in model.tables if not lo <= getattr(t, key) <= hi]
            if bad:
                names = ", ".join(f"{t.name} ({getattr(t, key):g})" for t in bad[:3])
                more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
                out.append(f"{key} of {names}{more} outside the measured {lo:g}-{hi:g}{unit}")
        lo, hi = self.batch
        if not lo <= model.batch_size <= hi:
            out.append(f"batch {model.batch_size:,} outside the measured {lo:,.0f}-{hi:,.0f} "
                       "samples per lookup kernel")
        return [f"{line} ({self.source})" for line in out]


@dataclass(frozen=True)
class GpuLookup:
    """Fitted lookup constants of one GPU kind (see the module docstring)."""

    gpu: str
    hbm_efficiency: float
    lookup_overhead_bytes: float
    range: FitRange
    source: str


def gpu_lookup_file(gpu: str) -> str:
    """The shipped file name for GPU kind ``gpu`` (it may not exist)."""
    return f"embedding-{gpu}.yaml"


@functools.lru_cache(maxsize=16)
def load_gpu_lookup(gpu: str) -> GpuLookup | None:
    """The measured lookup constants of GPU kind ``gpu`` from ``traces/calibration/``, or None
    when that kind was never measured. A malformed file raises :class:`SpecError`."""
    path = resources.files("traces") / "calibration" / gpu_lookup_file(gpu)
    if not path.is_file():
        return None
    where = f"traces/calibration/{gpu_lookup_file(gpu)}"
    doc = parse_yaml(path.read_text(encoding="utf-8"), source=where)
    if not isinstance(doc, dict):
        raise SpecError("expected a mapping", source=where,
                        fix="rewrite it with `clusterplan calibrate gpu-embedding`")
    vals = {}
    for k, hi in (("hbm_efficiency", 1.0), ("lookup_overhead_bytes", math.inf)):
        v = doc.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= hi:
            raise SpecError(f"{k} must be a positive number (≤ {hi}), got {v!r}", source=where,
                            field=k, fix="rewrite it with `clusterplan calibrate gpu-embedding`")
        vals[k] = float(v)
    rng = FitRange.from_mapping(doc.get("range") or {}, source=where)
    return GpuLookup(gpu=gpu, range=rng, source=f"{where}: {doc.get('method', '')}".strip(),
                     **vals)
