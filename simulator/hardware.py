"""The GPU catalog: peak compute per dtype, HBM size and bandwidth, NVLink bandwidth, TDP.

Entries live in ``simulator/data/gpus.yaml``; every number there names its source. A topology
file names a catalog kind (``gpu: h100-sxm``) or defines a custom GPU inline with the same fields
(plus ``name:``), read by :func:`gpu_spec_from_dict`:

>>> gpu_spec("h100-sxm").peak("bf16")
989400000000000.0
>>> gpu_spec("a100-80gb").hbm_bandwidth_Bps
2039000000000.0

All quantities are SI: FLOP/s, bytes, bytes/s, watts.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from dataclasses import dataclass
from typing import Any, Mapping

import yaml

from simulator.errors import SpecError
from simulator.fileio import SAFE_LOADER
from simulator.units import parse_bandwidth, parse_bytes, parse_flops

__all__ = ["DTYPES", "GPUSpec", "gpu_names", "gpu_spec", "gpu_spec_from_dict", "CATALOG_SOURCE"]

#: Data types a GPU entry may list a peak rate for.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

#: How errors name the catalog file.
CATALOG_SOURCE = "simulator/data/gpus.yaml"

_FIELDS = {"name", "vendor_name", "peak_flops", "hbm_bytes", "hbm_bandwidth", "nvlink_bandwidth",
           "tdp_watts", "sources", "notes"}
_NUMBER_FIELDS = ("hbm_bytes", "hbm_bandwidth", "nvlink_bandwidth", "tdp_watts")


@dataclass(frozen=True, slots=True, kw_only=True)
class GPUSpec:
    """One accelerator kind (or a CPU standing in for one).

    Attributes
    ----------
    name : str
        Catalog key, e.g. ``'h100-sxm'``.
    vendor_name : str
        Marketing name, e.g. ``'NVIDIA H100 SXM5 80GB'``.
    peak_flops : Mapping[str, float]
        Dense (no sparsity) peak rate per dtype, FLOP/s (int8: OP/s).
    hbm_bytes : int
        Device memory capacity, bytes.
    hbm_bandwidth_Bps : float
        Device memory bandwidth, bytes/s.
    nvlink_bandwidth_Bps : float
        NVLink bandwidth per GPU per direction, bytes/s (0 where there is none).
    tdp_watts : float or None
        Thermal design power, watts; None where not published.
    sources : Mapping[str, str]
        Where each number comes from, keyed by field name (``peak_flops`` or
        ``peak_flops.<dtype>``, ``hbm_bytes``, ...).
    """

    name: str
    vendor_name: str
    peak_flops: Mapping[str, float]
    hbm_bytes: int
    hbm_bandwidth_Bps: float
    nvlink_bandwidth_Bps: float
    tdp_watts: float | None = None
    sources: Mapping[str, str]

    def peak(self, dtype: str) -> float:
        """Dense peak rate for ``dtype``, FLOP/s; SpecError if the GPU lists none for it."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise SpecError(
                f"GPU {self.name!r} has no peak rate for dtype {dtype!r}; "
                f"available: {', '.join(self.peak_flops)}",
                field="dtype", fix=f"use one of: {', '.join(self.peak_flops)}") from None

    def source_of(self, field: str) -> str | None:
        """Source of a number, e.g. ``source_of('peak_flops.bf16')``; None if unstated."""
        if field in self.sources:
            return self.sources[field]
        head = field.split(".", 1)[0]
        return self.sources.get(head)


def _num(value: Any, *, source: str | None, field: str, minimum_exclusive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"expected a number, got {value!r}", source=source, field=field,
                        fix="write a plain number")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (minimum_exclusive and x == 0):
        raise SpecError(f"must be a positive finite number, got {value!r}", source=source,
                        field=field, fix="write a positive number")
    return x


def _located(exc: SpecError, source: str | None, field: str) -> SpecError:
    return SpecError(exc.message, source=source, field=field, fix=exc.fix)


def gpu_spec_from_dict(name: str, mapping: Mapping[str, Any], *, source: str | None,
                       field: str | None = "gpu", require_sources: bool = False) -> GPUSpec:
    """Validate one GPU mapping (catalog entry or inline topology ``gpu:``) into a GPUSpec.

    Parameters
    ----------
    name:
        The GPU kind's name.
    mapping:
        Fields ``vendor_name`` (optional for custom GPUs), ``peak_flops`` (dtype → FLOP/s as a
        number or a string such as ``'989.4 TFLOP/s'``), ``hbm_bytes`` (bytes or ``'80 GB'``),
        ``hbm_bandwidth`` (bytes/s or ``'3.35 TB/s'``), ``nvlink_bandwidth`` (per direction,
        bytes/s; optional, default 0), ``tdp_watts`` (watts, optional), ``sources`` (field →
        text), ``notes``; a ``name`` key is allowed and ignored.
    source:
        The file the mapping came from, for error messages.
    field:
        Dotted path of the mapping in that file (``'gpu'`` in a topology file).
    require_sources:
        Demand a source for every number (the built-in catalog does).
    """
    def path(sub: str) -> str:
        return f"{field}.{sub}" if field else sub

    _check_fields(name, mapping, source, field, path)
    vendor = mapping.get("vendor_name", name)
    if not isinstance(vendor, str):
        raise SpecError(f"expected a string, got {vendor!r}", source=source,
                        field=path("vendor_name"), fix="write the marketing name as text")
    peaks = _peaks(mapping["peak_flops"], source, path)

    def quantity(key: str, parse, **kw) -> Any:
        try:
            return parse(mapping[key], **kw)
        except SpecError as exc:
            raise _located(exc, source, path(key)) from None

    hbm_bytes = quantity("hbm_bytes", parse_bytes, allow_zero=False)
    hbm_bw = quantity("hbm_bandwidth", parse_bandwidth)
    nvlink = mapping.get("nvlink_bandwidth", 0)
    try:
        nvlink_bw = parse_bandwidth(0 if nvlink is None else nvlink, allow_zero=True)
    except SpecError as exc:
        raise _located(exc, source, path("nvlink_bandwidth")) from None
    tdp = mapping.get("tdp_watts")
    tdp_w = None if tdp is None else _num(tdp, source=source, field=path("tdp_watts"),
                                          minimum_exclusive=True)
    sources = _sources(mapping, peaks, source, path, require=require_sources)
    return GPUSpec(name=name, vendor_name=vendor, peak_flops=peaks, hbm_bytes=hbm_bytes,
                   hbm_bandwidth_Bps=hbm_bw, nvlink_bandwidth_Bps=nvlink_bw, tdp_watts=tdp_w,
                   sources=sources)


