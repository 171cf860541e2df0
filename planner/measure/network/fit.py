"""Calibrating collective parameters from measured tables (nccl-tests style).

The simulator's collective model has two kinds of free parameters, kept as data in the topology
file (``collectives:``): a per-step latency ``alpha`` per algorithm and a protocol efficiency per
link kind. :func:`fit_collective_profile` fits both to measured (ranks, bytes, seconds) points by
running the simulator itself inside a least-squares loop on relative error, so what is fitted is
exactly what later predictions use.

The vTrain A100 tables (``shared/data/vtrain/a100_allreduce_{2..8}gpu_lut.txt``) are nccl-tests
output: ``size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simulator.collectives import simulate_collective
from simulator.errors import SpecError
from simulator.fileio import check_input_file
from simulator.topology import Topology

__all__ = ["read_nccl_table", "fit_collective_profile", "FitResult", "with_comm"]


def read_nccl_table(path: str | Path) -> pd.DataFrame:
    """Read an nccl-tests table; columns ``size_bytes``, ``time_s`` (first time column)."""
    path = check_input_file(path, field="--table")
    try:
        raw = pd.read_csv(path, header=0)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read table: {exc}", source=str(path),
                        fix="pass an nccl-tests CSV with size(B) and time(ns) columns") from None
    cols = list(raw.columns)
    if len(cols) < 4 or not cols[0].lower().startswith("size") or "time" not in cols[3].lower():
        raise SpecError(f"unexpected columns {cols[:5]}", source=str(path), field="header",
                        fix="use size(B),count,type,time(ns),busbw(GB/s),... as written by nccl-tests")
    df = pd.DataFrame({"size_bytes": raw.iloc[:, 0].astype(float),
                       "time_s": raw.iloc[:, 3].astype(float) * 1e-9})
    if (df.size_bytes <= 0).any() or (df.time_s <= 0).any():
        raise SpecError("sizes and times must be positive", source=str(path), field="rows",
                        fix="remove rows with zero or negative values")
    return df


def with_comm(topo: Topology, *, alpha: dict[str, float] | None = None,
              efficiency: dict[str, float] | None = None,
              local_Bps: dict[str, float] | None = None) -> Topology:
    """A copy of ``topo`` with some collective parameters replaced."""
    a = dict(topo.comm.alpha_s)
    a.update(alpha or {})
    e = dict(topo.comm.efficiency)
    e.update(efficiency or {})
    loc = dict(topo.comm.local_Bps)
    loc.update(local_Bps or {})
    comm = dataclasses.replace(topo.comm, alpha_s=a, efficiency=e, local_Bps=loc)
    return dataclasses.replace(topo, comm=comm)


@dataclass(frozen=True, slots=True)
class FitResult:
    """Fitted parameters and the fit's relative errors per point (predicted/measured − 1)."""

    alpha_s: float
    efficiency: float
    local_Bps: float
    algorithm: str
    link_kind: str
    points: pd.DataFrame  # ranks, size_bytes, measured_s, predicted_s, rel_error

    def mape(self, *, ranks: int | None = None, min_bytes: float = 0.0) -> float:
        df = self.points
        if ranks is not None:
            df = df[df.ranks == ranks]
        df = df[df.size_bytes >= min_bytes]
        return float(np.mean(np.abs(df.rel_error)))


def _predict(topo: Topology, kind: str, algo: str, pts: pd.DataFrame) -> np.ndarray:
    out = np.empty(len(pts))
    for i, (n, s) in enumerate(zip(pts.ranks.to_numpy(), pts.size_bytes.to_numpy())):
        out[i] = simulate_collective(topo, kind, range(int(n)), float(s), algo=algo).time_s
    return out


def fit_collective_profile(topo: Topology, points: pd.DataFrame, *, kind: str = "allreduce",
                           algo: str = "ring", link_kind: str = "nvlink",
                           fit_sizes: Sequence[float] | None = None,
                           min_fit_bytes: float = 8 * 2**20) -> FitResult:
    """Fit ``alpha[algo]`` (s), ``efficiency[link_kind]`` and ``local_bandwidth[algo]`` (bytes/s).

    Parameters
    ----------
    points:
        Columns ``ranks``, ``size_bytes``, ``time_s`` (measured).
    fit_sizes:
        Sizes to fit on (others are only predicted); default: 16 log-spaced sizes per group
        from ``min_fit_bytes`` up.
    min_fit_bytes:
        Smallest size fitted by default (8 MiB). NCCL moves small messages with its LL/LL128
        protocols, whose latency and bandwidth differ from the Simple protocol used for large
        ones; one (alpha, efficiency) pair describes one protocol, so the fit covers the
        bandwidth-relevant sizes and smaller ones are only predicted.
    """
    pts = points.copy()
    fit = pts
    if fit_sizes is None:
        keep = []
        for n, g in pts.groupby("ranks"):
            sizes = np.sort(g.size_bytes.unique())
            sizes = sizes[sizes >= min_fit_bytes] if (sizes >= min_fit_bytes).any() else sizes
            idx = np.unique(np.round(np.geomspace(1, len(sizes), 16)).astype(int) - 1)
            keep.append(g[g.size_bytes.isin(sizes[idx])])
        fit = pd.concat(keep)
    else:
        fit = pts[pts.size_bytes.isin(list(fit_sizes))]

    def params(x: np.ndarray) -> Topology:
        # x = (alpha in µs, efficiency, seconds per GB of the local pass)
        return with_comm(topo, alpha={algo: x[0] * 1e-6}, efficiency={link_kind: x[1]},
                         local_Bps={algo: 1e9 / x[2] if x[2] > 0 else 0.0})

    def resid(x: np.ndarray) -> np.ndarray:
        return _predict(params(x), kind, algo, fit) / fit.time_s.to_numpy() - 1.0

    sol = least_squares(resid, x0=[5.0, 0.8, 1e-3], bounds=([0.0, 0.05, 0.0], [1000.0, 1.0, 1.0]),
                        xtol=1e-8)
    alpha, eff, local = float(sol.x[0] * 1e-6), float(sol.x[1]), float(1e9 / sol.x[2])
    best = params(sol.x)
    pred = _predict(best, kind, algo, pts)
    pts = pts.assign(measured_s=pts.time_s, predicted_s=pred, rel_error=pred / pts.time_s - 1.0)
    return FitResult(alpha_s=alpha, efficiency=eff, local_Bps=local, algorithm=algo,
                     link_kind=link_kind,
                     points=pts[["ranks", "size_bytes", "measured_s", "predicted_s", "rel_error"]])
