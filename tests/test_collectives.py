"""Collectives as flows: closed forms, NCCL conventions, calibration, symmetric mode."""

import numpy as np
import pytest

from simulator.collectives import plan_collective, simulate_collective
from simulator.collectives.algorithms import _depth, dbt_parents
from simulator.errors import SpecError
from simulator.topology import build_topology, load_topology

from planner.measure.network.fit import _predict, fit_collective_profile, read_nccl_table

GiB = 2**30


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("kind,mult,steps", [("allreduce", 2, 2), ("allgather", 1, 1),
                                             ("reducescatter", 1, 1)])
def test_ring_matches_alpha_beta(star8, n, kind, mult, steps):
    # alpha 2 µs per step, 2 hops × 1 µs, 100 GB/s per direction, no local pass
    t = simulate_collective(star8, kind, range(n), GiB, algo="ring").time_s
    expected = steps * (n - 1) * (2e-6 + 2e-6) + mult * (n - 1) / n * GiB / 100e9
    assert t == pytest.approx(expected, rel=0.01)


def _nodes_topo(n_nodes, alpha=3e-6):
    return build_topology({
        "name": "nodes", "gpu": "h100-sxm", "nodes": n_nodes,
        "node": {"gpus": 1, "nics": 1, "nic_bandwidth": "400 Gb/s", "pcie_bandwidth": "1 TB/s",
                 "nic_latency": "1 us", "pcie_latency": 0},
        "fabric": {"tiers": [{"name": "leaf", "latency": 0}]},
        "collectives": {"alpha": {"default": alpha}}})


@pytest.mark.parametrize("m", [2, 5, 8, 16, 33])
def test_tree_matches_alpha_beta(m):
    topo = _nodes_topo(m)
    t = simulate_collective(topo, "allreduce", range(m), GiB, algo="tree").time_s
    pa, pb = dbt_parents(m)
    deg = np.zeros(m)
    for par in (pa, pb):
        for i, p in enumerate(par):
            if p >= 0:
                deg[i] += 1
                deg[p] += 1
    assert deg.max() <= 4          # every rank moves at most 2 S: ring bandwidth at log latency
    path = 2 * 1e-6                 # NIC latency out and in
    expected = 2 * _depth(pa) * (3e-6 + path) + deg.max() * (GiB / 2) / 50e9
    assert t == pytest.approx(expected, rel=0.01)


def test_multinode_ring_uses_every_rail():
    topo = load_topology("h100-ib:nodes=4")
    plan = plan_collective(topo, "allreduce", range(32), GiB, algo="ring")
    assert plan.channels == 8
    r = simulate_collective(topo, "allreduce", range(32), GiB, algo="ring")
    # 8 × 400 Gb/s × 0.94 = 376 GB/s per node; the ring is NIC-bound
    assert 0.85 * 376e9 < r.busbw_Bps < 376e9


def test_tree_beats_ring_latency_on_many_nodes_small_messages():
    topo = load_topology("h100-ib:nodes=128")
    small = 64 * 1024
    ring = simulate_collective(topo, "allreduce", range(1024), small, algo="ring").time_s
    tree = simulate_collective(topo, "allreduce", range(1024), small, algo="tree").time_s
    assert tree < ring / 10
    # NCCL's tuner: tree (or NVLSTree where the node switch reduces) for small messages at scale
    assert plan_collective(topo, "allreduce", range(1024), small).algorithm == "hier:nvls+tree"
    selene = load_topology("selene-a100:nodes=128")
    assert plan_collective(selene, "allreduce", range(1024), small).algorithm == "tree"


def test_per_tier_algorithms():
    topo = load_topology("h100-ib:nodes=4")
    stages = {}
    for algo in ("hierarchical", "nvls_tree", "hier:nvls+ring", "hier:ring+tree"):
        plan = plan_collective(topo, "allreduce", range(32), GiB, algo=algo)
        assert len(plan.phases) == 1                     # tiers pipelined as NCCL does
        stages[algo] = simulate_collective(topo, "allreduce", range(32), GiB, algo=algo).time_s
    # pipelining: the whole is no slower than its slowest stage run alone plus all latencies
    inter = simulate_collective(topo, "allreduce", list(range(0, 32, 8)), GiB / 8).time_s
    assert stages["hierarchical"] >= inter
    for bad in ("hier:ring", "hier:tree+ring", "hier:ring+nvls"):
        with pytest.raises(SpecError):
            plan_collective(topo, "allreduce", range(32), GiB, algo=bad)


def test_auto_picks_nvls_inside_h100_node():
    topo = load_topology("dgx-h100")
    r = simulate_collective(topo, "allreduce", range(8), GiB)
    assert r.algorithm == "nvls"
    assert r.busbw_Bps == pytest.approx(480e9, rel=0.05)       # nccl-tests anchor
    ring = simulate_collective(topo, "allreduce", range(8), GiB, algo="ring")
    assert ring.busbw_Bps == pytest.approx(370e9, rel=0.05)     # nccl-tests anchor


