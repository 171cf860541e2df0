"""ECMP hashing (topology ``network: routing: ecmp``): deterministic, never faster than ideal
spreading, equal to it on single paths, and the k-flows-on-n-uplinks closed form."""

import numpy as np
import pytest
import simpy

from simulator.errors import SpecError
from simulator.hashing import hash64
from simulator.network import FlowNetwork, route
from simulator.topology import build_topology, load_topology

GB = 1e9


def _two_leaves(network: dict | None = None, *, over: float = 2.0) -> object:
    """16 one-GPU hosts, 8 under each of two leaves; each leaf's uplink bundle is 8 × 100 GB/s
    / ``over`` (4 ports of 100 GB/s at over=2); PCIe and NVLink far faster than the NIC."""
    doc = {"name": "two-leaves", "gpu": "a100-80gb", "nodes": 16,
           "node": {"gpus": 1, "nics": 1, "nic_bandwidth": "100 GB/s",
                    "pcie_bandwidth": "10000 GB/s"},
           "fabric": {"tiers": [{"name": "leaf", "size": 8, "uplink_oversubscription": over},
                                {"name": "spine"}]}}
    if network:
        doc["network"] = network
    return build_topology(doc, source="two-leaves")


def _makespan(topo, src, dst, nbytes=GB) -> float:
    env = simpy.Environment()
    net = FlowNetwork(env, topo)
    done = net.transfer(route(topo, src, dst), nbytes)
    env.run()
    assert done.triggered
    return env.now


def test_ecmp_is_deterministic_for_a_seed():
    src, dst = np.arange(8), np.arange(8, 16)
    a = route(_two_leaves({"routing": "ecmp", "hash_seed": 7}), src, dst)
    b = route(_two_leaves({"routing": "ecmp", "hash_seed": 7}), src, dst)
    for x, y in ((a.flow, b.flow), (a.link, b.link), (a.frac, b.frac)):
        assert np.array_equal(x, y)
    c = route(_two_leaves({"routing": "ecmp", "hash_seed": 8}), src, dst)
    assert not np.array_equal(a.link, c.link)          # another seed, another draw


def test_ecmp_leaves_the_ideal_links_and_graph_alone():
    ideal, ecmp = _two_leaves(), _two_leaves({"routing": "ecmp"})
    n = len(ideal.links)
    assert len(ecmp.links) > n                          # ports appended after the others
    assert ecmp.links.src[:n] == ideal.links.src
    assert np.array_equal(ecmp.links.bandwidth_Bps[:n], ideal.links.bandwidth_Bps)
    assert ecmp.graph.number_of_edges() == ideal.graph.number_of_edges()
    assert ideal.routing.mode == "ideal" and ecmp.routing.mode == "ecmp"


