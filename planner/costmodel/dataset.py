"""The learned cost model's training data: a collected CSV (``clusterplan costmodel collect``)
read into arrays, with the target defined (the median over passes of each pass's fastest
iteration), and the seeded 80/10/10 split by sample."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import parse_json, read_text

from planner.costmodel.datafile import meta_path, read_data
from planner.costmodel.features import parse_table_records

__all__ = ["Dataset", "load_dataset", "split_ids"]


@dataclass
class Dataset:
    batch: int
    sample_ids: np.ndarray          # compute samples
    records: list                   # per sample: list of table records
    total_ms: np.ndarray            # the target: median over passes of ``target``
    noise: list                     # (pass 0, pass 1) pairs of the target column
    comm_sums: np.ndarray           # (M, D)
    comm_waits: np.ndarray          # (M, D) ms
    comm_fwd: np.ndarray            # (M, D) ms
    comm_bwd: np.ndarray
    meta: dict
    noise_alt: list = ()            # the same pairs of the other column (``alt``)
    target: str = "total_min_ms"    # the column the target was taken from
    alt: str = "total_ms"
    passes: int = 1                 # most passes of any sample


def load_dataset(path) -> Dataset:
    rows = read_data(path)
    mp = meta_path(path)
    meta = parse_json(read_text(mp), source=str(mp)) if mp.exists() else {}
    batch = int(meta.get("config", {}).get("batch", 4096))
    comp: dict = {}
    cs, cw, cf, cb = [], [], [], []
    for r in rows:
        if r["kind"] == "compute":
            comp.setdefault((r["hw"], int(r["sample_id"])), {})[int(r["round"])] = r
        elif r["kind"] == "comm":
            sums = json.loads(r["dim_sums"])
            sleeps = np.array(json.loads(r["sleeps_ms"]), dtype=float)
            cs.append(sums)
            cw.append(sleeps.max() - sleeps)     # how long each rank waits for the slowest
            cf.append(json.loads(r["comm_fwd_ms"]))
            cb.append(json.loads(r["comm_bwd_ms"]))
    if not comp:
        raise SpecError("no compute samples", source=str(path),
                        fix="collect some with `clusterplan costmodel collect`")
    def arr(v):
        return np.array(v, float) if v else np.zeros((0, 1))
    keys = sorted(comp)
    # target: the median over the passes of each pass's fastest iteration (collect.py says
    # why); files from before ``total_min_ms`` existed fall back to the medians.
    col, alt = "total_min_ms", "total_ms"
    if not all(r.get(col) for runs in comp.values() for r in runs.values()):
        col, alt = alt, col
    def pairs(c):
        return [(float(comp[k][0][c]), float(comp[k][1][c])) for k in keys
                if 0 in comp[k] and 1 in comp[k] and comp[k][0].get(c) and comp[k][1].get(c)]
    target = [float(np.median([float(r[col]) for r in comp[k].values()])) for k in keys]
    first = [comp[k][min(comp[k])] for k in keys]
    return Dataset(batch=batch, sample_ids=np.array([k[1] for k in keys]),
                   records=[parse_table_records(r["tables"]) for r in first],
                   total_ms=np.array(target), noise=pairs(col), noise_alt=pairs(alt),
                   target=col, alt=alt, passes=max(len(v) for v in comp.values()),
                   comm_sums=arr(cs), comm_waits=arr(cw), comm_fwd=arr(cf), comm_bwd=arr(cb),
                   meta=meta)



def split_ids(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """80/10/10 split of ``n`` samples (a seeded permutation)."""
    perm = np.random.default_rng(seed).permutation(n)
    a, b = int(round(0.8 * n)), int(round(0.9 * n))
    return perm[:a], perm[a:b], perm[b:]
