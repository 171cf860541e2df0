"""Roofline op times with size-dependent efficiency.

One op (a GEMM, an elementwise kernel, an attention block) costs a fixed launch overhead plus the
larger of its compute time and its memory time, each at the fraction of peak that an op of its
size actually reaches::

    t = launch + max(flops / (peak[dtype] * eff_matmul[dtype](flops)),
                     bytes / (hbm_bandwidth * eff_memory(bytes)))

Efficiency curves are piecewise linear in log10(size) and clamped at both ends; they are read
from ``traces/efficiency/<gpu>.yaml`` (published priors for GPUs, measurements for ``cpu``):

>>> prof = load_compute_profile("h100-sxm")
>>> t = op_time(prof, flops=2 * 8192**3, bytes_moved=3 * 2 * 8192**2)   # seconds

All quantities are SI: FLOPs, bytes, seconds, FLOP/s, bytes/s.
"""

from __future__ import annotations

import functools
import importlib.resources
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from simulator.efficiency import EfficiencyCurve
from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text
from simulator.hardware import GPUSpec, gpu_names, gpu_spec
from simulator.units import parse_time

__all__ = ["ComputeProfile", "op_time", "op_times", "achieved_flops",
           "load_compute_profile", "generic_profile", "profile_path"]

_PROFILE_KEYS = {"gpu", "source", "launch_overhead", "matmul", "memory", "notes", "measured",
                 "attention", "attention_backward", "unaligned_gemm"}
#: op kinds with their own efficiency curves (falling back to ``matmul`` where a file has none)
OP_KINDS = ("matmul", "attention", "attention_backward")


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeProfile:
    """How fast one GPU kind runs ops of each size.

    Attributes
    ----------
    gpu : GPUSpec
        Peak rates (FLOP/s) and HBM bandwidth (bytes/s) the efficiencies multiply.
    matmul : Mapping[str, EfficiencyCurve]
        Per dtype: efficiency of the compute term vs FLOPs of one op.
    memory : EfficiencyCurve
        Efficiency of the HBM bandwidth vs bytes moved by one op.
    launch_overhead_s : float
        Fixed cost of every non-empty op, seconds.
    source : str
        Where the curves come from (publication or measurement).
    attention, attention_backward : Mapping[str, EfficiencyCurve]
        Per dtype: efficiency of a fused (flash) attention kernel, forward and backward, vs the
        FLOPs it is charged (see :mod:`planner.model.llm.kernels`). A flash kernel is not a GEMM: on
        an H100, PyTorch's flash backend reaches about 30% of the bf16 peak where large GEMMs
        reach 70% (``traces/measured/h100-sxm``). Empty: attention uses the matmul curve.
    unaligned_gemm : Mapping[str, float]
        Per dtype: the fraction of its aligned time's rate a GEMM reaches when a dimension is
        not a multiple of 16 bytes (tensor-core kernels load 16-byte vectors; cuBLAS falls back
        to slower ones). Empty or a dtype missing: no penalty (not measured).
    """

    gpu: GPUSpec
    matmul: Mapping[str, EfficiencyCurve]
    memory: EfficiencyCurve
    launch_overhead_s: float
    source: str
    attention: Mapping[str, EfficiencyCurve] = field(default_factory=dict)
    attention_backward: Mapping[str, EfficiencyCurve] = field(default_factory=dict)
    unaligned_gemm: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for dtype, frac in self.unaligned_gemm.items():
            if not (isinstance(frac, (int, float)) and 0 < frac <= 1):
                raise SpecError(f"unaligned_gemm.{dtype} must be a fraction in (0, 1], got "
                                f"{frac!r}", field=f"unaligned_gemm.{dtype}",
                                fix="write the measured rate of an unaligned GEMM over an "
                                    "aligned one, e.g. 0.3")
        if not math.isfinite(self.launch_overhead_s) or self.launch_overhead_s < 0:
            raise SpecError(f"launch overhead must be non-negative seconds, got "
                            f"{self.launch_overhead_s!r}", field="launch_overhead",
                            fix="write e.g. launch_overhead: 5 us")
        for dtype in self.matmul:
            if dtype not in self.gpu.peak_flops:
                raise SpecError(f"matmul curve for dtype {dtype!r}, but GPU {self.gpu.name!r} "
                                f"has no peak for it (has: {', '.join(self.gpu.peak_flops)})",
                                field=f"matmul.{dtype}",
                                fix="remove the curve or add the peak to the GPU entry")

    def curve(self, kind: str, dtype: str) -> EfficiencyCurve:
        """The efficiency curve of an op ``kind`` (:data:`OP_KINDS`) in ``dtype``: its own
        curve where the file has one, else the matmul curve."""
        own = {"attention": self.attention, "attention_backward": self.attention_backward}
        if kind in own and dtype in own[kind]:
            return own[kind][dtype]
        return self.matmul_curve(dtype)

    def matmul_curve(self, dtype: str) -> EfficiencyCurve:
        """The matmul efficiency curve of ``dtype``; SpecError naming the ones available."""
        try:
            return self.matmul[dtype]
        except KeyError:
            raise SpecError(f"no matmul efficiency curve for dtype {dtype!r} on "
                            f"{self.gpu.name!r}; available: {', '.join(self.matmul)}",
                            field="dtype",
                            fix=f"use one of: {', '.join(self.matmul)}, or add matmul.{dtype} "
                                "to the efficiency file") from None


