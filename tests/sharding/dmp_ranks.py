"""The rank side of ``test_torchrec_dmp.py``: a launcher and the gloo workers it forks.

    python tests/sharding/dmp_ranks.py --launch WORLD LWS STORE PLAN_DIR OUT_DIR

The launcher imports torch, FBGEMM and TorchRec once and forks one worker per rank, so 4 ranks
on a 2-core machine do not pay the ~5 s of imports 4 times; each worker then joins a gloo group
of its own (a file store), runs every case of ``PLAN_DIR/cases.json`` in
``DistributedModelParallel`` beside an unsharded reference, and writes ``OUT_DIR/rank<R>.json``.
The test module loads this file by path for its constants; nothing here imports torch at import
time.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LR = 0.5                     # SGD learning rate, the sharded and the reference step alike
BATCH = 4                    # samples per rank
PG_TIMEOUT_S = 60            # per collective (init_process_group timeout)


def _launch(world: int, lws: int, store: str, plan_dir: str, out_dir: str) -> int:
    """Import the stack once, fork ``world`` workers, return 1 if any of them failed."""
    import warnings
    warnings.simplefilter("ignore")
    os.environ["LOCAL_WORLD_SIZE"] = str(lws)
    import fbgemm_gpu  # noqa: F401
    import torch
    import torch.distributed  # noqa: F401
    import torchrec  # noqa: F401
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: F401
    from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: F401

    import planner.export.torchrec_load  # noqa: F401
    torch.set_num_threads(1)
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _worker(rank, world, lws, store, plan_dir, out_dir)
                code = 0
            except BaseException:
                import traceback
                print(f"rank {rank}: {traceback.format_exc()}", file=sys.stderr)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    failed = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed += status != 0
    return 1 if failed else 0


def _worker(rank: int, world: int, lws: int, store: str, plan_dir: str, out_dir: str) -> None:
    """Join the gloo group, run every case (stopping at the first error), write the results."""
    import torch
    import torch.distributed as dist
    os.environ["LOCAL_RANK"] = str(rank % lws)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    cases = json.loads((Path(plan_dir) / "cases.json").read_text())
    results = {}
    for case in cases:
        t0 = time.perf_counter()
        try:
            results[case["name"]] = _run_case(rank, world, lws, case["tables"],
                                              Path(plan_dir) / f"{case['name']}.json", torch,
                                              allow_empty=case["allow_empty_shards"])
            results[case["name"]]["seconds"] = time.perf_counter() - t0
        except Exception as exc:            # reported by the parent; later collectives unsafe
            import traceback
            results[case["name"]] = {"error": f"{type(exc).__name__}: {exc}",
                                     "trace": traceback.format_exc()[-3000:]}
            break
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:
        pass


def _batch(rank: int, tables, torch):
    """This rank's fixed KeyedJaggedTensor: one feature per table, 0-4 ids per sample."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    g = torch.Generator().manual_seed(1000 + rank)
    lengths, values = [], []
    for _, rows, _ in tables:
        n = torch.randint(0, 5, (BATCH,), generator=g)
        lengths.append(n)
        values.append(torch.randint(0, rows, (int(n.sum()),), generator=g))
    return KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{t[0]}" for t in tables],
                                               values=torch.cat(values),
                                               lengths=torch.cat(lengths))


def _loss(pooled: dict, rank: int, torch):
    """A fixed linear function of the pooled embeddings, different on every rank."""
    g = torch.Generator().manual_seed(2000 + rank)
    total = 0
    for key in sorted(pooled):
        c = torch.randn(pooled[key].shape, generator=g)
        total = total + (pooled[key] * c).sum()
    return total


def _run_case(rank, world, lws, tables, plan_path, torch, *, allow_empty=False):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from planner.export.torchrec_load import load_sharding_plan

    configs = [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d,
                                  feature_names=[f"f_{n}"]) for n, r, d in tables]
    plan = load_sharding_plan(plan_path, world_size=world, tables=configs,
                              local_world_size=lws, device="cpu",
                              allow_empty_shards=allow_empty)
    kinds = {n: p.sharding_type for n, p in plan.plan[""].items()}

    # reference weights, the same on every rank
    g = torch.Generator().manual_seed(7)
    weights = {n: torch.randn(r, d, generator=g) * 0.1 for n, r, d in tables}
    ref = EmbeddingBagCollection(tables=configs)
    with torch.no_grad():
        for n, w in weights.items():
            ref.embedding_bags[n].weight.copy_(w)

    sharder = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR})
    model = DistributedModelParallel(EmbeddingBagCollection(tables=configs,
                                                            device=torch.device("meta")),
                                     device=torch.device("cpu"), plan=plan, sharders=[sharder])

    def pieces(state):
        """(table, row0, col0, tensor) for every shard this rank holds."""
        out = []
        for key, v in state.items():
            name = key.split(".")[-2]
            if isinstance(v, ShardedTensor):
                for s in v.local_shards():
                    r0, c0 = s.metadata.shard_offsets
                    out.append((name, int(r0), int(c0), s.tensor))
            else:
                out.append((name, 0, 0, v))
        return out

    with torch.no_grad():
        for name, r0, c0, t in pieces(model.state_dict()):
            t.copy_(weights[name][r0:r0 + t.shape[0], c0:c0 + t.shape[1]])

    # forward: this rank's batch, compared feature by feature (the sharded output's key order
    # is grouped by rank, formats.md §2.10)
    kjts = [_batch(r, tables, torch) for r in range(world)]
    out = model(kjts[rank])
    out = out.wait() if hasattr(out, "wait") else out
    got = out.to_dict()
    want = ref(kjts[rank]).to_dict()
    assert set(got) == set(want), (sorted(got), sorted(want))
    fwd_err = max(float((got[k] - want[k]).abs().max()) for k in want)

    # one SGD step: fused exact SGD in backward for sharded tables, SGD for data-parallel ones
    dense = [p for n, p in model.named_parameters()
             if kinds.get(n.split(".")[-2]) == "data_parallel"]
    opt = torch.optim.SGD(dense, lr=LR) if dense else None
    _loss(got, rank, torch).backward()
    if opt is not None:
        opt.step()
    ref_loss = sum(_loss(ref(kjts[r]).to_dict(), r, torch) for r in range(world)) / world
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    ref_loss.backward()
    ref_opt.step()
    updated = {n: ref.embedding_bags[n].weight.detach() for n, _, _ in tables}

    step_err: dict[str, float] = {}
    moved, boxes = 0.0, []
    for name, r0, c0, t in pieces(model.state_dict()):
        nr, nc = t.shape
        new = updated[name][r0:r0 + nr, c0:c0 + nc]
        old = weights[name][r0:r0 + nr, c0:c0 + nc]
        if nr and nc:
            step_err[name] = max(step_err.get(name, 0.0), float((t - new).abs().max()))
            moved = max(moved, float((new - old).abs().max()))
        boxes.append([name, r0, c0, int(nr), int(nc)])
    # FBGEMM table-batched kernels this rank built (in each sharding's lookup, which the
    # sharded collection keeps in a plain list): one per lookup group it holds
    calls = sum(type(k).__name__.endswith("TableBatchedEmbeddingBagsCodegen")
                for m in model.modules() for lookup in getattr(m, "_lookups", None) or []
                for k in lookup.modules())
    return {"fwd_err": fwd_err, "step_err": step_err, "max_update": moved, "boxes": boxes,
            "types": sorted(set(kinds.values())), "calls": calls}


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--launch":
    sys.path.insert(0, str(REPO))
    raise SystemExit(_launch(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
                             sys.argv[6]))
