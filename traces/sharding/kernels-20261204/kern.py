"""Kernel-only diagnostic: per plan, per rank, measured vs predicted lookups; fused vs singles."""
import sys, json
from pathlib import Path
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / 'tests' / 'bench')); sys.path.insert(0, str(REPO))
from bench_sharding_measured import make_tasks
from planner.sharding.planners import get_planner
from planner.model.tables.task import prepare
from planner.model.tables.plan import evaluate_shardings
from planner.model.tables.ids import model_ids
from planner.measure.tables.plan_work import rank_work
from planner.measure.tables.kernels import time_ranks
from planner.measure.heap import apply_heap_policy
apply_heap_policy("retain")
want = sys.argv[1] if len(sys.argv) > 1 else "neuroshard-s8-2-any"
seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
singles = "--singles" in sys.argv
infos = [i for i in make_tasks(24, seed, 1/16, ("any",)) if i["name"].startswith(want)]
info = infos[0]; task, n = info["task"], info["devices"]
print(info["name"], n, info["tables"])
problem = prepare(task, n)
ids = model_ids(task.model, seed=seed)
out = {}
for name in ("torchrec", "greedy", "local_search", "mip"):
    opts = {"solver": "cbc"} if name == "mip" else {}
    plan = get_planner(name, **opts).plan(task, n, seed=seed, time_limit_s=2 if name in ("mip","local_search") else None)
    ev = evaluate_shardings(problem, plan.shardings)
    pf, pb = ev.breakdown_s["lookup_fwd_s"], ev.breakdown_s["lookup_bwd_s"]
    work = rank_work(task.model, plan.shardings, ids, n)
    tm = time_ranks(work, optimizer=task.model.optimizer, repeats=9, warmup=2)
    rows = []
    for r in range(n):
        kinds = {}
        for ts in plan.shardings:
            for s in ts.shards:
                if s.rank == r: kinds[ts.sharding_type.value] = kinds.get(ts.sharding_type.value, 0) + 1
        row = dict(rank=r, pf=pf[r]*1e3, pb=pb[r]*1e3, mf=tm[r].fwd_s*1e3, mb=tm[r].bwd_s*1e3, kinds=kinds,
                   cols=sum(k.cols for k in work[r]), ids=sum(len(k.indices) for k in work[r]))
        if singles:
            st = time_ranks([[k] for k in work[r]], optimizer=task.model.optimizer, repeats=9, warmup=2)
            row["sf"] = sum(x.fwd_s for x in st)*1e3; row["sb"] = sum(x.bwd_s for x in st)*1e3
        rows.append(row)
        print(f"{name:12s} r{r} pred {row['pf']:6.2f}+{row['pb']:6.2f}  meas {row['mf']:6.2f}+{row['mb']:6.2f}"
              + (f"  singles {row['sf']:6.2f}+{row['sb']:6.2f}" if singles else "")
              + f"  ratio {(row['mf']+row['mb'])/(row['pf']+row['pb']):.2f}  cols {row['cols']} ids {row['ids']} {kinds}", flush=True)
    out[name] = rows
if "--out" in sys.argv:
    with open(sys.argv[sys.argv.index("--out") + 1], "w") as f:
        json.dump(out, f, indent=1)
