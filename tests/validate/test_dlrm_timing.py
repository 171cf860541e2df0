"""DLRM timing model pieces (simulator side, no processes): the dense part op by op, TorchRec
host costs from probe plans (planner/measure/validate/calibrate_dlrm.py), the profile's torchrec key."""

from __future__ import annotations

import pytest

from planner.measure.validate.dlrm_ops import expected_ops
from planner.measure.validate.dlrm_probes import (PROBE_TYPES, SHARED_SLOPE_TYPES, host_costs,
                                                  probe_config, size_measure)
from planner.measure.validate.dlrm_report import _HOST_COSTS, predicted
from planner.model.tables.spec import DenseSpec
from planner.model.tables.dense import dense_op_list

BASE = {"format": "clusterplan.gloo-profile", "version": 1, "shared_core": True,
        "comm": {f"{k}@2": [[4.0, 3e-4], [1048576.0, 1e-3], [16777216.0, 1e-2]]
                 for k in ("allreduce", "allgather", "reducescatter", "alltoall")},
        "wake_penalty_s": [[1e-4, 2e-4], [5e-3, 2e-3]],
        "compute": {"peak_fp32_flops": 8e10, "memory_bandwidth_Bps": 8e10,
                    "launch_overhead_s": 2e-6, "matmul_fp32": [[1e5, 0.2], [1e9, 0.9]],
                    "memory": [[4096.0, 0.5], [6.7e7, 0.9]]},
        "host_block_s": {"forward": 1e-4, "backward": 1e-4}}


def test_dense_ops_count_the_spec_flops():
    d = DenseSpec(num_dense_features=13, bottom_mlp=(128, 64), top_mlp=(128, 64, 1),
                  interaction="dcnv2", dcn_layers=1, dcn_projection=32)
    dims = [64, 32, 16]
    ops = dense_op_list(d, dims, 1024)
    ls = d.layers(dims)
    fwd = sum(op.flops for op in ops if op.phase == "fwd")
    want = sum(2 * 1024 * i * o for i, o in ls["bottom"] + ls["interaction"] + ls["top"])
    assert fwd == pytest.approx(want)
    # backward: dW everywhere, dX everywhere but the bottom MLP's first layer (no input grad)
    bwd = sum(op.flops for op in ops if op.phase == "bwd")
    assert bwd == pytest.approx(2 * want - 2 * 1024 * 13 * 128)
    assert all(op.bytes > 0 for op in ops)
    assert all(0 <= op.out_bytes <= op.bytes for op in ops)
    assert dense_op_list(None, dims, 1024) == []


def _probe_calibration(extra_s):
    """A 2-process calibration whose probes measure the bare model's probe step plus
    ``extra_s[kind, size]`` seconds of host work, and the probe simulator the host fit uses."""
    from simulator.gloo_profile import gloo_profile_from_dict
    sim = {}
    bare = gloo_profile_from_dict(BASE)
    for kind in PROBE_TYPES:
        for size in ("small", "large"):
            cfg = probe_config(kind, size, 2)
            sim[(kind, size)] = predicted(cfg, cfg.warmup, bare)["step_time_s"]
    probes = [{"sharding_type": k, "size": s, "step_s": t + extra_s[k, s], "spread": 0.1}
              for (k, s), t in sim.items()]
    cal = gloo_profile_from_dict({**BASE, "torchrec": {"world": 2, "probes": probes}})

    def run(cfg, host):
        from simulator.engine import simulate

        from planner.measure.tables.plans import cpu_topology_ref
        from planner.model.tables.task import ShardingTask, prepare
        from planner.workloads.dlrm.torchrec import build_torchrec_step_workload
        problem = prepare(ShardingTask(model=cfg.model, topology=cpu_topology_ref(2)), 2)
        w = build_torchrec_step_workload(problem, cfg.shardings, expected_ops(cfg, cfg.warmup),
                                         compute=cal.compute, host_s=host)
        return simulate(problem.topology, w, compute=cal.compute,
                        measured_comm=cal).step_time_s
    return cal, sim, run


def _sizes(kind, size):
    cfg = probe_config(kind, size, 2)
    return cfg, [size_measure(kind, cfg, expected_ops(cfg, cfg.warmup), r) for r in range(2)]


