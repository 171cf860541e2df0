"""A GPU's compute profile and its trainer host's floor, fitted to measured training steps.

Where no GPU can be timed kernel by kernel (the A100 here), whole training steps measured on it
stand in: vTrain's 1,440 single-node Megatron-DeepSpeed runs on 2, 4 and 8 A100s
(``traces/published/vtrain-single.yaml``). Every row is simulated exactly as
``clusterplan simulate`` does, with a candidate profile, and five physical parameters are
fitted by least squares on ``log(predicted / measured)`` over a fixed **training split**:

============  ==================================================================================
gemm_top      fraction of the tensor-core peak that large fp16/bf16 GEMMs reach
gemm_latency  seconds a GEMM costs beyond its FLOPs (tile ramp and tail): a GEMM of F FLOPs takes
              ``(F + F½) / (peak · gemm_top)`` with ``F½ = gemm_latency · peak · gemm_top``,
              i.e. efficiency ``gemm_top · F / (F + F½)`` (written as curve points)
mem_top       fraction of HBM bandwidth that memory-bound kernels reach
launch        seconds every kernel costs on the GPU (launch and drain)
host_op       host seconds per eager aten op: the trainer host's floor per block pass is this
              times the ops a Megatron-style block dispatches (forward, backward, recompute),
              counted by ``clusterplan calibrate host``
============  ==================================================================================

The split is fixed by the rows themselves, not drawn: a row is **held out** when the SHA-256
of its configuration (group and row name, e.g. ``8 GPUs`` + ``h2048 l24 tp2 dp2 pp2 mbs4
gb32``) is 0 modulo 5, about a fifth of the rows; the rest train. The held-out rows are
predicted with the fitted profile and their error reported beside the training error. The
multi-node vTrain set, Narayanan 2021 and Korthikanti 2022 are never read here.

What the fit writes is exactly what was scored: the curve points come from
:func:`profile_document`, and the candidate loaded from that document is the one simulated.
"""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import astuple, dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

from simulator.compute import ComputeProfile, load_compute_profile
from simulator.efficiency import EfficiencyCurve, monotone_time_points
from simulator.errors import SpecError
from simulator.fileio import parse_yaml
from simulator.topology import load_topology

from planner.llm.metrics import simulate_llm
from planner.model.llm.host import DEFAULT as HOST_DEFAULT, HostOverhead

__all__ = ["StepFitParams", "split", "candidate", "predict", "fit_steps", "profile_document",
           "host_document", "errors_summary", "INITIAL"]

#: tensor-core dtypes whose curves the fit sets (A100: the same peak for both)
GEMM_DTYPES = ("fp16", "bf16")
#: log10 FLOPs of the written GEMM curve points
_CURVE_LOG10 = np.arange(5.0, 13.01, 0.25)


@dataclass(frozen=True, slots=True)
class StepFitParams:
    """The fitted quantities (SI; see the module docstring)."""

    gemm_top: float
    gemm_latency_s: float
    mem_top: float
    launch_s: float
    host_op_s: float

    def as_array(self) -> np.ndarray:
        """The parameters in log space (the search's coordinates)."""
        return np.log(astuple(self))

    @classmethod
    def from_array(cls, x: np.ndarray) -> "StepFitParams":
        v = np.exp(np.asarray(x, dtype=float))
        return cls(*(float(a) for a in v))


#: the starting point: large-GEMM and HBM fractions of the published priors, a 5 µs launch,
#: a 4 µs GEMM tail and the CPU stand-in's host time per op
INITIAL = StepFitParams(gemm_top=0.8, gemm_latency_s=4e-6, mem_top=0.9, launch_s=5e-6,
                        host_op_s=9e-6)
_LOWER = StepFitParams(0.2, 1e-7, 0.2, 1e-7, 1e-7)
_UPPER = StepFitParams(1.0, 1e-4, 1.0, 1e-4, 1e-4)


def held_out(row: dict, *, every: int = 5) -> bool:
    """Whether ``row`` belongs to the held-out split (SHA-256 of its group and name)."""
    key = f"{row['group']}|{row['row']}".encode()
    return int(hashlib.sha256(key).hexdigest(), 16) % every == 0


def split(rows: Sequence[dict], *, every: int = 5) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): see :func:`held_out`."""
    train = [r for r in rows if not held_out(r, every=every)]
    test = [r for r in rows if held_out(r, every=every)]
    return train, test


def _gemm_points(peak: float, p: StepFitParams) -> list[list[float]]:
    half = p.gemm_latency_s * peak * p.gemm_top
    pts = [[float(10 ** x), p.gemm_top * 10 ** x / (10 ** x + half)] for x in _CURVE_LOG10]
    return monotone_time_points(pts, digits=4)


@lru_cache(maxsize=1)
def _host_ops() -> tuple[float, float, float]:
    """Aten ops a Megatron-style block dispatches: forward, backward, extra of full recompute,
    from the shipped host measurement's op counts."""
    doc = parse_yaml((resources.files("traces") / "calibration" / HOST_DEFAULT).read_text(),
                     source=f"traces/calibration/{HOST_DEFAULT}")
    ops = doc["aten_ops_per_block"]
    fwd, plain, rec = float(ops["forward"]), float(ops["plain"]), float(ops["recompute"])
    return fwd, plain - fwd, rec - plain


