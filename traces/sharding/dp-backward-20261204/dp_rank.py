"""Time the slowest rank of TorchRec's plan on four seed-3 tasks of the measured benchmark
(``--families any``, scale 1/16, 4 ranks): all its shards, its data-parallel replicas alone
(FBGEMM's dense TBE) and the rest alone, one thread, caches flushed, median of 9; beside the
cost model's prediction of each. Run from the repository root:
``python traces/sharding/dp-backward-20261204/dp_rank.py OUT.json``."""
import sys, json
from pathlib import Path
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "tests" / "bench"))
import argparse, numpy as np
import bench_sharding_measured as B
from planner.model.tables.task import prepare
from planner.model.tables.ids import model_ids
from planner.measure.tables.plan_work import rank_work
from planner.measure.tables.kernels import time_ranks
args = argparse.Namespace(seed=3, mip_limit=2.0)
tasks = {i["name"]: i for i in B.make_tasks(24, 3, 1/16, ["any"])}
out = []
for name in ("neuroshard-s3004-6-any-x0.0625", "neuroshard-s3004-11-any-x0.0625", "neuroshard-s3004-3-any-x0.0625", "neuroshard-s3004-0-any-x0.0625"):
    info = tasks[name]; n = info["devices"]; model = info["task"].model
    _, plans = B._plan_task(info, ["torchrec"], args)
    p = plans["torchrec"]; cost = prepare(info["task"], n).cost
    bd = {k: np.array(v) for k, v in p.breakdown_s.items()}
    rk = int(np.argmax(bd["lookup_fwd_s"] + bd["lookup_bwd_s"]))
    ids = model_ids(model, seed=3)
    mine = [ts for ts in p.shardings if any(s.rank == rk for s in ts.shards)]
    groups = {"all": mine, "dp": [ts for ts in mine if ts.sharding_type.value == "data_parallel"],
              "rest": [ts for ts in mine if ts.sharding_type.value != "data_parallel"]}
    for g, shs in groups.items():
        if not shs: continue
        F = sum(cost.sharding_features(ts) for ts in shs)
        c = cost.components(F)
        pf, pb = float(c["lookup_fwd_s"][rk]), float(c["lookup_bwd_s"][rk])
        work = rank_work(model, shs, ids, n)[rk]
        t = time_ranks([work], optimizer=model.optimizer, repeats=9, warmup=2)[0]
        row = dict(task=name, group=g, shards=len(shs), pred_fwd=pf, pred_bwd=pb, meas_fwd=t.fwd_s, meas_bwd=t.bwd_s)
        out.append(row)
        print(f"{name:32s} {g:4s} {len(shs):2d} shards: fwd pred {pf*1e3:6.2f} meas {t.fwd_s*1e3:6.2f} | bwd pred {pb*1e3:6.2f} meas {t.bwd_s*1e3:6.2f}", flush=True)
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "dp_rank.json", "w"), indent=1)
