"""Measured row-gather constants of the lookup model on a GPU, and the ranges they were
measured over.

``traces/calibration/embedding-<gpu>.yaml`` (written by ``clusterplan calibrate gpu-embedding``
from a GPU's ``embedding.csv``, :mod:`planner.measure.tables.fit_gpu`) holds the fraction of HBM
bandwidth an embedding gather reaches (``hbm_efficiency``) and its per-lookup cost in bytes
(``lookup_overhead_bytes``), fitted to forward lookups of tables several times the GPU's L2.
A fused-kernel file (``calibrate gpu-embedding`` on the ``tbe.csv`` of
:mod:`planner.measure.tables.gpu_dlrm`) also holds the L2 hit ratio of repeated rows, the
kernel's fixed cost per call and the backward's terms. A GPU kind with no file of its own takes
the fused constants of the measured kind nearest in HBM bandwidth, and the output says so.

:class:`FitRange` is what any fitted lookup model (this file, or the CPU profile) saw: the
embedding dims, pooling factors and batches of its microbenchmarks. :meth:`FitRange.outside`
lists a model's tables that lie outside them, so the output can flag a prediction as
extrapolated.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.fileio import parse_yaml
from simulator.hardware import gpu_spec

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
    """Fitted lookup constants of one GPU kind (see the module docstring).

    ``measured_on`` is the GPU kind the file was measured on: the same as ``gpu``, or another
    kind whose fused-kernel constants are used, as fractions of this kind's HBM bandwidth, for a
    kind never measured (:func:`load_gpu_lookup`). ``backward`` holds the fused backward's terms
    (``call_s``, ``id_bytes``, ``grad_element_bytes``, ``update_element_bytes``,
    ``half_update_element_bytes``) when the file has them; ``repeat_hit_ratio`` and
    ``call_overhead_s`` likewise (None: the cost model's priors). ``backward_from`` names the
    kind whose file gave the backward terms when this file defers to it (``backward_from:`` in
    the file: a kind whose own backward was measured with a kernel that waits for the host).
    """

    gpu: str
    hbm_efficiency: float
    lookup_overhead_bytes: float
    range: FitRange
    source: str
    kernel: str = ""
    measured_on: str = ""
    repeat_hit_ratio: float | None = None
    call_overhead_s: float | None = None
    backward: Mapping[str, float] | None = None
    backward_from: str = ""
    #: the fit's mean relative error on its own microbenchmarks: the mean of the file's
    #: forward and backward ``mape`` (None: the file records neither)
    fit_error: float | None = None

    @property
    def transferred(self) -> bool:
        """True when the constants were measured on another GPU kind."""
        return bool(self.measured_on) and self.measured_on != self.gpu

    def cost_overrides(self) -> dict[str, float]:
        """The :class:`~planner.model.tables.cost_config.CostConfig` fields this file sets (the
        backward terms apart: the cost model builds them)."""
        out = {"hbm_efficiency": self.hbm_efficiency,
               "lookup_overhead_bytes": self.lookup_overhead_bytes}
        if self.repeat_hit_ratio is not None:
            out["repeat_hit_ratio"] = self.repeat_hit_ratio
        if self.call_overhead_s is not None:
            out["kernel_launch_s"] = self.call_overhead_s
        return out


def gpu_lookup_file(gpu: str) -> str:
    """The shipped file name for GPU kind ``gpu`` (it may not exist)."""
    return f"embedding-{gpu}.yaml"


#: the GPU kinds whose fused-kernel lookups were measured (``traces/measured/<gpu>/dlrm-*``)
FUSED_MEASURED = ("h100-sxm", "h200")


_BACKWARD_KEYS = ("call_s", "id_bytes", "grad_element_bytes", "update_element_bytes",
                  "half_update_element_bytes")


def _number(doc: Mapping, key: str, where: str, hi: float = math.inf,
            zero_ok: bool = False) -> float:
    v = doc.get(key)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and (
        0 <= v <= hi if zero_ok else 0 < v <= hi)
    if not ok:
        raise SpecError(f"{key} must be a {'non-negative' if zero_ok else 'positive'} number "
                        f"(≤ {hi}), got {v!r}", source=where, field=key,
                        fix="rewrite it with `clusterplan calibrate gpu-embedding`")
    return float(v)


def _read_file(gpu: str, follow: bool = True) -> GpuLookup | None:
    path = resources.files("traces") / "calibration" / gpu_lookup_file(gpu)
    if not path.is_file():
        return None
    where = f"traces/calibration/{gpu_lookup_file(gpu)}"
    doc = parse_yaml(path.read_text(encoding="utf-8"), source=where)
    if not isinstance(doc, dict):
        raise SpecError("expected a mapping", source=where,
                        fix="rewrite it with `clusterplan calibrate gpu-embedding`")
    eff = _number(doc, "hbm_efficiency", where, hi=1.0)
    ovh = _number(doc, "lookup_overhead_bytes", where, zero_ok=True)
    opt = {k: _number(doc, k, where, hi=hi, zero_ok=True)
           for k, hi in (("repeat_hit_ratio", 1.0), ("call_overhead_s", 1.0)) if k in doc}
    bwd, frm = _backward(doc, where, follow)
    rng = FitRange.from_mapping(doc.get("range") or {}, source=where)
    return GpuLookup(gpu=gpu, hbm_efficiency=eff, lookup_overhead_bytes=ovh, range=rng,
                     source=f"{where}: {doc.get('method', '')}".strip(),
                     kernel=str(doc.get("kernel", "")), measured_on=gpu, backward=bwd,
                     backward_from=frm, fit_error=_fit_error(doc, where), **opt)


def _fit_error(doc: Mapping, where: str) -> float | None:
    """The mean of ``fit.mape`` and ``fit_backward.mape`` where the file has them."""
    vals = []
    for key in ("fit", "fit_backward"):
        sec = doc.get(key)
        if isinstance(sec, dict) and "mape" in sec:
            vals.append(_number(sec, "mape", f"{where}: {key}", hi=10.0, zero_ok=True))
    return sum(vals) / len(vals) if vals else None


def _backward(doc: Mapping, where: str, follow: bool) -> tuple[dict | None, str]:
    """(backward terms, the kind they come from or ''): the file's own ``backward`` mapping, or
    those of the kind ``backward_from`` names (whose file must hold its own)."""
    frm = doc.get("backward_from")
    if frm is not None:
        other = _read_file(str(frm), follow=False) if follow and isinstance(frm, str) else None
        if other is None or other.backward is None:
            raise SpecError(f"backward_from: {frm!r} names no measured kind with its own "
                            "backward terms", source=where, field="backward_from",
                            fix=f"name one of {', '.join(FUSED_MEASURED)}, or rewrite the file "
                                "with `clusterplan calibrate gpu-embedding`")
        return dict(other.backward), str(frm)
    bwd = doc.get("backward")
    if bwd is None:
        return None, ""
    if not isinstance(bwd, dict):
        raise SpecError("expected a mapping", source=where, field="backward",
                        fix="rewrite it with `clusterplan calibrate gpu-embedding`")
    return {k: _number(bwd, k, where, zero_ok=True) for k in _BACKWARD_KEYS}, ""


def _nearest_measured(gpu: str) -> GpuLookup | None:
    """The fused-kernel file of the measured kind whose HBM bandwidth is nearest ``gpu``'s (in
    ratio): a random-row gather reaches a larger fraction of a slower memory (measured: 0.75 of
    an H100's 3.35 TB/s, 0.64 of an H200's 4.8 TB/s), so the nearest bandwidth transfers best."""
    try:
        bw = float(gpu_spec(gpu).hbm_bandwidth_Bps)
    except SpecError:
        return None
    found = [(abs(math.log(bw / float(gpu_spec(k).hbm_bandwidth_Bps))), k, f)
             for k in FUSED_MEASURED if (f := _read_file(k)) is not None and f.backward]
    return min(found)[2] if found else None


@functools.lru_cache(maxsize=16)
def load_gpu_lookup(gpu: str) -> GpuLookup | None:
    """The measured lookup constants of GPU kind ``gpu`` from ``traces/calibration/``.

    A kind never measured gets the fused-kernel constants of the measured kind nearest in HBM
    bandwidth (:func:`_nearest_measured`; efficiency, per-lookup bytes, L2 repeat hits and
    backward terms are fractions of bandwidth and byte-equivalents), marked ``transferred`` so
    the output says so; None only when there is none (``cpu``: never). A malformed file raises
    :class:`SpecError`."""
    if gpu == "cpu":
        return None
    own = _read_file(gpu)
    if own is not None:
        return own
    ref = _nearest_measured(gpu)
    return None if ref is None else replace(ref, gpu=gpu)