def test_probe_host_costs_reproduce_the_probes():
    # measured = simulated + 2 ms (small) / + 6 ms (large): a host line the model must recover
    extra = {(k, s): 0.002 if s == "small" else 0.006 for k in PROBE_TYPES
             for s in ("small", "large")}
    cal, sim, run = _probe_calibration(extra)
    assert cal.torchrec["world"] == 2
    hc = host_costs(cal, 2, run)
    assert set(hc) == set(PROBE_TYPES)
    for kind, (a, b) in hc.items():
        assert a >= 0 and b >= 0
        for size in ("small", "large"):
            cfg, xs = _sizes(kind, size)
            got = run(cfg, [a + b * x for x in xs])
            assert got == pytest.approx(sim[(kind, size)] + extra[kind, size], rel=0.1,
                                        abs=5e-4)
    assert host_costs(cal, 4, run) == {}            # probes of another world size: unused
    _HOST_COSTS.clear()
    p = predicted(probe_config("table_wise", "large", 2), 5, cal)
    assert p["per_kind"]["torchrec_host"] > 0


def test_the_all_to_all_types_share_one_host_slope():
    """Table-, column- and row-wise probes whose residuals grow differently (6, 2 and 4 ms
    from small to large) get one slope and an intercept each: every small probe is met, the
    large probes' step errors are the least-squares ones (they cancel weighted by each pair's
    size difference, the fastest-growing type under-predicted, the slowest over-predicted),
    and data-parallel keeps its own line through both its probes."""
    grow = {"table_wise": 0.006, "column_wise": 0.002, "row_wise": 0.004, "data_parallel": 0.01}
    extra = {(k, s): 0.002 + (grow[k] if s == "large" else 0.0) for k in PROBE_TYPES
             for s in ("small", "large")}
    cal, sim, run = _probe_calibration(extra)
    hc = host_costs(cal, 2, run)
    assert len({hc[k][1] for k in SHARED_SLOPE_TYPES}) == 1
    err = {}
    for kind, (a, slope) in hc.items():
        for size in ("small", "large"):
            cfg, xs = _sizes(kind, size)
            err[kind, size] = run(cfg, [a + slope * x for x in xs]) - sim[kind, size] \
                - extra[kind, size]
        assert err[kind, "small"] == pytest.approx(0.0, abs=5e-4)
    assert err["data_parallel", "large"] == pytest.approx(0.0, abs=5e-4)
    dx = {k: max(_sizes(k, "large")[1]) - max(_sizes(k, "small")[1]) for k in SHARED_SLOPE_TYPES}
    weighted = [dx[k] * err[k, "large"] for k in SHARED_SLOPE_TYPES]
    assert abs(sum(weighted)) < 0.05 * sum(abs(w) for w in weighted)
    assert err["table_wise", "large"] < -1e-3 and err["column_wise", "large"] > 1e-3


def test_without_a_dense_part_the_step_runs_the_workers_loss():
    """A spec with no dense part still runs the validation worker's loss (a product and a sum
    per table forward, the product's gradient backward): the simulated step's MLP time is those
    ops on the memory curve, nothing for the planner's own no-dense step (no profile)."""
    from simulator.compute import op_time
    from simulator.gloo_profile import gloo_profile_from_dict

    from planner.model.tables.dense import weighted_sum_loss_ops
    cal = gloo_profile_from_dict(BASE)
    cfg = probe_config("table_wise", "large", 2)
    dims = [t.embedding_dim for t in cfg.model.tables]
    b = cfg.model.batch_size / 2
    ops = weighted_sum_loss_ops(dims, b)
    assert len(ops) == 3 * len(dims)
    e = 4.0 * b * sum(dims)
    assert sum(op.bytes for op in ops if op.phase == "fwd") == pytest.approx(4 * e)
    assert sum(op.bytes for op in ops if op.phase == "bwd") == pytest.approx(2 * e)
    assert sum(op.out_bytes for op in ops) == pytest.approx(2 * e)
    pk = predicted(cfg, cfg.warmup, cal)["per_kind"]
    for phase, walked in (("fwd", 4 * e), ("bwd", 2 * e)):
        # each table's slice is read where the pass over every table leaves it: in DRAM
        want = sum(op_time(cal.compute, flops=0.0, bytes_moved=op.bytes, working_set=walked)
                   for op in ops if op.phase == phase)
        assert pk[f"mlp_{phase}"] == pytest.approx(want, rel=1e-9)
        hot = sum(op_time(cal.compute, flops=0.0, bytes_moved=op.bytes) for op in ops
                  if op.phase == phase)
        assert want != pytest.approx(hot)
    assert predicted(cfg, cfg.warmup, None)["per_kind"]["mlp_fwd"] == 0.0
