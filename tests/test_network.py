"""Flow-level network: routing, max-min sharing, closed forms."""

import dataclasses

import numpy as np
import pytest
import simpy

from simulator.collectives import simulate_collective
from simulator.engine import simulate
from simulator.network import FlowNetwork, route
from simulator.network.maxmin import maxmin_rates as mm
from simulator.topology import build_topology, load_topology
from simulator.workload import Workload

GiB = 2**30


def _time_flows(topo, pairs, nbytes):
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    src, dst = zip(*pairs)
    done = net.transfer(route(topo, src, dst), nbytes)
    env.run()
    assert done.triggered
    return env.now


def test_maxmin_textbook_case():
    # links A (cap 1) and B (cap 2); f0 on A, f1 on A and B, f2 on B
    rates = mm(np.array([0, 1, 1, 2]), np.array([0, 0, 1, 1]), np.ones(4), np.array([1.0, 2.0]), 3)
    assert rates.tolist() == pytest.approx([0.5, 0.5, 1.5])


def test_one_flow_matches_alpha_beta(star8):
    # p2p through the engine: alpha 2 µs + 2 hops × 1 µs + S / 100 GB/s
    w = Workload()
    w.sendrecv(0, 1, GiB)
    res = simulate(star8, w)
    expected = 2e-6 + 2e-6 + GiB / 100e9
    assert res.step_time_s == pytest.approx(expected, rel=0.01)


def test_two_flows_sharing_a_link_get_half_each(star8):
    alone = _time_flows(star8, [(0, 2)], GiB)
    both = _time_flows(star8, [(0, 2), (1, 2)], GiB)
    assert alone == pytest.approx(GiB / 100e9, rel=1e-6)
    assert both == pytest.approx(2 * alone, rel=1e-6)


def test_flows_on_disjoint_links_do_not_interact(star8):
    assert _time_flows(star8, [(0, 1), (2, 3)], GiB) == pytest.approx(GiB / 100e9, rel=1e-6)


def test_rates_rebalance_when_a_flow_finishes(star8):
    # small and big flow into g2: the big one runs at half rate until the small one is done
    env = simpy.Environment()
    net = FlowNetwork(env, star8)
    net.transfer(route(star8, [0, 1], [2, 2]), np.array([GiB / 4, GiB]))
    env.run()
    # first 0.5 GiB moved at 2×50 GB/s, remaining 0.75 GiB of the big flow at 100 GB/s
    assert env.now == pytest.approx((GiB / 2) / 100e9 + (0.75 * GiB) / 100e9, rel=1e-9)


def test_ecmp_splits_over_equal_paths():
    devices = [{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "gpu"},
               {"id": "s1", "kind": "switch"}, {"id": "s2", "kind": "switch"},
               {"id": "l1", "kind": "switch"}, {"id": "l2", "kind": "switch"}]
    links = [{"a": "a", "b": "l1", "bandwidth": 400e9}, {"a": "b", "b": "l2", "bandwidth": 400e9},
             {"a": "l1", "b": "s1", "bandwidth": 100e9}, {"a": "l1", "b": "s2", "bandwidth": 100e9},
             {"a": "l2", "b": "s1", "bandwidth": 100e9}, {"a": "l2", "b": "s2", "bandwidth": 100e9}]
    t = build_topology({"name": "diamond", "gpu": "h100-sxm", "devices": devices, "links": links})
    r = route(t, [0], [1])
    assert sorted(r.frac.tolist()) == [0.5, 0.5, 0.5, 0.5, 1.0, 1.0]
    assert _time_flows(t, [(0, 1)], GiB) == pytest.approx(GiB / 200e9, rel=1e-9)


def test_tree_router_equals_graph_search_on_generated_fabric():
    t = load_topology("selene-a100:nodes=45")       # 3 leaf groups, rails, spine, core
    g = dataclasses.replace(t, hierarchy=None)       # same graph, routed by search
    rng = np.random.default_rng(0)
    src = rng.integers(0, t.num_gpus, 300)
    dst = rng.integers(0, t.num_gpus, 300)
    a, b = route(t, src, dst), route(g, src, dst)
    for i in range(300):
        la = sorted(a.link[a.flow == i].tolist())
        lb = sorted(b.link[b.flow == i].tolist())
        assert la == lb, (src[i], dst[i])
    assert np.allclose(a.latency_s, b.latency_s)


def test_oversubscribed_tier_slows_alltoall_by_expected_factor():
    def topo(x):
        return build_topology({
            "name": "ovs", "gpu": "h100-sxm", "nodes": 8,
            "node": {"gpus": 1, "nics": 1, "nic_bandwidth": "100 Gb/s", "pcie_bandwidth": "1 TB/s",
                     "nic_latency": 0, "pcie_latency": 0},
            "fabric": {"tiers": [{"name": "leaf", "size": 4, "uplink_oversubscription": x,
                                  "latency": 0}, {"name": "spine", "latency": 0}]},
            "collectives": {"alpha": {"default": 0}}})
    S = GiB
    base = simulate_collective(topo(1), "alltoall", range(8), S).time_s
    nic = 12.5e9
    assert base == pytest.approx((S / 8) / (nic / 7), rel=0.01)     # NIC-bound, 7 peers share it
    for x in (2, 4, 8):
        t = simulate_collective(topo(x), "alltoall", range(8), S).time_s
        # 16 cross-leaf flows of S/8 share the leaf uplink of 4 × 12.5 GB/s / x
        expected = max(base, 16 * (S / 8) / (4 * nic / x))
        assert t == pytest.approx(expected, rel=0.01)
        assert t / base == pytest.approx(expected / base, rel=0.01)
    assert simulate_collective(topo(8), "alltoall", range(8), S).time_s > 4 * base
