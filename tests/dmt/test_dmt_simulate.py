"""SPTT vs the flat step in the simulator: bytes, structure, module compression."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.errors import SpecError

from planner.dmt.compare import compare_flat_dmt
from planner.dmt.partition import partition_layout
from planner.dmt.towers import shard_hosts
from planner.model.dmt.layout import make_layout
from planner.model.dmt.module import TowerModuleSpec
from planner.model.tables.shards import ShardingType
from planner.workloads.dmt.sptt import build_sptt_workload, top_input_dims


def test_identity_towers_move_the_same_cross_host_bytes(task16):
    # table-wise only: a column split re-sends its table's ids to every part's owner
    tw = replace(task16, sharding_types=(ShardingType.TABLE_WISE,))
    cmp = compare_flat_dmt(tw, 16, module=TowerModuleSpec())
    assert cmp.flat.step_time_s > 0 and cmp.dmt.step_time_s > 0
    # SPTT only reroutes: every id and pooled value that crossed hosts still crosses once
    assert cmp.dmt.bytes["cross_host"] == pytest.approx(cmp.flat_cross_host_bytes, rel=1e-9)
    assert cmp.dmt.bytes["tm_params"] == 0
    assert cmp.dmt.breakdown_s["tm_fwd"] == 0


def test_module_divides_pooled_cross_host_bytes(task16):
    ident = compare_flat_dmt(task16, 16, module=TowerModuleSpec())
    lin = compare_flat_dmt(task16, 16, module=TowerModuleSpec(kind="linear", ratio=4))
    assert lin.dmt.bytes["ids_cross"] == ident.dmt.bytes["ids_cross"]   # ids are not compressible
    r = ident.dmt.bytes["pooled_cross_fwd"] / lin.dmt.bytes["pooled_cross_fwd"]
    assert 3.5 < r <= 4.0
    assert lin.dmt.breakdown_s["tm_fwd"] > 0 and lin.dmt.breakdown_s["tm_allreduce"] > 0
    assert lin.dmt.step_time_s < ident.dmt.step_time_s


def test_workload_structure_two_hosts(task16):
    part = partition_layout(task16, 16, towers=2, module=TowerModuleSpec())
    hps = shard_hosts(task16, part.layout)
    w, _ = build_sptt_workload(task16, 16, part.layout, hps)
    cross = [op for op in w.ops if op.category == "a2a_cross"]
    intra = [op for op in w.ops if op.category == "a2a_intra"]
    # 3 cross-host exchanges (ids, pooled fwd, pooled bwd) × 8 local indices, each over 2 hosts
    assert len(cross) == 24 and all(len(op.ranks) == 2 for op in cross)
    assert {op.ranks for op in cross if op.name.startswith("ids_cross")} == {
        (g, 8 + g) for g in range(8)}
    # 3 intra-host exchanges (ids, pooled fwd, pooled bwd) × 2 hosts, each over 8 GPUs
    assert len(intra) == 6 and all(len(op.ranks) == 8 for op in intra)
    lookups = [op for op in w.ops if op.name == "lookups_fwd"]
    assert len(lookups) == 16


def test_one_host_has_no_cross_host_exchange(make_task):
    task = make_task(16, topology="dgx-h100:nodes=1")
    cmp = compare_flat_dmt(task, 8, module=TowerModuleSpec())
    assert cmp.dmt.bytes["cross_host"] == 0
    assert cmp.layout.hosts == 1 and len(cmp.layout.towers) == 1
    assert cmp.speedup == pytest.approx(1.0, abs=0.1)


def test_top_input_dims_dot_and_identity(task16):
    part = partition_layout(task16, 16, towers=2, module=TowerModuleSpec(kind="linear", ratio=4))
    dims = top_input_dims(task16.model, part.layout)
    assert all(d == 32 for d in dims)
    assert len(dims) == sum(-(-tw.out_width // 32) for tw in part.layout.towers)
    ident = partition_layout(task16, 16, towers=2).layout
    assert top_input_dims(task16.model, ident) == [32] * 32


def test_module_spec_checks():
    assert TowerModuleSpec(kind="linear", ratio=16).out_width([64]) == 4
    assert TowerModuleSpec(kind="mlp", ratio=2).param_count([64]) == 64 * 32 + 32 + 32 * 32 + 32
    mix = TowerModuleSpec(kind="mix", ratio=4)
    assert mix.out_width([16] * 9) == 3 * 16 and mix.param_count([16] * 9) == 27
    with pytest.raises(SpecError):
        mix.check([16, 32])
    with pytest.raises(SpecError):
        TowerModuleSpec(kind="conv")
    with pytest.raises(SpecError):
        TowerModuleSpec(kind="linear", ratio=0.5)


def test_layout_rejects_overlap_and_missing(task16):
    m = task16.model
    with pytest.raises(SpecError):
        make_layout(m, [[0, 1], [1, 2]], [0, 1], hosts=2, gpus_per_host=8,
                    module=TowerModuleSpec())
    with pytest.raises(SpecError):
        make_layout(m, [[0], [1]], [0, 1], hosts=2, gpus_per_host=8, module=TowerModuleSpec())


@pytest.mark.parametrize("name", ["planner.model.dmt.module", "planner.dmt.compare"])
def test_doctests(name):
    import doctest
    import importlib
    res = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_pairwise_all_to_all_charges_per_peer_latency(task16):
    from planner.model.tables.task import prepare
    from planner.sharding.planners import get_planner
    from planner.workloads.dmt.step import simulate_flat, simulate_sptt, with_a2a_algo
    part = partition_layout(task16, 16, towers=2)
    hps = shard_hosts(task16, part.layout)
    w, _ = build_sptt_workload(task16, 16, part.layout, hps)
    pw = with_a2a_algo(w, "pairwise")
    assert {op.algo for op in pw.ops if op.collective == "alltoall"} == {"pairwise"}
    assert with_a2a_algo(w, "direct") is w
    direct = simulate_sptt(task16, 16, part.layout, hps)
    pair = simulate_sptt(task16, 16, part.layout, hps, a2a_algo="pairwise")
    assert pair.step_time_s > direct.step_time_s
    problem = prepare(task16, 16)
    plan = get_planner("greedy").plan(task16, 16)
    assert simulate_flat(problem, plan.shardings, a2a_algo="pairwise").step_time_s > \
        simulate_flat(problem, plan.shardings).step_time_s


def test_two_towers_per_host(task16):
    """k towers per host: every table once, towers of a host share its exchanges."""
    mod = TowerModuleSpec(kind="mix", ratio=4)
    part = partition_layout(task16, 16, towers=4, module=mod)
    assert sorted(tw.host for tw in part.layout.towers) == [0, 0, 1, 1]
    hps = shard_hosts(task16, part.layout)
    for h in range(2):
        assert sorted(hps[h].tables) == sorted(part.layout.host_tables(h))
    cmp = compare_flat_dmt(task16, 16, layout=part.layout)
    # the module output per host is the sum of its towers' outputs
    w = {h: sum(tw.out_width for tw in part.layout.host_towers(h)) for h in range(2)}
    b = task16.model.batch_size / 16
    assert cmp.dmt.bytes["pooled_cross_fwd"] == pytest.approx(8 * b * 4 * (w[0] + w[1]))