def profile_document(gpu: str, p: StepFitParams, *, source: str, notes: str = "") -> dict:
    """The ``traces/efficiency/<gpu>.yaml`` mapping of parameters ``p``: fitted fp16/bf16
    GEMM curves, a flat memory efficiency and the launch time; other dtypes keep the curves of
    the shipped file (their peaks are other units; vTrain's runs do not time them)."""
    base = load_compute_profile(gpu)
    matmul = {d: [list(pt) for pt in c.points] for d, c in base.matmul.items()}
    for d in GEMM_DTYPES:
        matmul[d] = _gemm_points(base.gpu.peak(d), p)
    return {"gpu": gpu, "source": source, "launch_overhead": float(f"{p.launch_s:.4g}"),
            "matmul": matmul, "memory": [[1.0, round(p.mem_top, 4)]], "notes": notes}


def host_document(p: StepFitParams, *, source: str) -> dict:
    """The host-overhead file of parameters ``p`` (per block: ops × ``host_op_s``)."""
    f, b, r = _host_ops()
    return {"method": source, "per_block_s": {"forward": f * p.host_op_s,
                                                "backward": b * p.host_op_s,
                                                "recompute_extra": r * p.host_op_s},
            "host_op_s": p.host_op_s, "aten_ops_per_block": {"forward": f, "backward": b,
                                                              "recompute_extra": r}}


def candidate(gpu: str, p: StepFitParams) -> tuple[ComputeProfile, HostOverhead]:
    """The compute profile and host floor that parameters ``p`` describe (as written)."""
    doc = profile_document(gpu, p, source="candidate")
    base = load_compute_profile(gpu)
    matmul = dict(base.matmul)
    for d in GEMM_DTYPES:
        matmul[d] = EfficiencyCurve.from_points(doc["matmul"][d])
    prof = replace(base, matmul=matmul, memory=EfficiencyCurve.from_points(doc["memory"]),
                   launch_overhead_s=doc["launch_overhead"], attention={},
                   attention_backward={}, source="candidate")
    per = host_document(p, source="candidate")["per_block_s"]
    host = HostOverhead(forward_s=per["forward"], backward_s=per["backward"],
                        recompute_s=per["recompute_extra"], source="candidate")
    return prof, host


def predict(rows: Sequence[dict], prof: ComputeProfile | None = None,
            host: HostOverhead | None | str = "measured") -> np.ndarray:
    """Predicted step seconds of each row (as ``clusterplan simulate``; profile and host given)."""
    topos: dict[str, object] = {}
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        topo = topos.setdefault(r["topology"], load_topology(r["topology"]))
        res = simulate_llm(r["spec"], r["parallel"], topo, profile=prof, host=host,
                           schedule_name="interleaved" if r["parallel"].vpp > 1 else "1f1b")
        out[i] = res.step_time_s
    return out


def errors_summary(measured: np.ndarray, predicted: np.ndarray) -> dict:
    """MAPE, mean signed error and worst error (fractions) and the row count."""
    err = predicted / measured - 1
    return {"rows": int(len(err)), "mape": float(np.mean(np.abs(err))),
            "mean_error": float(np.mean(err)), "worst": float(err[np.argmax(np.abs(err))])}


def fit_steps(gpu: str, rows: Sequence[dict], *, start: StepFitParams = INITIAL,
              fixed: Mapping[str, float] | None = None, max_evals: int = 120,
              progress: Callable[[int, float], None] | None = None) -> tuple[StepFitParams, dict]:
    """Least-squares fit of :class:`StepFitParams` to ``rows`` (their ``measured_s``).

    Residuals are ``log(predicted / measured)`` with a soft-L1 loss (a few odd rows do not
    pull the fit), parameters searched in log space within physical bounds; ``fixed`` holds
    parameters (by field name) at given values instead. Returns the parameters and the fit's
    summary (training error, evaluations)."""
    if not rows:
        raise SpecError("no training rows to fit", field="rows", fix="check the set and split")
    names = [f.name for f in fields(StepFitParams)]
    fixed = dict(fixed or {})
    for k in fixed:
        if k not in names:
            raise SpecError(f"unknown fit parameter {k!r}", field="fixed",
                            fix=f"use one of: {', '.join(names)}")
    free = [i for i, k in enumerate(names) if k not in fixed]
    x0 = replace(start, **fixed).as_array()
    measured = np.array([r["measured_s"] for r in rows])
    evals = [0]

    def full(xf: np.ndarray) -> np.ndarray:
        x = x0.copy()
        x[free] = xf
        return x

    def residuals(xf: np.ndarray) -> np.ndarray:
        prof, host = candidate(gpu, StepFitParams.from_array(full(xf)))
        res = np.log(predict(rows, prof, host) / measured)
        evals[0] += 1
        if progress:
            progress(evals[0], float(np.mean(np.abs(np.expm1(res)))))
        return res

    lo, hi = _LOWER.as_array()[free], _UPPER.as_array()[free]
    fit = least_squares(residuals, np.clip(x0[free], lo, hi), bounds=(lo, hi),
                        loss="soft_l1", f_scale=0.1, diff_step=0.05, max_nfev=max_evals)
    best = StepFitParams.from_array(full(fit.x))
    pred = measured * np.exp(fit.fun)
    summary = {"evaluations": evals[0], "status": fit.message,
               "train": errors_summary(measured, pred)}
    return best, summary


def stamp() -> str:
    """Today's date (UTC), for provenance."""
    return datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def describe(p: StepFitParams) -> str:
    """One line of the fitted values in readable units."""
    return (f"GEMM top {p.gemm_top:.3f} of peak, GEMM latency {p.gemm_latency_s * 1e6:.2f} µs, "
            f"HBM {p.mem_top:.3f} of peak, launch {p.launch_s * 1e6:.2f} µs, "
            f"host {p.host_op_s * 1e6:.2f} µs per aten op")
