"""Do narrow column slices suffer more from a co-running rank than wide rows? (issue 22)

    python tests/bench/probe_corun_lookups.py 2      # or 4 (ranks on this machine's cores)

One fused FBGEMM TBE per rank (forward + backward, fused SGD), timed on rank 0 alone (the
others wait at a barrier) and on every rank at once, for three table sets: the gloo
calibration's lookup probe (``wide``), the same tables at 1/8 of their dims (``narrow``: the
slices a column-wise plan runs) and narrow with 4x the pooling at 1/4 of the batch
(``narrow-many``: as many ids, narrow rows). Prints each against this host's CPU embedding
profile's prediction. 2026-11-27, AMD EPYC VM, 2 ranks: wide 1.32x, narrow 1.46x, narrow-many
1.28x the prediction together (1.14x alone): no per-id slowdown that per-byte terms miss.
"""
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

def sets(world):
    from planner.measure.validate.lookup_probe import LOOKUP_TABLES, LOOKUP_BATCH, probe_shardings
    from planner.model.tables.spec import TableSpec, ModelSpec
    out = {}
    def probe(name, tabs, batch=LOOKUP_BATCH):
        tables = tuple(TableSpec(name=f"l{i}", num_embeddings=r, embedding_dim=d,
                                 pooling_factor=p, zipf_exponent=z)
                       for i, (r, d, p, z) in enumerate(tabs))
        m = ModelSpec(name=name, tables=tables, batch_size=batch, optimizer="sgd")
        out[name] = (m, probe_shardings(m), 1)
    probe("wide", LOOKUP_TABLES)
    probe("narrow", [(r, max(4, d // 8), p, z) for r, d, p, z in LOOKUP_TABLES])
    probe("narrow-many", [(r, max(4, d // 8), p * 4, z) for r, d, p, z in LOOKUP_TABLES],
          LOOKUP_BATCH // 4)
    return out

def worker(rank, world, store_path, q):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank,
                            world_size=world)
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    from planner.model.tables.ids import model_ids
    from planner.measure.tables.plan_work import rank_work
    from planner.measure.tables.kernels import time_shard_set
    res = {}
    for name, (m, sh, dev) in sets(world).items():
        tables = rank_work(m, sh, model_ids(m), dev)[0]
        for mode in ("alone", "together", "alone", "together"):
            dist.barrier()
            if mode == "together" or rank == 0:
                t = time_shard_set(tables, repeats=9, warmup=2)
                if rank == 0:
                    res.setdefault(name, {}).setdefault(mode, []).append(t.fwd_s + t.bwd_s)
            dist.barrier()
    if rank == 0:
        q.put(res)
    dist.destroy_process_group()

if __name__ == "__main__":
    world = int(sys.argv[1])
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    store = str(Path(tempfile.mkdtemp()) / "store")
    ps = [ctx.Process(target=worker, args=(r, world, store, q)) for r in range(world)]
    [p.start() for p in ps]; res = q.get(); [p.join() for p in ps]
    from planner.model.tables.task import ShardingTask, prepare
    from planner.model.tables.plan import evaluate_shardings
    from planner.measure.tables.plans import cpu_topology_ref
    for name, (m, sh, dev) in sets(world).items():
        pr = prepare(ShardingTask(model=m, topology=cpu_topology_ref(2)), 2)
        ev = evaluate_shardings(pr, sh)
        pred = float(ev.breakdown_s["lookup_fwd_s"][0] + ev.breakdown_s["lookup_bwd_s"][0])
        a = statistics.median(res[name]["alone"]); t = statistics.median(res[name]["together"])
        print(f"w{world} {name:12s} predicted {pred * 1e3:7.2f} ms alone {a * 1e3:7.2f} "
              f"({a / pred:.2f}x) together {t * 1e3:7.2f} ({t / pred:.2f}x, {t / a:.2f}x alone)")
