"""Exported plans run in TorchRec's DistributedModelParallel on 2 and 4 gloo processes.

For every sharding type (table-wise, column-wise with uneven widths, row-wise with an empty
trailing shard, table-row-wise, data-parallel) and one plan mixing all five, a clusterplan
sharding plan is exported (``export_torchrec_plan``), written to JSON and loaded in each process
(``load_sharding_plan``). Each rank wraps an ``EmbeddingBagCollection`` of five small tables in
``DistributedModelParallel`` with that plan, copies the reference weights into its shards, and
checks against an unsharded ``EmbeddingBagCollection`` with the same weights:

- forward: the pooled output of its own fixed ``KeyedJaggedTensor``, feature by feature;
- one SGD step (lr 0.5; FBGEMM's fused exact SGD for the sharded tables, ``torch.optim.SGD``
  for the data-parallel ones): its shards of the updated weights. TorchRec and DDP average
  gradients over ranks, so the reference step is on the mean of the ranks' losses.

The parent checks that the shards the ranks compared tile every table exactly. One process
group per world size serves all plans; ``init_process_group`` has a timeout and the whole group
a deadline, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LR = 0.5
BATCH = 4                    # samples per rank
TOL = 1e-5
PG_TIMEOUT_S = 60            # per collective (init_process_group timeout)
GROUP_DEADLINE_S = 240       # whole run of one world size, all plans


def _plans_module():
    """``torchrec_cases`` (the test tables and plan builder), loaded by path."""
    spec = importlib.util.spec_from_file_location("_torchrec_cases",
                                                  Path(__file__).with_name("torchrec_cases.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------------------------------------
# launcher and workers: python test_torchrec_dmp.py --launch WORLD LWS STORE PLANS OUT
#
# The launcher imports torch, FBGEMM and TorchRec once and forks one worker per rank, so 4 ranks
# on a 2-core machine do not pay the ~5 s of imports 4 times; each worker then joins a gloo group
# of its own (a file store) and runs every case.

def _launch(world: int, lws: int, store: str, plan_dir: str, out_dir: str) -> int:
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


# ---------------------------------------------------------------------------------------------
# parent

KIND_NAMES = ("table_wise", "column_wise", "row_wise", "table_row_wise", "data_parallel", "mixed")
#: row-wise over 4 ranks with an empty trailing shard (see test_fbgemm_cpu_empty_table_defect)
EMPTY = "row_wise_empty_shard"


def _run_group(world: int, tmp: Path) -> dict:
    """Export every case for ``world`` ranks, run the ranks, return ``{rank: results}``."""
    from planner.export.torchrec import export_torchrec_plan
    from planner.export.torchrec_format import torchrec_plan_json
    mod = _plans_module()
    plan_dir, out_dir = tmp / "plans", tmp / "out"
    plan_dir.mkdir()
    out_dir.mkdir()
    cases, plans, lws = [], {}, None
    for name in KIND_NAMES + (EMPTY,):
        tables = mod.EMPTY_SHARD_TABLES if name == EMPTY else mod.TABLES
        kind = "row_wise" if name == EMPTY else name
        doc = export_torchrec_plan(mod.sharding_plan(kind, world, tables).to_dict(),
                                   device="cpu")
        lws = doc["local_world_size"]
        (plan_dir / f"{name}.json").write_text(torchrec_plan_json(doc))
        plans[name] = doc
        cases.append({"name": name, "tables": [list(t) for t in tables],
                      "allow_empty_shards": name == EMPTY})
    (plan_dir / "cases.json").write_text(json.dumps(cases))
    store = tmp / "store"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    with open(tmp / "ranks.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--launch", str(world), str(lws),
             str(store), str(plan_dir), str(out_dir)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True)
        try:
            proc.wait(timeout=GROUP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)        # the launcher's session: it and its ranks
            proc.wait()
            pytest.fail(f"DMP on {world} gloo processes did not finish in {GROUP_DEADLINE_S} s: "
                        + _tail(tmp))
    results: dict = {}
    for r in range(world):
        f = out_dir / f"rank{r}.json"
        if not f.exists():
            pytest.fail(f"rank {r} of {world} left no results (launcher exit "
                        f"{proc.returncode}): " + _tail(tmp))
        results[r] = json.loads(f.read_text())
    results["wall_s"] = time.monotonic() - t0
    results["plans"] = plans
    return results


def _tail(tmp: Path) -> str:
    lines = (tmp / "ranks.log").read_text(errors="replace").strip().splitlines()
    return " | ".join([x for x in lines if "arn" not in x][-4:])


@pytest.fixture(scope="module")
def groups(tmp_path_factory):
    pytest.importorskip("torchrec")
    pytest.importorskip("fbgemm_gpu")
    cache: dict[int, dict] = {}

    def get(world: int) -> dict:
        if world not in cache:
            cache[world] = _run_group(world, tmp_path_factory.mktemp(f"dmp{world}"))
        return cache[world]
    return get


def _case(res: dict, world: int, name: str, rank: int) -> dict:
    got = res[rank].get(name)
    assert got is not None, f"rank {rank} never ran {name} (an earlier case failed)"
    assert "error" not in got, f"rank {rank}, {name} on {world}: {got['error']}\n{got['trace']}"
    return got


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", KIND_NAMES)
def test_dmp_matches_unsharded_model(groups, world, kind):
    res = groups(world)
    doc = res["plans"][kind]
    for r in range(world):
        got = _case(res, world, kind, r)
        assert got["fwd_err"] <= TOL, (r, got["fwd_err"])
        assert got["max_update"] > 1e-3                   # the step moved the weights
        assert max(got["step_err"].values()) <= TOL, (r, got["step_err"], got["max_update"])
    # the shards the ranks compared are exactly the plan's, and tile every table
    entries = doc["plan"][""]
    expected = sorted([name, *s["shard_offsets"], *s["shard_sizes"]]
                      for name, p in entries.items() if p["sharding_type"] != "data_parallel"
                      for s in p["shards"])
    seen = sorted(b for r in range(world) for b in res[r][kind]["boxes"]
                  if entries[b[0]]["sharding_type"] != "data_parallel")
    assert seen == expected
    for name, p in entries.items():
        if p["sharding_type"] == "data_parallel":
            rows, dim = doc["context"]["tables"][name]
            assert all([name, 0, 0, rows, dim] in res[r][kind]["boxes"] for r in range(world))
    want_types = sorted({p["sharding_type"] for p in entries.values()})
    assert res[0][kind]["types"] == want_types
    assert len(want_types) == (5 if kind == "mixed" else 1)


@pytest.mark.parametrize("world", [2, 4])
def test_lookup_calls_per_rank_are_torchrec_s(groups, world):
    """TorchRec builds one fused table-batched kernel per sharding type a rank holds (and per
    precision, kernel); the cost model charges each rank one call's fixed costs per such
    group (``CostModel.calls``). The mixed plan puts 2-4 types on a rank, a rank of the
    table-wise plan may hold none."""
    res = groups(world)
    mod = _plans_module()
    cm = mod.sharding_problem(world).cost
    seen = set()
    for kind in KIND_NAMES:
        want = cm.calls(cm.plan_features(mod.sharding_plan(kind, world).shardings))
        got = [_case(res, world, kind, r)["calls"] for r in range(world)]
        assert got == [int(c) for c in want], (kind, got, want)
        seen.update(got)
    assert max(seen) >= 3 and min(seen) <= 1


@pytest.mark.parametrize("world", [2, 4])
def test_dmp_with_an_empty_row_shard(groups, world):
    """5 rows row-wise: 3 + 2 on 2 ranks (correct); 2, 2, 1, 0 on 4 ranks, where rank 3's empty
    shard of e0 makes its fused SGD update of e1 wrong (forward still right). This is why
    load_sharding_plan refuses empty row shards on CPU unless allow_empty_shards=True."""
    res = groups(world)
    for r in range(world):
        got = _case(res, world, EMPTY, r)
        assert got["fwd_err"] <= TOL
        bad = {t for t, e in got["step_err"].items() if e > TOL}
        if world == 4 and r == 3:
            assert bad == {"e1"}, ("FBGEMM's CPU kernel now updates a table after an empty one "
                                   "correctly: drop the refusal in load_sharding_plan",
                                   got["step_err"])
            assert got["step_err"]["e1"] > 1e-2
        else:
            assert not bad, (r, got["step_err"])


def test_fbgemm_cpu_empty_table_defect():
    """The cause, without TorchRec: FBGEMM 1.8.0's CPU table-batched EmbeddingBag with a 0-row
    table. Alone, its forward raises; before another table, that table's exact-SGD update is
    wrong. (A 1-row table instead is handled correctly.)"""
    pytest.importorskip("fbgemm_gpu")
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    def tbe(shapes):
        return SplitTableBatchedEmbeddingBagsCodegen(
            [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in shapes],
            optimizer=EmbOptimType.EXACT_SGD, learning_rate=LR)

    with pytest.raises(RuntimeError, match="must be a GPU or MTIA tensor"):
        tbe([(0, 8)])(torch.zeros(0, dtype=torch.long), torch.zeros(4, dtype=torch.long))

    def update_error(first_rows: int) -> float:
        m = tbe([(first_rows, 8), (5, 12)])
        g = torch.Generator().manual_seed(3)
        w = torch.randn(5, 12, generator=g)
        with torch.no_grad():
            m.split_embedding_weights()[1].copy_(w)
        ids = torch.tensor([0, 3, 3, 4])                 # table 1, bags {0, 3}, {3}, {4}
        offsets = torch.tensor([0, 0, 0, 0, 2, 3, 4])    # table 0: three empty bags
        c = torch.randn(3, 20, generator=g)
        (m(ids, offsets) * c).sum().backward()
        want = w.clone()
        grads = torch.zeros(5, 12)
        for b, bag in enumerate(([0, 3], [3], [4])):
            for i in bag:
                grads[i] += c[b, 8:]
        want -= LR * grads
        return float((m.split_embedding_weights()[1] - want).abs().max())

    assert update_error(1) <= TOL
    assert update_error(0) > 1e-2, "FBGEMM fixed the empty-table update: drop the refusal"


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--launch":
    sys.path.insert(0, str(REPO))
    raise SystemExit(_launch(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5],
                             sys.argv[6]))