def op_time(profile: ComputeProfile, *, flops: float, bytes_moved: float,
            dtype: str = "bf16", kind: str = "matmul",
            working_set: float | None = None, aligned: bool = True) -> float:
    """Seconds one op takes: launch overhead + max(compute time, memory time).

    Parameters
    ----------
    profile:
        The GPU's compute profile.
    flops:
        Floating-point operations of the op, FLOPs (0 for a pure data movement).
    bytes_moved:
        Bytes the op reads plus writes in device memory, bytes.
    dtype:
        Data type of the compute (key of ``profile.matmul``); ignored when ``flops`` is 0.
    kind:
        Which efficiency curve the FLOPs follow: ``matmul`` (GEMMs and anything else),
        ``attention`` or ``attention_backward`` (fused flash kernels, where measured).
    working_set:
        Bytes the pass around the op streams through before it touches its operands again,
        bytes (default ``bytes_moved``): the memory curve is read there. The curve was measured
        repeating one op on the same tensors, which stay in cache when small; an op on one
        slice of a larger tensor that a pass walks slice by slice (a per-feature loss over
        the pooled embeddings) finds its slice in DRAM, not cache.
    aligned:
        False for a GEMM with a dimension that is not a multiple of 16 bytes: its time is
        divided by ``profile.unaligned_gemm[dtype]`` where the file measured one.

    Returns
    -------
    float
        Seconds; 0.0 for an empty op (no FLOPs, no bytes), which launches nothing.
    """
    if not (flops >= 0 and bytes_moved >= 0) or math.isinf(flops) or math.isinf(bytes_moved):
        raise SpecError(f"op needs non-negative finite flops and bytes, got flops={flops!r}, "
                        f"bytes_moved={bytes_moved!r}", source="op_time",
                        fix="check the op's cost model")
    if flops == 0 and bytes_moved == 0:
        return 0.0
    t_compute = 0.0
    if flops > 0:
        t_compute = flops / (profile.gpu.peak(dtype) * profile.curve(kind, dtype)(flops))
    t_memory = 0.0
    if bytes_moved > 0:
        at = bytes_moved if working_set is None else max(bytes_moved, working_set)
        t_memory = bytes_moved / (profile.gpu.hbm_bandwidth_Bps * profile.memory(at))
    slow = 1.0 if aligned or flops == 0 else profile.unaligned_gemm.get(dtype, 1.0)
    return profile.launch_overhead_s + max(t_compute, t_memory) / slow


