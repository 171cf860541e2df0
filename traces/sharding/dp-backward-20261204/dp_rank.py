"""Time the slowest rank of TorchRec's plan on four seed-3 tasks of the measured benchmark
(``--families any``, scale 1/16, 4 ranks): all its shards, its data-parallel replicas alone
(FBGEMM's dense TBE) and the rest alone, one thread, caches flushed, median of 9; beside the
cost model's prediction of each. Run from the repository root:
``python traces/sharding/dp-backward-20261204/dp_rank.py OUT.json``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
for _p in (REPO, REPO / "tests" / "bench"):
    sys.path.insert(0, str(_p))

import bench_sharding_measured as bench  # noqa: E402
from planner.measure.tables.kernels import time_ranks  # noqa: E402
from planner.measure.tables.plan_work import rank_work  # noqa: E402
from planner.model.tables.ids import model_ids  # noqa: E402
from planner.model.tables.task import prepare  # noqa: E402

SEED = 3
TASKS = ("neuroshard-s3004-6-any-x0.0625", "neuroshard-s3004-11-any-x0.0625",
         "neuroshard-s3004-3-any-x0.0625", "neuroshard-s3004-0-any-x0.0625")


def time_task(info: dict) -> list[dict]:
    """Predicted and measured lookups of the slowest rank of TorchRec's plan, by shard group."""
    n, model = info["devices"], info["task"].model
    _, plans = bench._plan_task(info, ["torchrec"], argparse.Namespace(seed=SEED, mip_limit=2.0))
    plan, cost = plans["torchrec"], prepare(info["task"], n).cost
    bd = {k: np.array(v) for k, v in plan.breakdown_s.items()}
    rk = int(np.argmax(bd["lookup_fwd_s"] + bd["lookup_bwd_s"]))
    ids = model_ids(model, seed=SEED)
    mine = [ts for ts in plan.shardings if any(s.rank == rk for s in ts.shards)]
    dp = [ts for ts in mine if ts.sharding_type.value == "data_parallel"]
    rest = [ts for ts in mine if ts.sharding_type.value != "data_parallel"]
    rows = []
    for group, shs in (("all", mine), ("dp", dp), ("rest", rest)):
        if not shs:
            continue
        c = cost.components(sum(cost.sharding_features(ts) for ts in shs))
        t = time_ranks([rank_work(model, shs, ids, n)[rk]], optimizer=model.optimizer,
                       repeats=9, warmup=2)[0]
        rows.append(dict(task=info["name"], group=group, shards=len(shs),
                         pred_fwd=float(c["lookup_fwd_s"][rk]),
                         pred_bwd=float(c["lookup_bwd_s"][rk]), meas_fwd=t.fwd_s,
                         meas_bwd=t.bwd_s))
        r = rows[-1]
        print(f"{r['task']:32s} {group:4s} {len(shs):2d} shards: fwd pred "
              f"{r['pred_fwd'] * 1e3:6.2f} meas {r['meas_fwd'] * 1e3:6.2f} | bwd pred "
              f"{r['pred_bwd'] * 1e3:6.2f} meas {r['meas_bwd'] * 1e3:6.2f}", flush=True)
    return rows


def main(out_path: str) -> None:
    tasks = {i["name"]: i for i in bench.make_tasks(24, SEED, 1 / 16, ["any"])}
    out = [row for name in TASKS for row in time_task(tasks[name])]
    Path(out_path).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dp_rank.json")
