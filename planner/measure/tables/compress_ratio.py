"""Measure how far an error-bounded lossy compressor (SZ3, through ``pysz``) shrinks pooled
embeddings, by error bound, and fit the bits per value the all-to-all compression model uses
(:mod:`planner.model.tables.compression`).

Run on any machine (CPU; needs torch and pysz)::

    python -m planner.measure.tables.compress_ratio --out DIR [--quick]

The tensors are what a DLRM's output all-to-all carries: pooled embeddings of a real
``nn.EmbeddingBag`` (sum pooling, TorchRec's default initialisation, uniform in
``±1/sqrt(rows)``) over Zipf-distributed ids, for embedding dims 16–256 and pooling factors 1–60,
4,096 samples each. The bound is absolute, ``eb = rel × σ`` with ``σ`` the tensor's standard
deviation. It writes ``sz3-pooled.csv`` (``dim, pooling, rel_bound, sigma, ratio,
bits_per_value, max_abs_error, compress_gbps, decompress_gbps``) and ``fit.yaml``: bits per value
``= c0 + c1·log2(1/rel)`` fitted by least squares, with its MAPE on the ratio. A quantised
Gaussian's entropy is ``log2(1/rel) + 1.05`` bits (``c0 = 1.05, c1 = 1``): the fit is printed
beside it.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from pathlib import Path

import numpy as np
import yaml

__all__ = ["main", "measure", "fit_bits"]

BOUNDS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)


def _pooled(dim: int, pooling: int, batch: int, rows: int, seed: int) -> np.ndarray:
    import torch
    g = torch.Generator().manual_seed(seed)
    emb = torch.nn.EmbeddingBag(rows, dim, mode="sum")
    torch.nn.init.uniform_(emb.weight, -(1 / rows) ** 0.5, (1 / rows) ** 0.5, generator=g)
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=float) ** -1.05
    ids = torch.from_numpy(rng.permutation(rows)[rng.choice(rows, size=batch * pooling,
                                                           p=p / p.sum())])
    with torch.no_grad():
        return emb(ids, torch.arange(0, batch * pooling, pooling)).numpy()


def _sz3(x: np.ndarray, bound: float) -> tuple[float, float, float, float]:
    """(ratio, max |error|, compress s, decompress s) of SZ3 at absolute bound ``bound``."""
    import pysz
    cfg = pysz.szConfig()
    cfg.errorBoundMode = pysz.szErrorBoundMode.ABS
    cfg.absErrorBound = float(bound)
    t0 = time.perf_counter()
    packed, ratio = pysz.sz.compress(x, cfg)
    t1 = time.perf_counter()
    y, _ = pysz.sz.decompress(packed, np.float32, x.shape)
    t2 = time.perf_counter()
    return float(ratio), float(np.abs(y - x).max()), t1 - t0, t2 - t1


def measure(*, quick: bool = False, batch: int = 4096, rows: int = 100_000) -> list[dict]:
    """One row per (dim, pooling, relative bound)."""
    dims, pools = ((16, 128), (1, 20)) if quick else ((16, 64, 128, 256), (1, 4, 20, 60))
    out = []
    for i, dim in enumerate(dims):
        for j, pooling in enumerate(pools):
            x = _pooled(dim, pooling, batch if not quick else 512, rows, seed=10 * i + j)
            sigma = float(x.std())
            for rel in (BOUNDS[2::2] if quick else BOUNDS):
                ratio, err, tc, td = _sz3(x, rel * sigma)
                out.append(dict(dim=dim, pooling=pooling, rel_bound=rel, sigma=sigma,
                                ratio=ratio, bits_per_value=32.0 / ratio, max_abs_error=err,
                                compress_gbps=x.nbytes / tc / 1e9,
                                decompress_gbps=x.nbytes / td / 1e9))
    return out


def fit_bits(rows: list[dict]) -> dict:
    """Least-squares ``bits = c0 + c1·log2(1/rel)`` and the ratio MAPE it gives."""
    x = np.array([math.log2(1 / r["rel_bound"]) for r in rows])
    y = np.array([r["bits_per_value"] for r in rows])
    c1, c0 = np.polyfit(x, y, 1)
    pred = 32.0 / np.maximum(c0 + c1 * x, 1e-9)
    ratio = np.array([r["ratio"] for r in rows])
    return {"c0": float(c0), "c1": float(c1),
            "ratio_mape": float(np.mean(np.abs(pred - ratio) / ratio)),
            "points": len(rows), "rel_bounds": [min(BOUNDS), max(BOUNDS)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m planner.measure.tables.compress_ratio",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path, help="directory to write to")
    ap.add_argument("--quick", action="store_true", help="a few small tensors (a smoke run)")
    args = ap.parse_args(argv)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        ap.error(f"--out {args.out}: cannot create the folder ({e.strerror}); name a folder")
    try:
        import pysz
        del pysz                                    # only whether it is installed
    except ImportError:
        print("python -m planner.measure.tables.compress_ratio: error: pysz is not installed "
              "(pip install 'pysz>=1.1,<2')", file=sys.stderr)
        return 2
    rows = measure(quick=args.quick)
    with (args.out / "sz3-pooled.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})
    fit = fit_bits(rows)
    doc = {"compressor": "SZ3 (pysz), absolute error bound = rel × σ of the tensor",
           "method": "python -m planner.measure.tables.compress_ratio"
                     + (" --quick" if args.quick else ""),
           "data": "pooled embeddings of nn.EmbeddingBag (TorchRec default init) over Zipf 1.05 "
                   "ids; dims, pooling factors and bounds in sz3-pooled.csv",
           "bits_per_value": fit,
           "gaussian_entropy": {"c0": 1.05, "c1": 1.0}}
    (args.out / "fit.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    print(f"{len(rows)} points: bits/value = {fit['c0']:.2f} + {fit['c1']:.3f}·log2(1/rel) "
          f"(ratio MAPE {fit['ratio_mape']:.1%}); a quantised Gaussian: 1.05 + 1.000·log2(1/rel)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