def _check_fields(name, mapping, source: str | None, field: str | None, path) -> None:
    """A GPU's name is text, its mapping has only known fields and every required one."""
    if not isinstance(name, str) or not name.strip():
        raise SpecError(f"GPU name must be a non-empty string, got {name!r}", source=source,
                        field=path("name"), fix="write e.g. name: my-gpu")
    if not isinstance(mapping, Mapping):
        raise SpecError(f"expected a mapping of GPU fields, got {mapping!r}", source=source,
                        field=field, fix="write peak_flops, hbm_bytes, hbm_bandwidth, ...")
    unknown = sorted(str(k) for k in mapping if k not in _FIELDS)
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r}", source=source, field=path(unknown[0]),
                        fix=f"use only: {', '.join(sorted(_FIELDS))}")
    for required in ("peak_flops", "hbm_bytes", "hbm_bandwidth"):
        if mapping.get(required) is None:
            raise SpecError("missing field", source=source, field=path(required),
                            fix=f"add {required}: (see {CATALOG_SOURCE} for examples)")


def _peaks(raw_peaks, source: str | None, path) -> dict[str, float]:
    """``peak_flops``: FLOP/s per dtype."""
    if not isinstance(raw_peaks, Mapping) or not raw_peaks:
        raise SpecError(f"expected a mapping dtype → FLOP/s, got {raw_peaks!r}", source=source,
                        field=path("peak_flops"),
                        fix="write e.g. peak_flops: {bf16: 989.4 TFLOP/s}")
    peaks: dict[str, float] = {}
    for dtype, value in raw_peaks.items():
        fp = path(f"peak_flops.{dtype}")
        if dtype not in DTYPES:
            raise SpecError(f"unknown dtype {dtype!r}", source=source, field=fp,
                            fix=f"use one of: {', '.join(DTYPES)}")
        try:
            peaks[dtype] = parse_flops(value)
        except SpecError as exc:
            raise _located(exc, source, fp) from None
    return peaks


def _sources(mapping, peaks: dict[str, float], source: str | None, path, *,
             require: bool) -> dict[str, str]:
    """``sources``: field → where its number comes from; with ``require`` every number
    given (each dtype's peak, or ``peak_flops`` for all) must have one."""
    raw_sources = mapping.get("sources") or {}
    if not isinstance(raw_sources, Mapping):
        raise SpecError(f"expected a mapping field → source text, got {raw_sources!r}",
                        source=source, field=path("sources"),
                        fix="write e.g. sources: {peak_flops: NVIDIA H100 datasheet}")
    sources: dict[str, str] = {}
    for key, text in raw_sources.items():
        if not isinstance(text, str) or not text.strip():
            raise SpecError(f"source must be non-empty text, got {text!r}", source=source,
                            field=path(f"sources.{key}"), fix="name the datasheet or measurement")
        sources[str(key)] = text.strip()
    if require:
        needed = [f"peak_flops.{d}" for d in peaks]
        needed += [k for k in _NUMBER_FIELDS if mapping.get(k) is not None]
        for key in needed:
            if key not in sources and key.split(".", 1)[0] not in sources:
                raise SpecError(f"no source for {key}", source=source, field=path("sources"),
                                fix=f"add sources.{key} (or sources.{key.split('.')[0]}) naming "
                                    "the datasheet or measurement")
    return sources


@functools.cache
def _catalog() -> dict[str, GPUSpec]:
    text = importlib.resources.files("simulator.data").joinpath("gpus.yaml").read_text("utf-8")
    try:
        doc = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as exc:
        raise SpecError(f"not valid YAML: {exc}", source=CATALOG_SOURCE,
                        fix="repair the file") from None
    if not isinstance(doc, dict) or not doc:
        raise SpecError("expected a mapping of GPU kind → fields", source=CATALOG_SOURCE,
                        fix="repair the file")
    return {str(k): gpu_spec_from_dict(str(k), v, source=CATALOG_SOURCE, field=str(k),
                                       require_sources=True)
            for k, v in doc.items()}


def gpu_names() -> list[str]:
    """Catalog GPU kinds, in catalog order (by generation, then ``cpu``)."""
    return list(_catalog())


def gpu_spec(name: str, *, source: str | None = None, field: str | None = None) -> GPUSpec:
    """The catalog entry ``name``; SpecError (located at ``source``/``field``) if unknown."""
    catalog = _catalog()
    try:
        return catalog[name]
    except (KeyError, TypeError):
        raise SpecError(f"unknown GPU kind {name!r}; known: {', '.join(catalog)}",
                        source=source, field=field,
                        fix=f"use one of the known kinds or add an entry to {CATALOG_SOURCE}"
                        ) from None
