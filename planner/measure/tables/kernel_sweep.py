"""The kernel sweep of ``clusterplan calibrate embedding`` (:mod:`.fit` fits the CPU profile to
it): seeded single-rank configurations over the ranges a plan meets, each timed as one fused
FBGEMM TBE (forward, and backward with the fused SGD update), and the configuration a recorded
point describes. Nothing here comes from a benchmark task or a plan. Units: seconds, rows,
elements."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from planner.measure.tables.kernels import time_ranks
from planner.measure.tables.tbe import KernelTable
from planner.model.tables.access import default_reuse_bins
from planner.model.tables.generate import synthesize_tables
from planner.model.tables.ids import model_ids
from planner.model.tables.spec import ModelSpec, TableSpec

__all__ = ["DISTRIBUTIONS", "kernel_configs", "measure_kernel_points", "point_model"]

#: access distributions of the structured configurations
DISTRIBUTIONS = ("distinct", "dlrm", "zipf")


def _table(name: str, rows: int, dim: int, pooling: float, dist: str) -> TableSpec:
    if dist == "distinct":
        return TableSpec(name=name, num_embeddings=rows, embedding_dim=dim,
                         pooling_factor=pooling, reuse_bins=tuple([1.0] + [0.0] * 16))
    if dist == "zipf":
        return TableSpec(name=name, num_embeddings=rows, embedding_dim=dim,
                         pooling_factor=pooling, zipf_exponent=1.05)
    return TableSpec(name=name, num_embeddings=rows, embedding_dim=dim, pooling_factor=pooling,
                     reuse_bins=tuple(default_reuse_bins()))


def kernel_configs(n: int, *, seed: int = 0, max_lookups: int = 4_000_000,
                   max_bytes: int = 512 * 2 ** 20) -> list[ModelSpec]:
    """``n`` seeded single-rank configurations (see the module docstring), each a ModelSpec.

    Even-numbered ones are *structured*: 1–16 tables of log-uniform rows and pooling, random
    dims, one access distribution per configuration (distinct / dlrm histogram / Zipf 1.05).
    Odd-numbered ones are *synthetic ranks*: 1–24 tables drawn from
    :func:`~planner.model.tables.generate.synthesize_tables` (dlrm_datasets-calibrated pooling,
    reuse and rows; a pool seeded apart from every benchmark), rows and batch scaled together
    to 1,024–8,192 samples, dims 4–128, a quarter of them fp16 — the kind of shard sets a
    planner builds.
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xCA1B]))
    pool = synthesize_tables(512, seed=int(seed) + 0xCA1B0, prefix="k")
    dims = (4, 8, 16, 32, 64, 128, 256)
    counts = (1, 2, 4, 8, 16)
    batches = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
    out = []
    while len(out) < n:
        k = len(out)
        batch = int(batches[rng.integers(len(batches))])
        tables = []
        if k % 2 == 0:
            T = int(counts[(k // 2) % len(counts)])
            dist = DISTRIBUTIONS[(k // 2) % len(DISTRIBUTIONS)]
            for i in range(T):
                rows = int(round(10 ** rng.uniform(3.0, 7.0)))
                dim = int(dims[rng.integers(len(dims))])
                pooling = float(round(10 ** rng.uniform(0.0, math.log10(64.0)), 3))
                tables.append(_table(f"c{k}t{i}", rows, dim, pooling, dist))
            label = dist
        else:
            T = int(rng.integers(1, 25))
            fp16 = rng.random() < 0.25
            scale = batch / 65536.0
            for i, j in enumerate(rng.choice(len(pool), size=T, replace=False)):
                t = pool[int(j)]
                tables.append(TableSpec(name=f"c{k}t{i}",
                                        num_embeddings=max(1, int(round(t.num_embeddings * scale))),
                                        embedding_dim=16 if fp16 else int(
                                            dims[rng.integers(len(dims))]),
                                        pooling_factor=t.pooling_factor, reuse_bins=t.reuse_bins,
                                        precision="fp16" if fp16 else "fp32"))
            label = "synthetic-fp16" if fp16 else "synthetic"
        lookups = sum(batch * t.pooling_factor for t in tables)
        size = sum(t.weight_bytes for t in tables)
        if lookups > max_lookups or size > max_bytes:
            continue
        out.append(ModelSpec(name=f"kernel-{k}-{label}", tables=tuple(tables), batch_size=batch,
                             optimizer="sgd", source=f"kernel_configs(seed={seed})"))
    return out


def measure_kernel_points(configs: Sequence[ModelSpec], *, repeats: int = 7, warmup: int = 2,
                          backend: str = "auto", chunk: int = 8, rounds: int = 1,
                          progress=None) -> list[dict]:
    """Time every configuration as one fused kernel; returns one dict per configuration.

    With ``rounds`` > 1 the whole sweep runs again (chunks in reverse order) and each
    configuration's forward and backward are the mean of its per-round medians, which evens out
    slow drifts of the machine's load.
    """
    if rounds > 1:
        runs = [_measure_kernel_points(configs, repeats=repeats, warmup=warmup, backend=backend,
                                       chunk=chunk, progress=progress, reverse=bool(i % 2))
                for i in range(rounds)]
        out = []
        for pts in zip(*runs):
            p = dict(pts[0])
            p["fwd_s"] = float(np.mean([q["fwd_s"] for q in pts]))
            p["bwd_s"] = float(np.mean([q["bwd_s"] for q in pts]))
            p["rounds"] = [[q["fwd_s"], q["bwd_s"]] for q in pts]
            out.append(p)
        return out
    return _measure_kernel_points(configs, repeats=repeats, warmup=warmup, backend=backend,
                                  chunk=chunk, progress=progress)


def _measure_kernel_points(configs, *, repeats, warmup, backend, chunk, progress=None,
                           reverse: bool = False) -> list[dict]:
    points: list = [None] * len(configs)
    starts = list(range(0, len(configs), chunk))
    done = 0
    for start in (starts[::-1] if reverse else starts):
        part = configs[start:start + chunk]
        work = []
        for m in part:
            ids = model_ids(m, seed=0)
            work.append([KernelTable(t.num_embeddings, t.embedding_dim, t.precision, x.indices,
                                     x.offsets, name=t.name) for t, x in zip(m.tables, ids)])
        timings = time_ranks(work, repeats=repeats, warmup=warmup, backend=backend,
                             interleave=True)
        for i, (m, tm) in enumerate(zip(part, timings)):
            points[start + i] = {"name": m.name, "batch": m.batch_size,
                                 "tables": [_table_row(t) for t in m.tables],
                                 "fwd_s": tm.fwd_s, "bwd_s": tm.bwd_s, "kernel": tm.backend}
        done += len(part)
        if progress:
            progress(f"kernels: {done}/{len(configs)}")
    return points


def _table_row(t: TableSpec) -> list:
    """``[rows, dim, pooling, access, precision]``; access: ``distinct``, ``zipf``, ``dlrm`` (the
    default histogram) or the 17 reuse bins."""
    d = _dist_of(t)
    acc = d if d != "dlrm" or t.reuse_bins == tuple(default_reuse_bins()) \
        else [round(float(x), 6) for x in t.reuse_bins]
    return [t.num_embeddings, t.embedding_dim, t.pooling_factor, acc, t.precision]


def _dist_of(t: TableSpec) -> str:
    if t.zipf_exponent is not None:
        return "zipf"
    if t.reuse_bins is not None and t.reuse_bins[0] == 1.0:
        return "distinct"
    return "dlrm"


def point_model(p: dict | ModelSpec) -> ModelSpec:
    """The configuration a recorded kernel point (:func:`measure_kernel_points`) was timed on."""
    if isinstance(p, ModelSpec):
        return p
    tables = []
    for i, row in enumerate(p["tables"]):
        r, d, L, acc = row[:4]
        prec = row[4] if len(row) > 4 else "fp32"
        if isinstance(acc, str):
            t = _table(f"t{i}", int(r), int(d), float(L), acc)
        else:
            t = TableSpec(name=f"t{i}", num_embeddings=int(r), embedding_dim=int(d),
                          pooling_factor=float(L), reuse_bins=tuple(float(x) for x in acc))
        tables.append(replace(t, precision=prec))
    return ModelSpec(name=p["name"], tables=tuple(tables), batch_size=int(p["batch"]))