@pytest.mark.parametrize("seed", range(4))
def test_k_flows_on_n_uplinks_closed_form(seed):
    # 8 flows leaf 0 -> leaf 1 over 4 ports of 100 GB/s: the busiest port carries L flows,
    # they finish after L × size / 100 GB/s (up port j and down port j carry the same flows)
    topo = _two_leaves({"routing": "ecmp", "hash_seed": seed})
    src, dst = np.arange(8), np.arange(8, 16)
    j = hash64(seed, src, dst, 0, 0, 1) % np.uint64(4)
    load = np.bincount(j.astype(np.int64), minlength=4)
    rt = route(topo, src, dst)
    first = topo.hierarchy.port_first[1][0]
    ups = rt.link[(rt.link >= first) & (rt.link < first + 8) & ((rt.link - first) % 2 == 0)]
    assert np.array_equal(np.bincount((ups - first) // 2, minlength=4), load)
    assert _makespan(topo, src, dst) == pytest.approx(load.max() * GB / (100 * GB), rel=1e-9)


def test_ecmp_never_beats_ideal_spreading():
    ideal = _makespan(_two_leaves(), np.arange(8), np.arange(8, 16))
    assert ideal == pytest.approx(2 * GB / (100 * GB))    # 8 flows on 400 GB/s of uplinks
    perm = np.random.default_rng(0).permutation(16)
    t_ideal = _makespan(_two_leaves(), np.arange(16), perm)
    for seed in range(6):
        for qps in (1, 4):
            topo = _two_leaves({"routing": "ecmp", "hash_seed": seed, "qps": qps})
            assert _makespan(topo, np.arange(8), np.arange(8, 16)) >= ideal * (1 - 1e-9)
            assert _makespan(topo, np.arange(16), perm) >= t_ideal * (1 - 1e-9)


def test_more_queue_pairs_spread_better():
    src, dst = np.arange(8), np.arange(8, 16)
    t = {q: np.mean([_makespan(_two_leaves({"routing": "ecmp", "hash_seed": s, "qps": q}),
                               src, dst) for s in range(8)]) for q in (1, 16)}
    assert t[16] < t[1]


def test_one_path_equals_ideal():
    src, dst = np.arange(8), np.arange(8, 16)
    # a port as fast as the whole bundle: one uplink, nothing to hash over
    one = _two_leaves({"routing": "ecmp", "port_bandwidth": "10000 GB/s", "qps": 3})
    assert (one.hierarchy.port_count[1][one.hierarchy.port_count[1] > 0] == 1).all()
    assert _makespan(one, src, dst) == pytest.approx(_makespan(_two_leaves(), src, dst),
                                                     rel=1e-12)
    # a hand-written chain: one shortest path per pair
    devices = [{"id": "g0", "kind": "gpu"}, {"id": "g1", "kind": "gpu"},
               {"id": "s0", "kind": "switch"}, {"id": "s1", "kind": "switch"}]
    links = [{"a": "g0", "b": "s0", "bandwidth": 50e9, "latency": 1e-6, "kind": "nic"},
             {"a": "s0", "b": "s1", "bandwidth": 50e9, "latency": 1e-6, "kind": "fabric"},
             {"a": "s1", "b": "g1", "bandwidth": 50e9, "latency": 1e-6, "kind": "nic"}]
    doc = {"name": "chain", "gpu": "a100-80gb", "devices": devices, "links": links}
    chain_ecmp = build_topology({**doc, "network": {"routing": "ecmp", "qps": 2}})
    assert _makespan(chain_ecmp, [0], [1]) == pytest.approx(_makespan(build_topology(doc), [0],
                                                                      [1]))


def test_graph_ecmp_pins_a_flow_to_one_of_two_paths():
    # g0 -> g1 over two parallel switches: ideal splits the flow, one hashed QP takes one path
    devices = [{"id": "g0", "kind": "gpu"}, {"id": "g1", "kind": "gpu"},
               {"id": "a", "kind": "switch"}, {"id": "b", "kind": "switch"}]
    links = [{"a": "g0", "b": s, "bandwidth": 50e9, "latency": 1e-6, "kind": "fabric"}
             for s in ("a", "b")]
    links += [{"a": s, "b": "g1", "bandwidth": 50e9, "latency": 1e-6, "kind": "fabric"}
              for s in ("a", "b")]
    doc = {"name": "diamond", "gpu": "a100-80gb", "devices": devices, "links": links}
    assert _makespan(build_topology(doc), [0], [1]) == pytest.approx(GB / 100e9)
    hashed = build_topology({**doc, "network": {"routing": "ecmp", "hash_seed": 1}})
    assert _makespan(hashed, [0], [1]) == pytest.approx(GB / 50e9)
    assert np.array_equal(route(hashed, [0], [1]).link, route(hashed, [0], [1]).link)


def test_routing_option_parsing():
    topo = load_topology("selene-a100:nodes=40,network.routing=ecmp,network.qps=4,"
                         "network.hash_seed=9")
    assert (topo.routing.mode, topo.routing.qps, topo.routing.seed) == ("ecmp", 4, 9)
    assert topo.params["routing"]["qps"] == 4
    assert load_topology("selene-a100:nodes=40").routing.mode == "ideal"
    with pytest.raises(SpecError):
        load_topology("selene-a100:nodes=40,network.routing=random")
    with pytest.raises(SpecError):                       # qps means nothing without hashing
        load_topology("selene-a100:nodes=40,network.qps=4")


def test_ecmp_forces_explicit_flow_mode():
    env = simpy.Environment()
    net = FlowNetwork(env, _two_leaves({"routing": "ecmp"}), mode="symmetric")
    assert net.mode == "explicit"
    assert FlowNetwork(env, _two_leaves(), mode="symmetric").mode == "symmetric"
