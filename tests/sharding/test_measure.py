"""Measured evaluation (planner.measure.tables.plans): ids, a plan's per-rank work, real runs.
The CPU profile and its fits are tests/sharding/test_cpu_profile_fit.py.

The kernel and gloo tests run for real (2 ranks) and need torch + fbgemm_gpu
(``make setup-torchrec``); they are skipped without torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from simulator.errors import SpecError

from planner.measure.tables.paired import step_ratio_interval
from planner.measure.tables.plan_work import comm_ops, rank_work
from planner.measure.tables.plans import cpu_topology_ref, scale_model
from planner.model.tables.access import default_reuse_bins
from planner.model.tables.cpu_profile import load_cpu_profile
from planner.model.tables.ids import local_batches, model_ids, table_ids
from planner.model.tables.shards import column_wise, data_parallel, row_wise, table_wise
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask, prepare


def _model(tables, batch=2048, name="m"):
    return ModelSpec(name=name, tables=tuple(tables), batch_size=batch, optimizer="sgd",
                     source="test")


# -- ids -------------------------------------------------------------------------------------

def test_ids_follow_the_access_distribution_the_model_assumes():
    t = TableSpec(name="a", num_embeddings=200_000, embedding_dim=16, pooling_factor=7.3,
                  reuse_bins=tuple(default_reuse_bins()))
    ids = table_ids(t, 4096, seed=1)
    assert ids.offsets[-1] == round(4096 * 7.3) and len(ids.offsets) == 4097
    assert ids.indices.min() >= 0 and ids.indices.max() < t.num_embeddings
    assert np.all(np.diff(ids.offsets) >= 0)
    task = ShardingTask(model=_model([t], batch=4096), topology=cpu_topology_ref(1))
    u_model = 1.0 / prepare(task, 1).cost.accesses_per_row[0]
    u_ids = ids.distinct / len(ids.indices)
    assert u_ids == pytest.approx(u_model, rel=0.02)
    again = table_ids(t, 4096, seed=1)
    assert np.array_equal(again.indices, ids.indices)
    assert not np.array_equal(table_ids(t, 4096, seed=2).indices, ids.indices)


def test_zipf_ids_are_skewed_and_small_tables_cap_distinct_rows():
    z = TableSpec(name="z", num_embeddings=50_000, embedding_dim=8, pooling_factor=4,
                  zipf_exponent=1.2)
    ids = table_ids(z, 4096, seed=0)
    counts = np.bincount(ids.indices, minlength=z.num_embeddings)
    top = np.sort(counts)[::-1]
    assert top[0] > 20 * np.mean(counts[counts > 0])          # one row gets a large share
    small = TableSpec(name="s", num_embeddings=50, embedding_dim=8, pooling_factor=10,
                      reuse_bins=tuple([1.0] + [0.0] * 16))
    assert table_ids(small, 1024).distinct <= 50


def test_scale_model_keeps_ratios():
    t = TableSpec(name="a", num_embeddings=160_000, embedding_dim=32, pooling_factor=3.0)
    m = scale_model(_model([t], batch=65536), 1 / 16)
    assert m.batch_size == 4096 and m.tables[0].num_embeddings == 10_000
    assert m.tables[0].pooling_factor == 3.0 and m.tables[0].embedding_dim == 32
    with pytest.raises(SpecError):
        scale_model(m, 0)


# -- what each rank runs and sends ------------------------------------------------------------

def test_rank_work_and_comm_bytes_match_the_plan_and_the_model():
    tabs = [TableSpec(name=f"t{i}", num_embeddings=5000 + 1000 * i, embedding_dim=16 * (i + 1),
                      pooling_factor=2.0 + i, reuse_bins=tuple([1.0] + [0.0] * 16))
            for i in range(4)]                   # distinct ids: row blocks get their share
    m = _model(tabs, batch=2048)
    n = 2
    task = ShardingTask(model=m, topology=cpu_topology_ref(n))
    problem = prepare(task, n)
    sh = [table_wise(0, "t0", 5000, 16, 0),
          column_wise(1, "t1", 6000, 32, [0, 1], [16, 16]),
          row_wise(2, "t2", 7000, 48, n),
          data_parallel(3, "t3", 8000, 64, n)]
    ids = model_ids(m, seed=0)
    work = rank_work(m, sh, ids, n)
    b = local_batches(m.batch_size, n)
    assert [len(w) for w in work] == [4, 3]                  # TW, CW, RW, DP on 0; CW, RW, DP
    rw0 = [w for w in work[0] if w.name == "t2"][0]
    rw1 = [w for w in work[1] if w.name == "t2"][0]
    assert rw0.lookups + rw1.lookups == len(ids[2].indices)  # every id in exactly one block
    assert rw0.indices.max() < rw0.rows and rw1.indices.max() < rw1.rows
    dp = [w for w in work[1] if w.dense][0]
    assert dp.bags == b[2] - b[1]                             # the local batch only
    ops = {name: arg for _, name, arg in comm_ops(m, sh, ids, n)}
    assert set(ops) == {"input_a2a_s", "output_a2a_fwd_s", "output_a2a_bwd_s",
                        "rw_reducescatter", "rw_allgather", "data_parallel_allreduce_s"}
    F = problem.cost.plan_features(sh)
    model_m = problem.cost.a2a_matrices(F)
    out = np.array(ops["output_a2a_fwd_s"]).T                 # ours: [sender][receiver]
    off = ~np.eye(n, dtype=bool)
    assert np.allclose(np.array(ops["output_a2a_fwd_s"])[off], model_m["output_fwd"][off])
    assert np.allclose(np.array(ops["output_a2a_bwd_s"]), out)
    got = np.array(ops["input_a2a_s"])[off]
    assert got == pytest.approx(model_m["input"][off], rel=0.05)     # real id counts vs means
    assert ops["data_parallel_allreduce_s"] == 8000 * 64 * 4
    assert ops["rw_reducescatter"] == m.batch_size * 48 * 4


# -- the CPU profile ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gloo2():
    pytest.importorskip("torch")
    from planner.measure.tables.comm import GlooGroup
    with GlooGroup(2) as g:
        yield g


def _two_rank_task():
    """Rank 0: three hot, wide tables; rank 1: one light table (≈ 10× fewer row bytes)."""
    heavy = [TableSpec(name=f"h{i}", num_embeddings=40_000, embedding_dim=64, pooling_factor=12,
                       reuse_bins=tuple([1.0] + [0.0] * 16)) for i in range(3)]
    light = TableSpec(name="l", num_embeddings=2_000, embedding_dim=16, pooling_factor=2,
                      reuse_bins=tuple(default_reuse_bins()))
    m = _model(heavy + [light], batch=2048, name="two-rank")
    sh = [table_wise(i, f"h{i}", 40_000, 64, 0) for i in range(3)] + \
        [table_wise(3, "l", 2_000, 16, 1)]
    task = ShardingTask(model=m, topology=cpu_topology_ref(2))
    return m, task, sh


def test_measure_two_ranks_for_real(gloo2):
    """Measured per-rank numbers are positive; the rank with more, hotter tables is slower; and
    after calibration the prediction agrees with the measurement: the lookups of the two ranks
    summed within a factor 2.5 (uncalibrated GPU priors are ~10× off) and the heavy/light ratio
    within ±40% (both ranks timed interleaved, so a busy machine slows both alike)."""
    from planner.measure.tables.plans import measure_shardings
    m, task, sh = _two_rank_task()
    problem = prepare(task, 2)
    res = measure_shardings(problem, sh, repeats=5, warmup=2, comm_repeats=5, group=gloo2)
    assert all(x > 0 for x in res.lookup_s) and all(x > 0 for x in res.comm_s)
    assert all(x > 0 for x in res.measured_s["output_a2a_fwd_s"])
    assert res.lookup_s[0] > 2 * res.lookup_s[1]
    assert res.slowest_rank == 0 and res.max_s == max(res.total_s)
    if load_cpu_profile() is None:
        pytest.skip("no CPU profile to compare against")
    meas, pred = sum(res.lookup_s), sum(res.predicted_lookup_s)
    assert 1 / 2.5 < meas / pred < 2.5
    r_meas = res.lookup_s[0] / res.lookup_s[1]
    r_pred = res.predicted_lookup_s[0] / res.predicted_lookup_s[1]
    assert r_meas == pytest.approx(r_pred, rel=0.4)
    doc = res.to_dict()
    assert doc["per_rank"]["measured_total_s"] == res.total_s and doc["devices"] == 2
    json.dumps(doc)


def test_measure_many_pairs_plans(gloo2):
    from planner.measure.tables.plans import measure_many
    m, task, sh = _two_rank_task()
    problem = prepare(task, 2)
    swapped = [replace(ts, shards=tuple(replace(s, rank=1 - s.rank) for s in ts.shards))
               for ts in sh]
    a, b = measure_many(problem, [sh, swapped], repeats=3, comm_repeats=3, group=gloo2)
    assert a.slowest_rank == 0 and b.slowest_rank == 1
    assert a.settings["paired_with"] == 1
    assert b.lookup_s[1] > 2 * b.lookup_s[0]
    # the medians come from the kept samples: lookups per iteration, collectives per round
    for m_ in (a, b):
        for k in ("lookup_fwd_s", "lookup_bwd_s"):
            assert all(len(xs) == 3 for xs in m_.samples_s[k])
            assert m_.measured_s[k] == pytest.approx([np.median(xs) for xs in m_.samples_s[k]])
        comm = [k for k, v in m_.measured_s.items() if k not in ("lookup_fwd_s", "lookup_bwd_s")
                and any(v)]
        assert comm and all(len(xs) == 3 for k in comm for xs in m_.samples_s[k])
    # the samples are enough for a paired interval (its width is this host's noise)
    lo, hi = step_ratio_interval(a, b)
    assert 0 < lo <= hi < math.inf


def test_measure_many_in_turn_when_plans_do_not_fit_together(gloo2, monkeypatch):
    """Plans too large to build together are timed one after another, forward then reverse,
    each rank's two medians averaged: the same plan twice measures alike, with collectives,
    and no per-iteration samples are kept for the lookups (they were not interleaved)."""
    import planner.measure.tables.plans as plans
    m, task, sh = _two_rank_task()
    problem = prepare(task, 2)
    monkeypatch.setattr(plans, "_available_bytes", lambda: 1.0)    # nothing fits together
    a, b = plans.measure_many(problem, [sh, sh], repeats=3, comm_repeats=3, group=gloo2,
                              memory_limit_bytes=2 ** 40)
    for m_ in (a, b):
        assert m_.settings["interleaved"] is False
        assert all(x > 0 for x in m_.measured_s["lookup_fwd_s"] + m_.measured_s["lookup_bwd_s"])
        assert "lookup_fwd_s" not in m_.samples_s
        assert any(any(v) for k, v in m_.measured_s.items() if not k.startswith("lookup"))
    # the same plan, measured twice in turn: the host's noise, not a factor of two
    assert 0.5 < sum(a.lookup_s) / sum(b.lookup_s) < 2.0


def test_plan_measure_and_measure_commands(tmp_path, capsys, tables_csv):
    """``plan --measure`` and ``measure`` run and report; ``--heap system`` keeps this test
    process's C heap as it is (``retain``, the default, would hold it for the whole run)."""
    pytest.importorskip("torch")
    from planner.cli.main import main
    csv = tables_csv(6, dims=(8, 16, 32), pool=4)
    plan = tmp_path / "plan.json"
    code = main(["plan", str(csv), "--devices", "2", "--batch-size", "1024", "--measure",
                 "--repeats", "2", "--heap", "system", "--json", "--out", str(plan)])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["topology"] == cpu_topology_ref(2)
    meas = out["measurement"]
    assert meas["settings"]["heap"] == "system"
    assert meas["measured_max_s"] > 0 and len(meas["per_rank"]["measured_total_s"]) == 2
    # the step pays each phase's slowest rank: never less than the slowest rank's own sum
    phases = sum(max(v) for v in meas["measured_breakdown_s"].values())
    assert meas["measured_step_s"] == pytest.approx(phases, rel=1e-12)
    assert meas["measured_step_s"] >= meas["measured_max_s"] * (1 - 1e-12)
    code = main(["measure", str(csv), str(plan), "--repeats", "2", "--no-comm", "--heap",
                 "system", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["planner"] == "greedy" and doc["measured_max_s"] > 0
    assert doc["settings"]["heap"] == "system"
    assert all(v == 0 for v in doc["measured_breakdown_s"]["input_a2a_s"])
    other = tmp_path / "other.csv"
    other.write_text("name,num_embeddings,embedding_dim,pooling_factor\nx,100,8,1\n")
    assert main(["measure", str(other), str(plan)]) == 2
    assert "another model" in capsys.readouterr().err
    assert main(["measure", str(csv), str(tmp_path / "nope.json")]) == 2


def test_too_big_to_measure_is_a_spec_error():
    from planner.measure.tables.plans import measure_shardings
    t = TableSpec(name="big", num_embeddings=10_000, embedding_dim=64, pooling_factor=1)
    m = _model([t], batch=64)
    problem = prepare(ShardingTask(model=m, topology=cpu_topology_ref(1)), 1)
    with pytest.raises(SpecError, match="more than"):
        measure_shardings(problem, [table_wise(0, "big", 10_000, 64, 0)], comm=False,
                          memory_limit_bytes=1000)


def test_an_untimed_gradient_trains_the_same_rows():
    """``grad_untimed`` moves making the output gradient (ones) out of the timed backward and
    nothing else: one step updates the tables exactly as the timed default does, for the
    fused TBE and for the data-parallel replicas, repeatedly."""
    pytest.importorskip("fbgemm_gpu")
    import torch
    from planner.measure.tables.kernels import RankKernels
    from planner.measure.tables.tbe import KernelTable
    rng = np.random.default_rng(3)
    tables = [KernelTable(500, 16, "fp32", rng.integers(0, 500, 256 * 3).astype(np.int64),
                          np.arange(0, 256 * 3 + 1, 3, dtype=np.int64), name="s"),
              KernelTable(200, 8, "fp32", rng.integers(0, 200, 64).astype(np.int64),
                          np.arange(0, 65, 1, dtype=np.int64), dense=True, name="d")]
    weights = []
    for untimed in (False, True):
        torch.manual_seed(0)
        k = RankKernels(tables, backend="fbgemm", grad_untimed=untimed)
        for _ in range(2):
            f, b = k.step()
            assert f > 0 and b > 0
        weights.append([p.detach().clone() for part in k.parts
                        for p in (part.groups[0][0].split_embedding_weights()
                                  if hasattr(part, "groups") else
                                  [bag.weight for bag, *_ in part.items])])
        k.close()
    assert len(weights[0]) == 2
    for a, b in zip(*weights):
        assert torch.equal(a, b)
    assert not torch.equal(weights[1][1], torch.zeros_like(weights[1][1]))


def test_data_parallel_replicas_run_torchrec_s_dense_kernel_and_train_exactly():
    """Data-parallel replicas run in FBGEMM's dense TBE, as TorchRec's ``dense`` kernel does
    (not one ``EmbeddingBag`` each, whose CPU backward is several times slower), grouped by
    precision; one step moves each row by −lr × its uses (sum pooling, gradient of ones, SGD),
    in both tables of the group."""
    pytest.importorskip("fbgemm_gpu")
    import torch
    from planner.measure.tables.kernels import RankKernels
    from planner.measure.tables.tbe import LR, KernelTable
    rng = np.random.default_rng(5)
    ids = [rng.integers(0, 300, 64 * 4).astype(np.int64), rng.integers(0, 50, 64).astype(np.int64)]
    tables = [KernelTable(300, 8, "fp32", ids[0], np.arange(0, 64 * 4 + 1, 4, dtype=np.int64),
                          dense=True, name="a"),
              KernelTable(50, 4, "fp32", ids[1], np.arange(0, 65, 1, dtype=np.int64),
                          dense=True, name="b")]
    k = RankKernels(tables, backend="fbgemm")
    (part,) = k.parts
    assert type(part).__name__ == "_FbgemmDense" and len(part.groups) == 1
    emb = part.groups[0][0]
    before = [w.detach().clone() for w in emb.split_embedding_weights()]
    f, b = k.step()
    assert f > 0 and b > 0
    for w0, w1, t, x in zip(before, emb.split_embedding_weights(), tables, ids):
        uses = torch.from_numpy(np.bincount(x, minlength=t.rows).astype(np.float32))
        expect = w0 - LR * uses[:, None].expand(-1, t.cols)
        assert torch.allclose(w1, expect, atol=1e-6)
    k.close()


def _fake(samples: dict, devices: int = 2):
    from planner.measure.tables.plans import Measurement
    med = {k: [float(np.median(x)) if len(x) else 0.0 for x in v] for k, v in samples.items()}
    return Measurement(devices=devices, measured_s=med, predicted_s=med,
                       samples_s={k: [list(x) for x in v] for k, v in samples.items()})


def test_paired_interval_cancels_load_both_plans_saw():
    """Load that slowed iteration k of both plans alike cancels in the paired interval: a
    plan 20% dearer at every index gives [1.2, 1.2] however noisy the host; two plans with
    independent noise and one median get an interval holding 1; identical samples give 1."""
    rng = np.random.default_rng(0)
    load = rng.lognormal(0.0, 0.4, size=9)                  # common to both plans per index
    rounds = rng.lognormal(0.0, 0.4, size=7)
    base = {"lookup_fwd_s": [0.010 * load, 0.008 * load],
            "lookup_bwd_s": [0.020 * load, 0.021 * load],
            "output_a2a_fwd_s": [0.005 * rounds, 0.006 * rounds]}
    b = _fake(base)
    a = _fake({k: [1.2 * x for x in v] for k, v in base.items()})
    lo, hi = step_ratio_interval(a, b)
    assert lo == pytest.approx(1.2) and hi == pytest.approx(1.2)
    assert step_ratio_interval(b, b) == pytest.approx((1.0, 1.0))
    c = _fake({k: [x * rng.lognormal(0.0, 0.2, size=x.size) for x in v]
               for k, v in base.items()})
    lo, hi = step_ratio_interval(c, b)
    assert lo < 1.0 < hi and hi - lo > 0.05


def test_paired_interval_needs_the_samples():
    """Plans measured one after another keep no samples: no interval, rather than a wrong one."""
    from planner.measure.tables.plans import Measurement
    b = _fake({"lookup_fwd_s": [np.ones(5), np.ones(5)]})
    bare = Measurement(devices=2, measured_s={"lookup_fwd_s": [1.0, 1.0]},
                       predicted_s={"lookup_fwd_s": [1.0, 1.0]})
    assert step_ratio_interval(bare, b) is None
    with pytest.raises(ValueError, match="device counts"):
        step_ratio_interval(_fake({"lookup_fwd_s": [np.ones(5)]}, devices=1), b)
