"""``clusterplan calibrate gpu-embedding DIR``: fit a GPU's row-gather constants of the lookup
model to its embedding microbenchmark (``DIR/embedding.csv``, measured by
``python -m planner.measure.compute.gpu --only embedding``), nothing else.

The lookup model's forward time of one table (:mod:`planner.model.tables.cost`, every lookup
a miss: ids uniform over a table several times the L2) is ::

    t = call_s + [ids · (dim · p + overhead_bytes + 8) + batch · dim · 4] / (HBM · efficiency)

``efficiency``, ``overhead_bytes`` and ``call_s`` (the measured kernel's fixed cost per call:
offsets, launch) are fitted by least squares on log(model / measured) over the rows whose table
is at least :data:`MIN_TABLE_BYTES` (twice the 50 MB L2 of an H100 or H200), so that a gather
reads HBM, not L2, and whose call looks up at least :data:`MIN_IDS` ids. The file records the fit's error, the rows, and the ranges of embedding dim,
pooling factor and batch it saw (:class:`~planner.model.tables.gpu_lookup.FitRange`): a
prediction outside them is flagged as extrapolated. The kernel measured is PyTorch's
``nn.EmbeddingBag`` (FBGEMM's fused TBE was not installed on the GPU machine), which the file
says; its backward (sparse gradients, not a fused update) is not used.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from simulator.errors import SpecError
from simulator.fileio import check_input_file, parse_json, read_text
from simulator.hardware import gpu_spec

from planner.model.tables.gpu_lookup import load_gpu_lookup

__all__ = ["fit_gpu_embedding", "gpu_embedding_yaml", "defer_backward", "MIN_TABLE_BYTES"]

#: smallest table (bytes) whose gathers count as HBM reads: twice a 50 MB L2
MIN_TABLE_BYTES = 100e6
#: fewest lookups per call fitted: smaller calls (≤ 32,768 ids here) are dominated by the
#: kernel's fixed cost, and one of them (pooling 1, 32,768 bags of 1 KiB rows) ran at a sixth of
#: the others' rate, which the gather's rate cannot explain
MIN_IDS = 65536
_COLUMNS = ("rows", "dim", "pooling", "batch", "forward_s")


def _numeric(df: pd.DataFrame, cols, csv: Path) -> pd.DataFrame:
    """``df`` with ``cols`` as positive finite numbers, or a SpecError naming the first column
    and row that is not one."""
    for c in cols:
        v = pd.to_numeric(df[c], errors="coerce")
        bad = ~(np.isfinite(v) & (v >= 0))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise SpecError(f"{c} of data row {row + 1} is '{df[c].iloc[row]}', not a number ≥ 0",
                            source=str(csv), field=c, fix="re-measure the folder")
        df[c] = v
    return df


def _read_measured(folder: Path, name: str, columns, command: str) -> tuple[pd.DataFrame, dict]:
    """``folder/name`` as a DataFrame holding ``columns`` (checked) and ``folder/meta.json``."""
    csv = folder / name
    if not csv.is_file():
        raise SpecError(f"no {name} in the folder", source=str(folder), field="DIR",
                        fix=f"measure it on the GPU: {command} --out DIR")
    try:
        df = pd.read_csv(check_input_file(csv, field="DIR"))
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read it ({e})", source=str(csv),
                        fix="re-measure the folder") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise SpecError(f"missing columns {', '.join(missing)}", source=str(csv),
                        fix=f"re-measure with {command}")
    meta_path = folder / "meta.json"
    meta = parse_json(read_text(meta_path), source=str(meta_path)) if meta_path.is_file() else {}
    return df, meta


def _read(folder: Path) -> tuple[pd.DataFrame, dict]:
    df, meta = _read_measured(folder, "embedding.csv", _COLUMNS,
                              "python -m planner.measure.compute.gpu --only embedding")
    return _numeric(df, _COLUMNS, folder / "embedding.csv"), meta


def fit_gpu_embedding(folder: str | Path, gpu: str) -> dict:
    """Fit ``folder``'s embedding.csv for catalog GPU ``gpu``; the file's content as a dict."""
    folder = Path(folder)
    spec = gpu_spec(gpu, field="--gpu")
    df, meta = _read(folder)
    df = df[(df.rows * df.dim * 4.0 >= MIN_TABLE_BYTES)
            & (df.batch * df.pooling >= MIN_IDS)]
    if len(df) < 4:
        raise SpecError(f"only {len(df)} rows with tables of ≥ {MIN_TABLE_BYTES / 1e6:.0f} MB "
                        f"and calls of ≥ {MIN_IDS:,} ids",
                        source=str(folder / "embedding.csv"),
                        fix="measure larger tables and batches (rows × dim × 4 ≥ 100 MB)")
    hbm = float(spec.hbm_bandwidth_Bps)
    ids = (df.batch * df.pooling).to_numpy(float)
    row = (df.dim * 4.0).to_numpy(float)
    outs = (df.batch * df.dim * 4.0).to_numpy(float)
    meas = df.forward_s.to_numpy(float)

    def model(p):
        eff, ovh, call_us = p
        return call_us * 1e-6 + (ids * (row + ovh + 8.0) + outs) / (hbm * eff)
    fit = least_squares(lambda p: np.log(model(p) / meas), [0.8, 64.0, 5.0],
                        bounds=([0.05, 0.0, 0.0], [1.0, 4096.0, 1000.0]))
    eff, ovh, call_us = (float(x) for x in fit.x)
    err = model(fit.x) / meas - 1.0
    return {
        "gpu": gpu,
        "method": (f"Fitted by `clusterplan calibrate gpu-embedding {folder}` on "
                   f"{datetime.date.today().isoformat()} to {len(df)} forward lookups of "
                   f"torch.nn.EmbeddingBag(mode=sum) with uniform ids on {meta.get('gpu', gpu)} "
                   f"(measured {meta.get('date_utc', '?')}, torch {meta.get('torch', '?')}); "
                   f"tables of >= {MIN_TABLE_BYTES / 1e6:.0f} MB (gathers from HBM, not L2) and "
                   f"calls of >= {MIN_IDS} ids only. "
                   "Not FBGEMM's fused TBE, which was not installed there; the sparse-gradient "
                   "backward is not used. Method: planner/measure/tables/fit_gpu.py."),
        "kernel": "torch.nn.EmbeddingBag(mode='sum'), forward",
        "hbm_efficiency": round(eff, 4),
        "lookup_overhead_bytes": round(ovh, 2),
        "call_overhead_s": float(f"{call_us * 1e-6:.4g}"),
        "fit": {"rows": int(len(df)), "mape": round(float(np.mean(np.abs(err))), 4),
                "worst": round(float(err[np.argmax(np.abs(err))]), 4)},
        "range": {"embedding_dim": [int(df.dim.min()), int(df.dim.max())],
                  "pooling_factor": [float(df.pooling.min()), float(df.pooling.max())],
                  "batch": [int(df.batch.min()), int(df.batch.max())]},
    }


def gpu_embedding_yaml(doc: dict) -> str:
    """The file text: a header comment, then ``doc``."""
    return ("# Row-gather constants of the lookup model on this GPU, MEASURED (see method);\n"
            "# read by planner/model/tables/gpu_lookup.py.\n"
            + yaml.safe_dump(doc, sort_keys=False, width=100))


# -- the fused table-batched kernel (tbe.csv of planner.measure.tables.gpu_dlrm) ------------------
_TBE_COLUMNS = ("tables", "rows", "dim", "pooling", "batch", "dtype", "lookups",
                "distinct", "forward_s", "backward_s")
_ELEMENT = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0}
#: state bytes read and written per distinct row by the measured row-wise Adagrad (one fp32)
_STATE_RW_BYTES = 8.0


def _read_tbe(folder: Path) -> tuple[pd.DataFrame, dict]:
    csv = folder / "tbe.csv"
    df, meta = _read_measured(folder, "tbe.csv", _TBE_COLUMNS,
                              "python -m planner.measure.tables.gpu_dlrm")
    if "kernel" not in df.columns:                  # the first runs were all PyTorch ops
        df["kernel"] = "torch"
    df = _numeric(df, [c for c in _TBE_COLUMNS if c != "dtype"], csv)
    unknown = sorted(set(df.dtype.astype(str)) - set(_ELEMENT))
    if unknown:
        raise SpecError(f"unknown dtype {unknown[0]!r}", source=str(csv), field="dtype",
                        fix=f"use one of {', '.join(_ELEMENT)}")
    df = df[(df.rows * df.tables * df.dim * df.dtype.map(_ELEMENT) >= MIN_TABLE_BYTES)
            & (df.lookups >= MIN_IDS)]
    if len(df) < 8 or df.kernel.nunique() != 1:
        raise SpecError(f"{len(df)} usable rows of {df.kernel.nunique()} kernels",
                        source=str(csv), fix="measure one kernel with tables of ≥ 100 MB")
    return df, meta


def _tbe_timing(df: pd.DataFrame) -> tuple[str, str, str]:
    """(forward column, backward column, how they were timed): the CUDA-graph replays (the GPU's
    time alone, as one FBGEMM op call leaves it) where every row has them, else the calls issued
    back to back by the host, which also pay the measured kernel's own Python dispatch."""
    cols = ("forward_graph_s", "backward_graph_s")
    if all(c in df.columns for c in cols) and np.isfinite(
            df[list(cols)].apply(pd.to_numeric, errors="coerce").to_numpy(float)).all():
        return (*cols, "times of the calls replayed from a CUDA graph (the GPU's time alone)")
    return "forward_s", "backward_s", "times of calls issued back to back by the host"