def op_times(profile: ComputeProfile, flops: np.ndarray, bytes_moved: np.ndarray,
             dtype: str = "bf16") -> np.ndarray:
    """Vectorised :func:`op_time` over broadcastable arrays of FLOPs and bytes; seconds."""
    f, b = np.broadcast_arrays(np.asarray(flops, dtype=float), np.asarray(bytes_moved, dtype=float))
    if not (np.all(np.isfinite(f)) and np.all(np.isfinite(b)) and np.all(f >= 0)
            and np.all(b >= 0)):
        raise SpecError("op needs non-negative finite flops and bytes", source="op_times",
                        fix="check the ops' cost model")
    t_compute = np.zeros(f.shape)
    busy_f = f > 0
    if np.any(busy_f):
        rate = profile.gpu.peak(dtype) * profile.matmul_curve(dtype).many(f)
        np.divide(f, rate, out=t_compute, where=busy_f)
    t_memory = np.zeros(b.shape)
    busy_b = b > 0
    if np.any(busy_b):
        rate = profile.gpu.hbm_bandwidth_Bps * profile.memory.many(b)
        np.divide(b, rate, out=t_memory, where=busy_b)
    return np.where(busy_f | busy_b, profile.launch_overhead_s + np.maximum(t_compute, t_memory),
                    0.0)


def achieved_flops(profile: ComputeProfile, flops: float, bytes_moved: float,
                   dtype: str = "bf16") -> float:
    """FLOP/s the op reaches end to end (``flops / op_time``); 0.0 for an empty op."""
    t = op_time(profile, flops=flops, bytes_moved=bytes_moved, dtype=dtype)
    return flops / t if t > 0 else 0.0


def profile_path(gpu: str) -> Path:
    """Path of the shipped efficiency file of catalog kind ``gpu`` (may not exist)."""
    return Path(str(importlib.resources.files("traces").joinpath("efficiency", f"{gpu}.yaml")))


def load_compute_profile(gpu: str | GPUSpec, path: str | Path | None = None) -> ComputeProfile:
    """Read a compute profile: ``traces/efficiency/<gpu>.yaml`` or the file at ``path``.

    Parameters
    ----------
    gpu:
        Catalog kind or a GPUSpec (e.g. a custom GPU from a topology file). The file's ``gpu:``
        field must equal its name. A custom GPU (not in the catalog) with no ``path`` gets
        :func:`generic_profile`, whose ``source`` says so.
    path:
        An efficiency file to read instead of the shipped one.

    Raises
    ------
    SpecError
        If the file is missing, is not YAML, or has a bad field; the error names both.
    """
    if path is None:
        if isinstance(gpu, str):
            return _load_builtin(gpu)
        if gpu.name in gpu_names():
            if gpu == gpu_spec(gpu.name):
                return _load_builtin(gpu.name)
            return _read(gpu, profile_path(gpu.name), f"traces/efficiency/{gpu.name}.yaml")
        return generic_profile(gpu)
    spec = gpu if isinstance(gpu, GPUSpec) else gpu_spec(gpu, source="load_compute_profile")
    return _read(spec, Path(path), str(path))


def generic_profile(gpu: GPUSpec, *, like: str = "h100-sxm") -> ComputeProfile:
    """A prior for a GPU without an efficiency file: ``like``'s curves rescaled to ``gpu``.

    Matmul sizes are scaled by the ratio of peak rates per dtype (``like``'s bf16 curve for dtypes
    it lacks) and memory sizes by the ratio of HBM bandwidths, so each efficiency is reached at
    the same op duration as on ``like``; the launch overhead is ``like``'s.
    """
    base = _load_builtin(like)
    matmul = {}
    for dtype, peak in gpu.peak_flops.items():
        ref = dtype if dtype in base.matmul else "bf16"
        scale = peak / base.gpu.peak(ref)
        matmul[dtype] = EfficiencyCurve(points=[(s * scale, e)
                                                for s, e in base.matmul[ref].points])
    scale = gpu.hbm_bandwidth_Bps / base.gpu.hbm_bandwidth_Bps
    memory = EfficiencyCurve(points=[(s * scale, e) for s, e in base.memory.points])
    return ComputeProfile(gpu=gpu, matmul=matmul, memory=memory,
                          launch_overhead_s=base.launch_overhead_s,
                          source=f"generic prior: {like} efficiency curves rescaled to "
                                 f"{gpu.name}'s peaks (no traces/efficiency/{gpu.name}.yaml)")


