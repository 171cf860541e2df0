"""Data-parallel replicas alone, swept: FBGEMM's dense TBE (as TorchRec runs a data-parallel
table) timed on one thread with caches flushed (median of 7), beside the cost model's
prediction from this host's CPU profile, and a two-term fit of the backward to show the form
the next model step can take. Seeded configurations: 1-8 tables, rows 10²-2·10⁵, dims 4-128,
pooling 1-50, local batches 256-2,048 (what a rank's replica serves at the benchmark's scale),
the dlrm_datasets reuse histogram. Run from the repository root:
``python traces/sharding/dp-backward-20261204/dense_sweep.py OUT.json``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from planner.measure.tables.kernels import time_ranks  # noqa: E402
from planner.measure.tables.plan_work import rank_work  # noqa: E402
from planner.measure.tables.plans import cpu_topology_ref  # noqa: E402
from planner.model.tables.access import default_reuse_bins  # noqa: E402
from planner.model.tables.features import F_BWD, F_FWD  # noqa: E402
from planner.model.tables.ids import model_ids  # noqa: E402
from planner.model.tables.shards import data_parallel  # noqa: E402
from planner.model.tables.spec import ModelSpec, TableSpec  # noqa: E402
from planner.model.tables.task import ShardingTask, prepare  # noqa: E402
from planner.measure.tables.logfit import fit_log_nonneg  # noqa: E402


def configs(n: int, seed: int = 7) -> list[ModelSpec]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        T = int(rng.choice((1, 2, 4, 8)))
        local = int(rng.choice((256, 512, 1024, 2048)))
        tables = tuple(TableSpec(name=f"d{k}t{i}", num_embeddings=int(10 ** rng.uniform(2, 5.3)),
                                 embedding_dim=int(rng.choice((4, 8, 16, 32, 64, 128))),
                                 pooling_factor=float(round(10 ** rng.uniform(0, math.log10(50)), 2)),
                                 reuse_bins=tuple(default_reuse_bins())) for i in range(T))
        out.append(ModelSpec(name=f"dense-{k}", tables=tables, batch_size=2 * local,
                             optimizer="sgd", source="dense_sweep"))
    return out


def main(out_path: str) -> None:
    rows = []
    for m in configs(32):
        task = ShardingTask(model=m, topology=cpu_topology_ref(2))
        cost = prepare(task, 2).cost
        shs = [data_parallel(i, t.name, t.num_embeddings, t.embedding_dim, 2)
               for i, t in enumerate(m.tables)]
        F = sum(cost.sharding_features(ts) for ts in shs)
        c = cost.components(F)
        work = rank_work(m, shs, model_ids(m, seed=0), 2)[0]
        t = time_ranks([work], optimizer="sgd", repeats=7, warmup=2)[0]
        ids = sum(len(w.indices) for w in work)
        rows.append({"name": m.name, "tables": [[x.num_embeddings, x.embedding_dim,
                                                 x.pooling_factor] for x in m.tables],
                     "local_batch": m.batch_size // 2, "ids": ids,
                     "id_elements": float(sum(len(w.indices) * w.cols for w in work)),
                     "table_elements": float(sum(w.rows * w.cols for w in work)),
                     "bag_elements": float(sum(w.bags * w.cols for w in work)),
                     "pred_fwd_s": float(c["lookup_fwd_s"][0]),
                     "pred_bwd_s": float(c["lookup_bwd_s"][0]),
                     "pred_bwd_terms_s": float(F[0, F_BWD]), "pred_fwd_terms_s": float(F[0, F_FWD]),
                     "fwd_s": t.fwd_s, "bwd_s": t.bwd_s})
        r = rows[-1]
        print(f"{m.name:9s} T={len(m.tables)} b={r['local_batch']:5d}: fwd {r['pred_fwd_s']*1e3:6.3f} / "
              f"{r['fwd_s']*1e3:6.3f} ms, bwd {r['pred_bwd_s']*1e3:6.3f} / {r['bwd_s']*1e3:6.3f} ms",
              flush=True)
    meas = np.array([r["bwd_s"] for r in rows])
    pred = np.array([r["pred_bwd_s"] for r in rows])
    X = np.array([[1.0, len(r["tables"]), r["id_elements"], r["table_elements"],
                   r["bag_elements"]] for r in rows])
    coef = fit_log_nonneg(X, meas)
    fit = X @ coef
    summary = {"model_bwd_mape": float(np.mean(np.abs(pred / meas - 1))),
               "model_bwd_mean_ratio": float(np.mean(pred / meas)),
               "model_fwd_mape": float(np.mean(np.abs(np.array([r["pred_fwd_s"] for r in rows])
                                                      / np.array([r["fwd_s"] for r in rows]) - 1))),
               "fit_terms": ["call_s", "per_table_s", "per_id_element_s", "per_table_element_s",
                             "per_bag_element_s"],
               "fit_coefficients": [float(x) for x in coef],
               "fit_bwd_mape": float(np.mean(np.abs(fit / meas - 1)))}
    print(json.dumps(summary, indent=1))
    Path(out_path).write_text(json.dumps({"summary": summary, "points": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dense_sweep.json")
