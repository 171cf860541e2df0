"""``clusterplan calibrate embedding``: fit the CPU profile of the sharding cost model to
microbenchmarks on this machine.

Two sweeps, neither of which looks at a benchmark task or a plan:

1. **Kernels.** ``--kernel-points`` seeded single-rank configurations
   (:func:`.kernel_sweep.kernel_configs`) over the ranges a plan meets: half structured (1 to 16
   tables, rows 10³…10⁷ log-uniform, dims 4…256, pooling factors 1…64 log-uniform, batches
   1,024…65,536, three access distributions: every lookup a distinct row as far as the table
   allows, the dlrm_datasets reuse histogram, Zipf 1.05) and half synthetic shard sets of 1 to
   24 generator tables (a quarter fp16), each timed as one fused TBE (forward, backward with the
   fused SGD update; one thread; caches flushed; median of ``--repeats``), configurations
   interleaved so load from other processes spreads over all. The cost model's lookup time of a
   configuration is (``p`` bytes per weight, ids 8 bytes, pooled outputs 4 bytes) ::

       fwd = launch + T·shard_overhead + Σ_tables [ids·(miss·dim·p + 8) + batch·dim·4] / BW
                 + Σ_tables [ids · overhead_bytes + distinct · walk_bytes · log2(bytes/reach)
                             + batch · bag_bytes] / BW
       bwd = call + T·shard + Σ_tables [ids·(id_b + dim·grad_b) + distinct·(dim·update_b
                 + walk_b · log2(bytes/reach)) + batch·dim·bag_element_b] / BW

   with ``miss = u + (1 − u)(1 − h)`` (``u`` distinct rows per lookup, ``h`` the repeat hit
   ratio). The forward is fitted alone, non-negative coefficients minimising the squared
   log of predicted over measured (:func:`~.logfit.fit_log_nonneg`), for each ``h`` and page
   reach on a grid (the lowest error wins); the backward then on its own
   terms (FBGEMM's CPU backward sorts ids by row, gathers each id's fp32 output gradient and
   updates each distinct row once: :class:`~planner.model.tables.cpu_profile.BackwardTerms`).
2. **Collectives.** For each world size in ``--worlds`` (default 2, 4, 8) a gloo group of that
   many processes times all-to-alls (even and plan-like uneven splits, 4 B … 4 MiB per peer)
   and all-reduce, reduce-scatter and all-gather (4 KiB … 16 MiB); fitted per rank as
   ``alpha + max(sent, received) / Bps`` for the all-to-all (the form of
   :meth:`~planner.model.tables.comm_model.CommModel.a2a_times`) and ``alpha + bytes / Bps`` for
   the others (``calibrate_comm.py``).

The result is a YAML file (default: this host's, keyed by its fingerprint in the calibration
cache folder; the committed one is ``traces/calibration/cpu-embedding.yaml``) with the fitted
numbers, the fit errors, every measured point, and how it was measured (machine, versions,
date, command). :func:`planner.model.tables.cpu_profile.load_cpu_profile` reads it; a plan on a CPU
topology (``localhost-gloo``) is then costed with it, and says so when the profile it uses was
measured on another kind of host.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from simulator.errors import SpecError
from simulator.fileio import atomic_write_text

from planner.machine import MMAP_THRESHOLD_BYTES, cpu_description
from planner.measure.tables.comm import oversubscription
from planner.measure.tables.fit_comm import fit_comm_profile, measure_comm_points
from planner.measure.tables.kernel_sweep import (
    DISTRIBUTIONS,
    kernel_configs,
    measure_kernel_points,
    point_model,
)
from planner.measure.tables.tbe import kernel_backend
from planner.measure.tables.logfit import fit_log_nonneg, log_error
from planner.model.tables.cpu_profile import load_cpu_profile
from planner.model.tables.lookup_cost import table_accesses_per_row
from planner.model.tables.spec import ModelSpec, TableSpec

__all__ = ["kernel_configs", "measure_kernel_points", "fit_kernel_profile", "calibrate",
           "refit_profile", "kernel_predictions", "DISTRIBUTIONS", "point_model"]

#: page reaches tried for the address-translation term (bytes)
REACH_GRID = tuple(float(2 ** k) for k in (18, 19, 20, 21, 22, 23))
ID_BYTES = 8
#: bytes of one fp16 / bf16 element
HALF_BYTES = 2.0
OUT_BYTES = 4
#: bytes of output gradient rows a core keeps in cache in the backward (the spill term's reach)
GRAD_REACH_BYTES = 2.0 ** 18


def _unique_fraction(t: TableSpec, batch: int) -> float:
    """Distinct rows per lookup as the cost model computes it."""
    return 1.0 / table_accesses_per_row(t, batch)


def _design(points: Sequence[dict], h: float, reach: float = 2.0 ** 20) -> np.ndarray:
    """Columns ``[1, T, bytes, half_elements, ids, walks, bags]`` of the lookup model for repeat hit
    ratio ``h`` and page reach ``reach``: ``bytes`` = row bytes missed (fp16/bf16 ones at their
    2 bytes) + 8 per id + 4 per pooled output element; ``half_elements`` = fp16/bf16 row
    elements missed, whose extra cost per element is fitted apart (on a CPU, half-precision rows
    are converted, so they do not cost half of fp32; the sweep's half-precision tables all have
    one dim, so the extra may also come out 0, and a half element then costs its 2 bytes);
    ``walks`` = distinct rows × log2(table bytes / reach); ``bags`` = batch × tables, the
    pooled outputs (each bag's offsets read and its output row started, whatever its ids: a
    pooling-1 table pays it once per id, a pooling-50 one once per 50)."""
    rows = []
    for p in points:
        m = point_model(p)
        B = m.batch_size
        byts = half = ids_total = walks = 0.0
        for t in m.tables:
            ids = B * t.pooling_factor
            u = _unique_fraction(t, B)
            miss = u + (1.0 - u) * (1.0 - h)
            byts += ids * miss * t.embedding_dim * t.bytes_per_element
            if t.precision != "fp32":
                half += ids * miss * t.embedding_dim
            byts += ids * ID_BYTES + B * t.embedding_dim * OUT_BYTES
            ids_total += ids
            walks += ids * u * math.log2(max(1.0, t.weight_bytes / reach))
        rows.append([1.0, float(len(m.tables)), byts, half, ids_total, walks,
                     float(B * len(m.tables))])
    return np.array(rows)


def _backward_design(points: Sequence[dict], reach: float,
                     grad_reach: float = GRAD_REACH_BYTES) -> np.ndarray:
    """Columns ``[ids, grad_elements, update_elements, half_update_elements, walks, spills,
    bag_elements]``
    of the backward (:class:`~planner.model.tables.cpu_profile.BackwardTerms`): ids; ids × dim
    (each id reads its sample's fp32 gradient row); distinct rows × dim, fp32 and fp16/bf16
    apart (each row read, updated, written once); distinct rows × log2(table bytes / reach);
    ids × dim × log2(batch × dim × 4 / ``grad_reach``) (the gradient rows stop fitting in the
    core's cache as the batch grows); batch × dim (each bag's output-gradient row read once
    for the bag, whatever its ids: without it the backward of pooling-1 kernel points came out
    0.71x measured, of pooling 8-20 ones 1.01x, on the committed profile's 160 points)."""
    rows = []
    for p in points:
        m = point_model(p)
        B = m.batch_size
        ids_t = grad = upd = half = walks = spills = bag_el = 0.0
        for t in m.tables:
            ids = B * t.pooling_factor
            unique = ids * _unique_fraction(t, B)
            ids_t += ids
            grad += ids * t.embedding_dim
            if t.precision == "fp32":
                upd += unique * t.embedding_dim
            else:
                half += unique * t.embedding_dim
            walks += unique * math.log2(max(1.0, t.weight_bytes / reach))
            spills += ids * t.embedding_dim * math.log2(
                max(1.0, B * t.embedding_dim * OUT_BYTES / grad_reach))
            bag_el += B * t.embedding_dim
        rows.append([ids_t, grad, upd, half, walks, spills, bag_el])
    return np.array(rows)


def _fresh_bytes(points: Sequence[dict]) -> np.ndarray:
    """Bytes of each point's new output tensors above glibc's mmap threshold: the fused
    kernel's pooled output (batch × its columns × 4, one per precision group) is mapped anew,
    and so is the output gradient its backward receives; their page faults are the step
    model's to charge (:func:`planner.workloads.dlrm.torchrec.pooled_moves`), not the
    kernel's, so the fit takes them out."""
    out = []
    for p in points:
        m = point_model(p)
        tot = 0.0
        for half in (False, True):
            nbytes = m.batch_size * OUT_BYTES * sum(
                t.embedding_dim for t in m.tables if (t.precision != "fp32") == half)
            tot += nbytes if nbytes > MMAP_THRESHOLD_BYTES else 0.0
        out.append(tot)
    return np.array(out)


def _mape(pred, meas) -> float:
    return float(np.mean(np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)))


def _fit_forward(points: Sequence[dict], yf: np.ndarray, fresh: np.ndarray):
    """Best forward fit over the (page reach, repeat hit ratio) grid: ``(err, h, reach, coef)``
    with ``coef = [launch, shard_overhead, c, c16, d, cw, bag, page_fault]`` (see :func:`_design`;
    the last per byte of ``fresh``), each by :func:`~.logfit.fit_log_nonneg`, the lowest
    :func:`~.logfit.log_error` kept."""
    best = None
    for reach in REACH_GRID:
        for h in np.linspace(0.0, 1.0, 21):
            X = np.column_stack([_design(points, float(h), reach), fresh])
            coef = fit_log_nonneg(X, yf)
            err = log_error(X @ coef, yf)
            if best is None or err < best[0] - 1e-12:
                best = (err, float(h), reach, coef)
    return best


def _coefficients(points: Sequence[dict], yf: np.ndarray, yb: np.ndarray) -> tuple:
    """``(h, reach, forward coefficients, backward coefficients)`` of the kernel fit (see
    :func:`fit_kernel_profile`)."""
    fresh = _fresh_bytes(points)
    _, h, reach, coef = _fit_forward(points, yf, fresh)
    Xb = np.column_stack([_design(points, h, reach)[:, :2], _backward_design(points, reach),
                          fresh])
    return h, reach, coef, fit_log_nonneg(Xb, yb)


def kernel_predictions(points: Sequence[dict], models: Sequence[ModelSpec]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of ``models`` (one rank's fused kernel each, as the sweep
    times them: page faults of new outputs included) by the kernel fit of ``points``: a fit
    checked on configurations it never saw (``tests/bench/bench_kernel_holdout.py``)."""
    yf = np.array([p["fwd_s"] for p in points])
    yb = np.array([p["bwd_s"] for p in points])
    h, reach, coef, bcoef = _coefficients(points, yf, yb)
    fresh = _fresh_bytes(models)
    X = _design(models, h, reach)
    Xb = np.column_stack([X[:, :2], _backward_design(models, reach), fresh])
    return np.column_stack([X, fresh]) @ coef, Xb @ bcoef


def fit_kernel_profile(points: Sequence[dict]) -> dict:
    """Fit the lookup part of the CPU profile to kernel points (see the module docstring).

    The forward is fitted alone: ``launch + T·shard_overhead + c·bytes + c16·half_elements +
    d·ids + cw·walks + g·bags`` plus the page faults of its new output
    (:func:`_fresh_bytes`), with non-negative coefficients minimising the squared log ratio of
    predicted to measured (:func:`~.logfit.fit_log_nonneg`) for every repeat hit ratio ``h``
    and page reach on a grid, keeping the best. The backward is then fitted on its own terms
    (:func:`_backward_design`, plus its fixed part and its own page faults), each coefficient
    kept as byte-equivalents at the forward's bandwidth ``1 / c``. The page faults are reported
    (``page_fault_Bps``) but left out of the lookup terms: the step model charges them.
    ``backward_multiplier`` (the backward's variable part over the forward's, least squares) is
    kept for readers without the terms. Half-precision rows cost ``c16 / c`` byte-equivalents per
    element on top of their own 2 bytes (``element_bytes``: ``2 + c16 / c``).
    """
    if len(points) < 9:
        raise SpecError(f"{len(points)} kernel points are too few to fit",
                        source="--kernel-points", fix="measure at least 9 (default 120)")
    yf = np.array([p["fwd_s"] for p in points])
    yb = np.array([p["bwd_s"] for p in points])
    if not np.all(yf > 0) or not np.all(yb > 0):
        raise SpecError("a kernel point timed 0 s", source="calibrate embedding",
                        fix="rerun; check that the kernels ran")
    h, reach, coef, bcoef = _coefficients(points, yf, yb)
    launch, s0, c, c16, d, cw, g, fault_f = (float(x) for x in coef)
    if c <= 0:
        raise SpecError("the kernel fit found no per-byte cost (all timings flat?)",
                        source="calibrate embedding", fix="rerun on a quieter machine")
    fresh = _fresh_bytes(points)
    X = _design(points, h, reach)
    Xb = np.column_stack([X[:, :2], _backward_design(points, reach), fresh])
    pred_f = X @ coef[:-1]
    pred_b = Xb[:, :-1] @ bcoef[:-1]
    var_f = pred_f - launch - X[:, 1] * s0
    var_b = pred_b - bcoef[0] - X[:, 1] * bcoef[1]
    mult = float(np.sum(var_f * var_b) / max(float(np.sum(var_f * var_f)), 1e-30))
    b_id, b_grad, b_upd, b_half, b_walk, b_spill, b_bag = (float(x) / c for x in bcoef[2:-1])
    fault = [x for x in (fault_f, float(bcoef[-1])) if x > 0]
    out = {"lookup_Bps": 1.0 / c, "lookup_overhead_bytes": d / c,
           "repeat_hit_ratio": h, "backward_multiplier": mult, "shard_overhead_s": s0,
           "kernel_launch_s": launch, "row_walk_bytes": cw / c, "page_reach_bytes": reach,
           "bag_bytes": g / c,
           "backward": {"call_s": float(bcoef[0]), "shard_s": float(bcoef[1]),
                        "id_bytes": b_id, "grad_element_bytes": b_grad,
                        "update_element_bytes": b_upd,
                        "half_update_element_bytes": b_half if np.any(Xb[:, 5] > 0) else b_upd,
                        "walk_bytes": b_walk, "spill_element_bytes": b_spill,
                        "grad_reach_bytes": GRAD_REACH_BYTES,
                        "bag_element_bytes": b_bag},
           "page_fault_Bps": float(len(fault) / sum(fault)) if fault else None}
    if np.any(X[:, 3] > 0):
        out["element_bytes"] = {"fp16": HALF_BYTES + c16 / c, "bf16": HALF_BYTES + c16 / c}
    full_f, full_b = np.column_stack([X, fresh]) @ coef, Xb @ bcoef
    yt = yf + yb
    out["fit"] = {"points": len(points), "total_mape": _mape(full_f + full_b, yt),
                  "total_max_abs_error": float(np.max(np.abs((full_f + full_b) / yt - 1.0))),
                  "fwd_mape": _mape(full_f, yf), "bwd_mape": _mape(full_b, yb),
                  "page_faults": "in the fitted times; left out of the lookup terms"}
    return out


# ---------------------------------------------------------------------------------------------

def calibrate(*, kernel_points: int = 120, worlds: Sequence[int] = (2, 4, 8), repeats: int = 7,
              seed: int = 0, backend: str = "auto", rounds: int = 2, command: str | None = None,
              progress=None) -> dict:
    """Run both sweeps and return the profile document (see the module docstring)."""

    kind = kernel_backend(backend)
    load_before = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    configs = kernel_configs(kernel_points, seed=seed)
    kpts = measure_kernel_points(configs, repeats=repeats, backend=kind, rounds=rounds,
                                 progress=progress)
    kfit = fit_kernel_profile(kpts)
    cpts = measure_comm_points(worlds, seed=seed, progress=progress)
    cfit = fit_comm_profile(cpts)
    info = cpu_description()
    doc = {
        "device": "cpu",
        "description": "CPU profile of the embedding-sharding cost model (planner/model/tables/cost.py): "
                       "fused TBE lookups on one thread and gloo collectives across processes on "
                       "this machine, fitted to microbenchmarks, not to benchmark tasks",
        "measured": {
            "date": datetime.date.today().isoformat(),
            "command": command or "clusterplan calibrate embedding",
            "tool": "planner/measure/tables/fit.py",
            "machine": info,
            "kernel": kind, "threads": 1, "optimizer": "sgd (EXACT_SGD, fused)",
            "caches_flushed_bytes": 2 * info.get("last_level_cache_bytes", 0),
            "repeats": repeats, "rounds": rounds, "seed": seed, "kernel_points": len(kpts),
            "worlds": [int(w) for w in worlds],
            "oversubscription": {int(w): oversubscription(int(w)) for w in worlds},
            "wall_s": round(time.perf_counter() - t0, 1),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "lookup": {k: v for k, v in kfit.items() if k != "fit"},
        "lookup_fit": kfit["fit"],
        "comm": {"backend": "gloo", "worlds": cfit},
        "points": {"kernels": kpts,
                   "collectives": {int(n): p for n, p in cpts.items()}},
    }
    return doc


def refit_profile(doc: dict, *, command: str | None = None) -> dict:
    """``doc`` (a profile :func:`calibrate` made) with its lookup and collective terms fitted
    again to the points it recorded, by this version's fit; what was measured, and how, is
    kept. ``fitted`` says when and by what. Raises :class:`SpecError` on a document without
    points."""
    pts = doc.get("points") if isinstance(doc, dict) else None
    if not isinstance(pts, dict) or not pts.get("kernels"):
        raise SpecError("the profile has no recorded kernel points to fit", field="points",
                        fix="refit a profile written by `clusterplan calibrate embedding`")
    kfit = fit_kernel_profile(pts["kernels"])
    out = dict(doc, lookup={k: v for k, v in kfit.items() if k != "fit"}, lookup_fit=kfit["fit"])
    coll = pts.get("collectives") or {}
    if coll:
        out["comm"] = dict(doc.get("comm") or {}, backend="gloo",
                           worlds=fit_comm_profile({int(n): p for n, p in coll.items()}))
    out["fitted"] = {"date": datetime.date.today().isoformat(),
                     "command": command or "clusterplan calibrate embedding --refit",
                     "estimator": "non-negative, squared log ratio (planner/measure/tables/"
                                  "logfit.py)"}
    return out


def write_profile(doc: dict, path: str) -> None:
    """Write the profile YAML atomically with a header saying what it is, once a copy beside it
    has loaded (a fit the reader rejects raises its :class:`SpecError` and writes nothing)."""
    header = ("# CPU embedding profile MEASURED by `clusterplan calibrate embedding` "
              "(planner/measure/tables/fit.py);\n# see 'measured' for how, 'points' for "
              "the raw timings. Read by planner/model/tables/cpu_profile.py (load_cpu_profile).\n")
    text = header + yaml.safe_dump(_plain(doc), sort_keys=False, width=100)
    target = Path(path)
    check = target.with_name(f".{target.name}.check-{os.getpid()}")
    try:
        atomic_write_text(str(check), text)
        load_cpu_profile.__wrapped__(str(check))
    finally:
        check.unlink(missing_ok=True)
    atomic_write_text(path, text)


def _plain(o):
    if isinstance(o, dict):
        return {(int(k) if isinstance(k, (np.integer,)) else k): _plain(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v) for v in o]
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, str):
        return str(o)
    if isinstance(o, bool) or o is None or isinstance(o, int):
        return o
    if isinstance(o, float):
        return o if math.isfinite(o) else str(o)
    return str(o)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