def test_hierarchical_and_halving_doubling_run():
    topo = load_topology("dgx-a100:nodes=4")
    for algo in ("hierarchical", "halving_doubling"):
        r = simulate_collective(topo, "allreduce", range(32), GiB, algo=algo)
        assert r.time_s > 0 and r.algorithm == algo
    with pytest.raises(SpecError):
        plan_collective(topo, "allreduce", range(12), GiB, algo="halving_doubling")


def test_alltoall_uneven_splits(star8):
    splits = np.zeros((4, 4))
    splits[0, 1] = GiB
    splits[2, 3] = GiB / 4
    t = simulate_collective(star8, "alltoall", range(4), 0, splits=splits).time_s
    assert t == pytest.approx(2e-6 + 2e-6 + GiB / 100e9, rel=0.01)
    pw = simulate_collective(star8, "alltoall", range(4), 0, algo="pairwise", splits=splits)
    assert pw.time_s == pytest.approx(3 * 4e-6 + GiB / 100e9, rel=0.01)


def test_bad_algorithm_for_kind():
    topo = load_topology("dgx-a100")
    with pytest.raises(SpecError) as e:
        plan_collective(topo, "alltoall", range(8), GiB, algo="ring")
    assert "direct" in str(e.value)


CASES = [("h100-ib:nodes=8", 64), ("h100-ib:nodes=32", 256), ("h100-ib:nodes=128", 1024),
         ("llama3-h100-24k:nodes=128", 1024), ("two-buildings-h100:nodes=32", 512)]


@pytest.mark.parametrize("topo_ref,n", CASES)
@pytest.mark.parametrize("kind,algo", [("allreduce", "ring"), ("allreduce", "tree"),
                                       ("allgather", "ring"), ("alltoall", "direct")])
def test_symmetric_agrees_with_explicit(topo_ref, n, kind, algo):
    topo = load_topology(topo_ref)
    size = 256 * 2**20
    ex = simulate_collective(topo, kind, range(n), size, algo=algo, mode="explicit").time_s
    sy = simulate_collective(topo, kind, range(n), size, algo=algo, mode="symmetric").time_s
    assert sy == pytest.approx(ex, rel=0.02)


def test_symmetric_agrees_on_strided_groups():
    topo = load_topology("h100-ib:nodes=32")
    dp = list(range(3, 256, 8))           # one GPU per node, a data-parallel group
    for kind in ("allreduce", "alltoall"):
        ex = simulate_collective(topo, kind, dp, GiB, mode="explicit").time_s
        sy = simulate_collective(topo, kind, dp, GiB, mode="symmetric").time_s
        assert sy == pytest.approx(ex, rel=0.02)


def test_vtrain_8gpu_table_reproduced_after_calibration(vtrain_table):
    """Shipped dgx-a100 parameters (fitted on 16 sizes ≥ 8 MiB) vs every row ≥ 64 MiB."""
    path = vtrain_table(8)
    topo = load_topology("dgx-a100")
    df = read_nccl_table(path).assign(ranks=8)
    big = df[df.size_bytes >= 64 * 2**20]
    pred = _predict(topo, "allreduce", "ring", big)
    err = pred / big.time_s.to_numpy() - 1
    assert np.abs(err).max() < 0.10
    assert np.abs(err).mean() < 0.05


def test_calibration_fit_recovers_shipped_parameters(vtrain_table):
    path = vtrain_table(8)
    topo = load_topology("dgx-a100")
    fit = fit_collective_profile(topo, read_nccl_table(path).assign(ranks=8))
    assert fit.alpha_s == pytest.approx(topo.comm.alpha("ring"), rel=0.05)
    assert fit.efficiency == pytest.approx(topo.comm.efficiency["nvlink"], rel=0.02)
    assert fit.mape(min_bytes=64 * 2**20) < 0.05


def test_auto_rates_tree_as_nccls_tuner_on_two_nodes():
    # on 2 nodes a tree moves less inter-node data than a ring (busbw above the NIC line rate),
    # which NCCL's tuner does not model: it runs ring for bandwidth-bound sizes, tree for tiny
    topo = load_topology("dgx-a100:nodes=2,node.nic_bandwidth=100Gb/s")
    big = simulate_collective(topo, "allreduce", range(16), 48 * 2**20)
    assert big.algorithm == "ring" and big.busbw_Bps < 8 * 12.5e9
    tree = simulate_collective(topo, "allreduce", range(16), 48 * 2**20, algo="tree")
    assert tree.busbw_Bps > 8 * 12.5e9           # faster in flows, yet not NCCL's choice
    assert plan_collective(topo, "allreduce", range(16), 64 * 1024).algorithm == "tree"
