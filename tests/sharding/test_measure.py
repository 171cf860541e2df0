"""Measured evaluation (planner.measure.tables.plans), the CPU profile and its calibration fits.

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
from planner.model.tables.cost import CostConfig
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

def test_cpu_profile_applies_to_cpu_targets_only():
    prof = load_cpu_profile()
    if prof is None:
        pytest.skip("no committed CPU profile")
    t = TableSpec(name="a", num_embeddings=10_000, embedding_dim=32, pooling_factor=4)
    cpu = prepare(ShardingTask(model=_model([t]), topology=cpu_topology_ref(4)), 4).cost
    assert cpu.hbm_Bps == prof.lookup_Bps
    assert cpu.config.lookup_overhead_bytes == prof.lookup_overhead_bytes
    w, fit = prof.world_fit(4)
    assert cpu.comm.a2a_alpha_s == fit["a2a_alpha_s"] and "gloo" in cpu.comm.source
    gpu = prepare(ShardingTask(model=_model([t])), 4).cost
    assert gpu.device_profile is None
    assert gpu.hbm_Bps == pytest.approx(gpu.topo.gpu.hbm_bandwidth_Bps
                                        * gpu.gpu_lookup.hbm_efficiency)
    off = prepare(ShardingTask(model=_model([t]), topology=cpu_topology_ref(4),
                               cost=CostConfig(device_profile=None)), 4).cost
    assert off.device_profile is None and off.hbm_Bps != prof.lookup_Bps


def test_this_hosts_profile_is_preferred_and_another_hosts_is_named(tmp_path, monkeypatch):
    """A profile measured on this host (kept under its fingerprint) replaces the committed
    one; a profile from another kind of host still plans, and the plan says so."""
    import yaml

    from planner.machine import platform_description
    from planner.model.tables import cpu_profile
    committed = cpu_profile.CPU_PROFILE_PATH
    if not committed.is_file():
        pytest.skip("no committed CPU profile")
    monkeypatch.setenv("CLUSTERPLAN_CACHE", str(tmp_path))
    doc = yaml.safe_load(committed.read_text())
    doc["lookup"]["lookup_Bps"] = 1.25e9
    doc["measured"]["machine"] = dict(doc["measured"]["machine"],
                                      cpu_model=platform_description().get("cpu_model"),
                                      cpu_count=platform_description().get("cpu_count"))
    doc["measured"]["machine"].pop("last_level_cache_bytes", None)
    t = TableSpec(name="a", num_embeddings=10_000, embedding_dim=32, pooling_factor=4)

    def cost():
        cpu_profile.load_cpu_profile.cache_clear()
        prepare.cache_clear()
        return prepare(ShardingTask(model=_model([t]), topology=cpu_topology_ref(2)), 2).cost
    try:
        assert cost().hbm_Bps == pytest.approx(load_cpu_profile(str(committed)).lookup_Bps)
        host = cpu_profile.host_profile_path()
        assert host.parent == tmp_path
        host.write_text(yaml.safe_dump(doc))
        here = cost()
        assert here.hbm_Bps == pytest.approx(1.25e9)
        assert not any("another host" in x for x in here.extrapolated())
        doc["measured"]["machine"]["cpu_model"] = "Some Other CPU 9000"
        host.write_text(yaml.safe_dump(doc))
        lines = cost().extrapolated()
        assert any("another host" in x and "Some Other CPU 9000" in x
                   and "calibrate embedding" in x for x in lines)
    finally:
        cpu_profile.load_cpu_profile.cache_clear()
        prepare.cache_clear()


def test_bad_profile_file_is_a_spec_error(tmp_path):
    p = tmp_path / "prof.yaml"
    p.write_text("lookup: {lookup_Bps: -1}\n")
    with pytest.raises(SpecError, match="lookup"):
        load_cpu_profile(str(p))
    with pytest.raises(SpecError, match="not found"):
        load_cpu_profile(str(tmp_path / "missing.yaml"))


def test_kernel_fit_recovers_known_constants():
    """Points generated by the model form itself (forward, backward by its own terms, page
    faults of new outputs) give back its constants."""
    from planner.measure.tables.fit import (GRAD_REACH_BYTES, _backward_design, _design,
                                            _fresh_bytes, fit_kernel_profile, kernel_configs,
                                            kernel_predictions)
    cfgs = kernel_configs(60, seed=3)
    pts = [{"name": c.name, "batch": c.batch_size,
            "tables": [[t.num_embeddings, t.embedding_dim, t.pooling_factor,
                        "zipf" if t.zipf_exponent is not None else
                        ("distinct" if t.reuse_bins and t.reuse_bins[0] == 1.0 else
                         list(t.reuse_bins or default_reuse_bins())), t.precision]
                       for t in c.tables], "fwd_s": 0.0, "bwd_s": 0.0} for c in cfgs]
    launch, s0, bw, ovh, h, e16, walk = 2e-4, 3e-5, 6e9, 40.0, 0.8, 4.5, 30.0
    back = {"call_s": 3e-4, "shard_s": 1e-5, "id_bytes": 120.0, "grad_element_bytes": 2.0,
            "update_element_bytes": 6.0, "half_update_element_bytes": 12.0, "walk_bytes": 50.0,
            "spill_element_bytes": 0.5}
    fault_Bps = 2e9
    X = _design(pts, h, 2.0 ** 20)
    Xb = _backward_design(pts, 2.0 ** 20)
    fresh = _fresh_bytes(pts) / fault_Bps
    assert np.count_nonzero(fresh) >= 3          # some outputs are above the mmap threshold
    # the bytes column carries half rows at 2 bytes an element; e16 is the total per element
    var = (X[:, 2] + (e16 - 2.0) * X[:, 3] + ovh * X[:, 4] + walk * X[:, 5]) / bw
    bvar = Xb @ np.array([back[k] for k in ("id_bytes", "grad_element_bytes",
                                            "update_element_bytes", "half_update_element_bytes",
                                            "walk_bytes", "spill_element_bytes")]) / bw
    for p, row, v, bv, fr in zip(pts, X, var, bvar, fresh):
        p["fwd_s"] = launch + row[1] * s0 + v + fr
        p["bwd_s"] = back["call_s"] + row[1] * back["shard_s"] + bv + fr
    fit = fit_kernel_profile(pts)
    assert fit["lookup_Bps"] == pytest.approx(bw, rel=0.02)
    assert fit["lookup_overhead_bytes"] == pytest.approx(ovh, rel=0.02)
    assert fit["repeat_hit_ratio"] == pytest.approx(h, abs=1e-9)
    assert fit["kernel_launch_s"] == pytest.approx(launch, rel=0.02)
    assert fit["element_bytes"]["fp16"] == pytest.approx(e16, rel=0.02)
    assert fit["row_walk_bytes"] == pytest.approx(walk, rel=0.02)
    assert fit["page_reach_bytes"] == 2.0 ** 20
    assert fit["page_fault_Bps"] == pytest.approx(fault_Bps, rel=0.02)
    for k, v in back.items():
        assert fit["backward"][k] == pytest.approx(v, rel=0.02, abs=1e-9), k
    assert fit["backward"]["grad_reach_bytes"] == GRAD_REACH_BYTES
    assert fit["fit"]["total_mape"] < 1e-6
    # configurations the fit never saw (their own Zipf exponents, not the sweep's) get the
    # generating form's times
    new = [replace(m, tables=tuple(replace(t, zipf_exponent=0.3 + 0.1 * i)
                                   if t.zipf_exponent is not None else t
                                   for i, t in enumerate(m.tables)))
           for m in kernel_configs(12, seed=11)]
    Xn, Xbn, fn = _design(new, h, 2.0 ** 20), _backward_design(new, 2.0 ** 20), \
        _fresh_bytes(new) / fault_Bps
    want_f = launch + Xn[:, 1] * s0 + (Xn[:, 2] + (e16 - 2.0) * Xn[:, 3] + ovh * Xn[:, 4]
                                        + walk * Xn[:, 5]) / bw + fn
    want_b = back["call_s"] + Xn[:, 1] * back["shard_s"] + Xbn @ np.array(
        [back[k] for k in ("id_bytes", "grad_element_bytes", "update_element_bytes",
                           "half_update_element_bytes", "walk_bytes",
                           "spill_element_bytes")]) / bw + fn
    got_f, got_b = kernel_predictions(pts, new)
    np.testing.assert_allclose(got_f, want_f, rtol=0.02)
    np.testing.assert_allclose(got_b, want_b, rtol=0.02)


def test_half_rows_cost_at_least_their_bytes_and_a_fit_the_reader_rejects_is_not_written(
        tmp_path):
    """Half-precision points no slower than their bytes: the extra per element fits to 0 and
    fp16 rows cost their 2 bytes an element (before, the fit wrote 0, which its own reader
    rejected, and the host's first `validate unseen` stopped there). A document the reader
    rejects raises and leaves no file."""
    from planner.measure.tables.fit import _design, fit_kernel_profile, kernel_configs, \
        write_profile
    cfgs = kernel_configs(40, seed=5)
    pts = [{"name": c.name, "batch": c.batch_size,
            "tables": [[t.num_embeddings, t.embedding_dim, t.pooling_factor, "distinct",
                        t.precision] for t in c.tables], "fwd_s": 0.0, "bwd_s": 0.0}
           for c in cfgs]
    assert any(t[4] != "fp32" for p in pts for t in p["tables"])
    X = _design(pts, 0.8)
    for p, row in zip(pts, X):
        p["fwd_s"] = 1e-4 + row[1] * 2e-5 + (row[2] + 50.0 * row[4]) / 5e9
        p["bwd_s"] = 2.5 * p["fwd_s"]
    fit = fit_kernel_profile(pts)
    assert fit["element_bytes"]["fp16"] == pytest.approx(2.0, rel=0.02)
    bad = tmp_path / "prof.yaml"
    with pytest.raises(SpecError, match="lookup"):
        write_profile({"lookup": {"lookup_Bps": -1.0}}, str(bad))
    assert list(tmp_path.iterdir()) == []


def test_backward_terms_price_a_shard_by_its_own_work(tmp_path):
    """On a profile with backward terms, a shard's backward is its ids, gradient columns and
    updated rows, not a multiple of its forward: doubling the dim of a table whose ids are
    all distinct adds exactly the per-column terms."""
    from planner.model.tables.cpu_profile import BackwardTerms
    b = BackwardTerms(call_s=1e-4, shard_s=2e-5, id_bytes=100.0, grad_element_bytes=2.0,
                      update_element_bytes=6.0, half_update_element_bytes=12.0,
                      walk_bytes=0.0, spill_element_bytes=0.5)
    ids, unique, samples = 1e5, 4e4, 2048
    one = b.variable_bytes(ids, unique, 32, False, 0.0, samples)
    spill32 = np.log2(samples * 32 * 4 / b.grad_reach_bytes)
    assert one == pytest.approx(ids * (100 + 32 * (2 + 0.5 * max(spill32, 0)))
                                + unique * 32 * 6)
    assert b.variable_bytes(ids, unique, 32, True, 0.0, samples) - one == pytest.approx(
        unique * 32 * 6)
    assert b.scaled(2.0).call_s == 2e-4 and b.scaled(2.0).id_bytes == 100.0


def test_comm_fit_recovers_a_line():
    from planner.measure.tables.fit_comm import fit_comm_profile
    pts = []
    for s in (1e3, 1e5, 1e6, 4e6):
        for r in range(4):
            pts.append({"kind": "a2a", "sent_bytes": s * (1 + r / 4), "received_bytes": s,
                        "seconds": 1e-3 + s * (1 + r / 4) / 8e8})
            pts.append({"kind": "allreduce", "bytes": 4 * s, "seconds": 2e-3 + 4 * s / 5e8})
    fit = fit_comm_profile({4: pts})[4]
    assert fit["a2a_alpha_s"] == pytest.approx(1e-3, rel=1e-6)
    assert fit["a2a_Bps"] == pytest.approx(8e8, rel=1e-6)
    assert fit["allreduce"]["Bps"] == pytest.approx(5e8, rel=1e-6)
    assert "a2a_uneven_weight" not in fit                     # no named uneven cases


def test_uneven_all_to_all_weight_is_fitted_and_applied():
    """Closed form: an uneven case on 4 ranks whose volumes are 1, 1, 1, 5 MB (mean 2, busiest
    5) and whose slowest rank took alpha + 2.9 MB / Bps sits 0.3 of the way from the mean to the
    busiest rank; the synchronised model then charges every rank alpha + 2.9 MB / Bps."""
    from planner.measure.tables.fit_comm import fit_comm_profile
    from planner.model.tables.comm_model import SyncCommModel
    alpha, bw = 1e-3, 1e9
    pts = [{"kind": "a2a", "name": f"a2a_even_{int(s)}", "rank": r, "sent_bytes": s,
            "received_bytes": s, "seconds": alpha + s / bw}
           for s in (1e4, 1e6, 4e6) for r in range(4)]
    vol = [1e6, 1e6, 1e6, 5e6]
    pts += [{"kind": "a2a", "name": "a2a_rows_0", "rank": r, "sent_bytes": v,
             "received_bytes": 1e6, "seconds": alpha + 2.9e6 / bw} for r, v in enumerate(vol)]
    fit = fit_comm_profile({4: pts})[4]
    assert fit["a2a_uneven_weight"] == pytest.approx(0.3, rel=1e-6)
    m = SyncCommModel(n=4, node_of=np.zeros(4, dtype=int), node_size=np.full(4, 4.0),
                      a2a_alpha_s=alpha, intra_Bps=bw, inter_Bps=math.inf,
                      uneven_weight=0.3)
    owned = np.array([1e6, 1e6, 1e6, 5e6]) / 3             # each rank's bytes to one peer
    # send_i = 3 owned_i; recv_i = total - owned_i: volumes [2.33, 2.33, 2.33, 5] MB
    v = np.maximum(3 * owned, owned.sum() - owned)
    expect = alpha + (v.mean() + 0.3 * (v.max() - v.mean())) / bw
    assert np.allclose(m.a2a_times(owned), expect)
    legacy = SyncCommModel(n=4, node_of=np.zeros(4, dtype=int), node_size=np.full(4, 4.0),
                           a2a_alpha_s=alpha, intra_Bps=bw, inter_Bps=math.inf)
    assert np.allclose(legacy.a2a_times(owned), alpha + v.max() / bw)   # the busiest rank's


# -- for real ----------------------------------------------------------------------------------

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


def test_plan_measure_and_measure_commands(tmp_path, capsys):
    """``plan --measure`` and ``measure`` run and report; ``--heap system`` keeps this test
    process's C heap as it is (``retain``, the default, would hold it for the whole run)."""
    pytest.importorskip("torch")
    from planner.cli.main import main
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n"
                   + "".join(f"t{i},{3000 * (i + 1)},{[8, 16, 32][i % 3]},{1 + i % 4}\n"
                             for i in range(6)))
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
