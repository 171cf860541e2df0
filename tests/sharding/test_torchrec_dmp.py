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

The ranks run in ``dmp_ranks.py`` (a launcher that forks them); this module exports the plans,
starts it and checks that the shards the ranks compared tile every table exactly. One process
group per world size serves all plans; ``init_process_group`` has a timeout and the whole group
a deadline, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

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
RANKS = Path(__file__).with_name("dmp_ranks.py")      # the launcher and its workers
TOL = 1e-5
GROUP_DEADLINE_S = 240       # whole run of one world size, all plans


def _by_path(name: str):
    """A helper module beside this file, loaded by path (the tests are not a package)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plans_module():
    """``torchrec_cases``: the test tables and plan builder."""
    return _by_path("torchrec_cases")


LR = _by_path("dmp_ranks").LR


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
            [sys.executable, str(RANKS), "--launch", str(world), str(lws),
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