def _fit_log(model, x0, lo, hi, meas):
    fit = least_squares(lambda p: np.log(model(p) / meas), x0, bounds=(lo, hi))
    err = model(fit.x) / meas - 1.0
    stats = {"rows": int(len(meas)), "mape": round(float(np.mean(np.abs(err))), 4),
             "worst": round(float(err[np.argmax(np.abs(err))]), 4)}
    return [float(v) for v in fit.x], stats


def fit_fused_tbe(folder: str | Path, gpu: str) -> dict:
    """Fit the lookup model, forward and backward, to a fused kernel's ``folder/tbe.csv``.

    Forward (every table's ids in one call; ``u`` = distinct rows / lookups measured, a repeat
    hits L2 with probability ``h``)::

        call_s + [ids·(miss·dim·p + overhead + 8) + bags·dim·p] / (HBM·eff),
        miss = u + (1 − u)(1 − h)

    Backward with row-wise Adagrad, in byte-equivalents at the same bandwidth::

        call_s_b + [ids·(id_bytes + dim·grad_bytes·p/4) + distinct·(dim·update_bytes·p/4 + 8)]
                   / (HBM·eff)

    (gradients in the rows' precision, as measured; a half-precision row's update costs half an
    fp32 one's, ``half_update_element_bytes``).
    """
    folder = Path(folder)
    spec = gpu_spec(gpu, field="--gpu")
    df, meta = _read_tbe(folder)
    fwd_col, bwd_col, timing = _tbe_timing(df)
    hbm = float(spec.hbm_bandwidth_Bps)
    ids, dist = df.lookups.to_numpy(float), df.distinct.to_numpy(float)
    dim, p = df.dim.to_numpy(float), df.dtype.map(_ELEMENT).to_numpy(float)
    bags = (df.tables * df.batch).to_numpy(float)
    u = dist / ids

    def fwd(x):
        eff, ovh, call_us, h = x
        miss = u + (1 - u) * (1 - h)
        return call_us * 1e-6 + (ids * (miss * dim * p + ovh + 8.0) + bags * dim * p) / (hbm * eff)
    (eff, ovh, call_us, h), ffit = _fit_log(
        fwd, [0.7, 32.0, 5.0, 0.5], [0.05, 0.0, 0.0, 0.0], [1.0, 4096.0, 1000.0, 1.0],
        df[fwd_col].to_numpy(float))
    bw = hbm * eff

    def bwd(x):
        call_us, id_b, g_b, u_b = x
        return call_us * 1e-6 + (ids * (id_b + dim * g_b * p / 4)
                                 + dist * (dim * u_b * p / 4 + _STATE_RW_BYTES)) / bw
    (bcall_us, id_b, g_b, u_b), bfit = _fit_log(
        bwd, [50.0, 50.0, 4.0, 8.0], [0.0] * 4, [5000.0, 1e4, 256.0, 256.0],
        df[bwd_col].to_numpy(float))
    kernel = str(df.kernel.iloc[0])
    return {
        "gpu": gpu,
        "method": (f"Fitted by `clusterplan calibrate gpu-embedding {folder}` on "
                   f"{datetime.date.today().isoformat()} to {len(df)} fused lookups ({kernel} "
                   f"kernels, planner/measure/tables/gpu_dlrm.py; uniform and Zipf ids) on "
                   f"{meta.get('gpu', gpu)} (measured {meta.get('date_utc', '?')}, torch "
                   f"{meta.get('torch', '?')}); tables of >= {MIN_TABLE_BYTES / 1e6:.0f} MB and "
                   f"calls of >= {MIN_IDS} ids only; {timing}. Forward and backward (sort, "
                   "gradient sum, row-wise Adagrad of the distinct rows) fitted apart. Method: "
                   "planner/measure/tables/fit_gpu.py."),
        "kernel": f"fused table-batched lookup ({kernel})",
        "hbm_efficiency": round(eff, 4),
        "lookup_overhead_bytes": round(ovh, 2),
        "call_overhead_s": float(f"{call_us * 1e-6:.4g}"),
        "repeat_hit_ratio": round(h, 4),
        "backward": {"call_s": float(f"{bcall_us * 1e-6:.4g}"), "id_bytes": round(id_b, 2),
                     "grad_element_bytes": round(g_b, 3),
                     "update_element_bytes": round(u_b, 3),
                     "half_update_element_bytes": round(u_b / 2, 3)},
        "fit": ffit,
        "fit_backward": bfit,
        "range": {"embedding_dim": [int(df.dim.min()), int(df.dim.max())],
                  "pooling_factor": [float(df.pooling.min()), float(df.pooling.max())],
                  "batch": [int(df.batch.min()), int(df.batch.max())]},
    }


def defer_backward(doc: dict, kind: str) -> dict:
    """``doc`` (a fused fit) whose backward terms are those of measured kind ``kind``'s file
    (``backward_from``), its own fit kept as ``own_backward`` for the record: for a kind whose
    backward was measured with a kernel that waits for the host (``--kernel triton``) when
    another kind has the host-free kernel's (``--kernel triton-nosync``)."""
    other = load_gpu_lookup(kind)
    if (other is None or other.backward is None or other.backward_from or other.transferred
            or kind == doc["gpu"]):
        raise SpecError(f"{kind!r} is not another GPU kind with its own measured backward",
                        field="--backward-from",
                        fix="name a kind whose traces/calibration/embedding-<kind>.yaml holds "
                            "a backward section, e.g. h200")
    out = {k: v for k, v in doc.items() if k not in ("backward", "fit_backward", "range")}
    out["method"] += (f" The backward terms are {kind}'s (backward_from): this kind's own were "
                      "measured with a kernel that waits for the host (own_backward).")
    return out | {"backward_from": kind, "own_backward": doc.get("backward"),
                  "own_fit_backward": doc.get("fit_backward"), "range": doc["range"]}