@functools.cache
def _load_builtin(name: str) -> ComputeProfile:
    spec = gpu_spec(name, source="load_compute_profile")
    return _read(spec, profile_path(name), f"traces/efficiency/{name}.yaml")


def _read(spec: GPUSpec, path: Path, label: str) -> ComputeProfile:
    if not path.exists():
        raise SpecError(f"no compute-efficiency file for GPU {spec.name!r}", source=label,
                        fix="run 'clusterplan calibrate' on that GPU, or copy a similar GPU's "
                            "file from traces/efficiency/ and set its gpu: field")
    doc = parse_yaml(read_text(path), source=label)
    if not isinstance(doc, dict):
        raise SpecError(f"expected a mapping, got {type(doc).__name__}", source=label,
                        fix="write gpu:, source:, launch_overhead:, matmul:, memory:")
    unknown = sorted(str(k) for k in doc if k not in _PROFILE_KEYS)
    if unknown:
        raise SpecError(f"unknown field {unknown[0]!r}", source=label, field=unknown[0],
                        fix=f"use only: {', '.join(sorted(_PROFILE_KEYS))}")
    for key in ("gpu", "source", "launch_overhead", "matmul", "memory"):
        if doc.get(key) is None:
            raise SpecError("missing field", source=label, field=key,
                            fix=f"add {key}: (see traces/efficiency/h100-sxm.yaml)")
    if doc["gpu"] != spec.name:
        raise SpecError(f"file is for GPU {doc['gpu']!r}, not {spec.name!r}", source=label,
                        field="gpu", fix=f"use the file for {spec.name!r} or set gpu: {spec.name}")
    if not isinstance(doc["source"], str) or not doc["source"].strip():
        raise SpecError(f"expected text naming the source, got {doc['source']!r}", source=label,
                        field="source", fix="name the publication or measurement")
    try:
        launch = parse_time(doc["launch_overhead"], field="launch_overhead")
    except SpecError as exc:
        raise exc.at(source=label) from None
    matmul_doc = doc["matmul"]
    if not isinstance(matmul_doc, dict) or not matmul_doc:
        raise SpecError(f"expected a mapping dtype → [[flops, efficiency], ...], got "
                        f"{matmul_doc!r}", source=label, field="matmul",
                        fix="write e.g. matmul: {bf16: [[1e9, 0.5], [1e11, 0.8]]}")
    matmul = {str(dt): EfficiencyCurve.from_points(pts, source=label, field=f"matmul.{dt}")
              for dt, pts in matmul_doc.items()}
    memory = EfficiencyCurve.from_points(doc["memory"], source=label, field="memory")
    extra = {}
    for key in ("attention", "attention_backward"):
        sub = doc.get(key)
        if sub is None:
            continue
        if not isinstance(sub, dict):
            raise SpecError(f"expected a mapping dtype → [[flops, efficiency], ...], got "
                            f"{sub!r}", source=label, field=key,
                            fix=f"write e.g. {key}: {{bf16: [[1e9, 0.2], [1e11, 0.35]]}}")
        extra[key] = {str(dt): EfficiencyCurve.from_points(pts, source=label,
                                                           field=f"{key}.{dt}")
                      for dt, pts in sub.items()}
    unaligned = doc.get("unaligned_gemm") or {}
    if not isinstance(unaligned, dict):
        raise SpecError(f"expected a mapping dtype → fraction, got {unaligned!r}", source=label,
                        field="unaligned_gemm", fix="write e.g. unaligned_gemm: {bf16: 0.3}")
    try:
        return ComputeProfile(gpu=spec, matmul=matmul, memory=memory, launch_overhead_s=launch,
                              source=f"{label}: {doc['source'].strip()}",
                              unaligned_gemm={str(k): v for k, v in unaligned.items()}, **extra)
    except SpecError as exc:
        raise exc.at(source=label) from None
