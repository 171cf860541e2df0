import networkx as nx
import pytest

from simulator.errors import SpecError
from simulator.topology import (build_topology, builtin_topology_names, load_topology,
                                sized_topology_ref)

REQUIRED = {"dgx-a100", "selene-a100", "dgx-h100", "h100-ib", "llama3-h100-24k",
            "two-buildings-h100", "four-buildings-h100", "localhost-gloo"}


def test_required_topologies_ship():
    assert REQUIRED <= set(builtin_topology_names())


@pytest.mark.parametrize("name", sorted(REQUIRED | {"pcie-a100"}))
def test_every_builtin_loads_and_is_consistent(name):
    t = load_topology(name)
    assert t.num_gpus == len(t.gpus) > 0
    assert (t.links.bandwidth_Bps > 0).all() and (t.links.latency_s >= 0).all()
    g = t.graph
    assert all(g.nodes[x]["kind"] in ("gpu", "cpu") for x in t.gpus)
    assert g.number_of_edges() == len(t.links)


def test_llama3_cluster_facts():
    t = load_topology("llama3-h100-24k")
    assert t.num_gpus == 24576 and t.num_nodes == 3072
    tiers = {x.name: x for x in t.tiers}
    assert tiers["tor"].units == 1536                       # 2 servers (16 GPUs) per rack
    assert tiers["pod"].units == 8                          # 8 pods of 3,072 GPUs
    assert tiers["pod"].oversubscription == pytest.approx(7.0)
    assert tiers["tor"].oversubscription == pytest.approx(1.0)
    # a pod's down capacity = 3,072 GPUs × 400 Gb/s
    assert tiers["pod"].down_Bps_per_unit == pytest.approx(3072 * 50e9)


def test_size_overrides_and_gpus():
    assert load_topology("selene-a100:nodes=192").num_gpus == 1536
    assert load_topology("selene-a100", overrides={"nodes": 4}).num_nodes == 4
    assert load_topology("h100-ib", gpus=1001).num_gpus == 1008          # rounded up to whole nodes
    t = load_topology("h100-ib:node.nic_bandwidth=200Gb/s,nodes=2")
    nic = [i for i, k in enumerate(t.links.kind) if k == "nic"]
    assert t.links.bandwidth_Bps[nic[0]] == pytest.approx(25e9)


def test_sized_reference_holds_the_gpus_and_keeps_explicit_sizes():
    import doctest
    import simulator.topology.build as build
    assert doctest.testmod(build).failed == 0
    for ref, gpus in (("dgx-h100", 64), ("dgx-a100:node.nic_bandwidth=200Gb/s", 20),
                      ("two-buildings-h100", 4100)):
        grown = sized_topology_ref(ref, gpus)
        assert load_topology(grown).num_gpus == load_topology(ref, gpus=gpus).num_gpus >= gpus
    assert sized_topology_ref("dgx-a100:node.nic_bandwidth=200Gb/s", 20).startswith(
        "dgx-a100:node.nic_bandwidth=200Gb/s,nodes=")
    assert sized_topology_ref("dgx-a100:nodes=2", 64) == "dgx-a100:nodes=2"   # the user's size
    assert sized_topology_ref("two-buildings-h100", 16) == "two-buildings-h100"  # holds them


def test_buildings_join_through_wan():
    t = load_topology("four-buildings-h100:nodes=4")
    assert t.num_gpus == 4 * 4 * 8
    wan = [i for i, k in enumerate(t.links.kind) if k == "wan"]
    assert len(wan) == 2 * 4                       # one bundle per building, both directions
    assert t.links.latency_s[wan[0]] == pytest.approx(0.5e-3)
    assert t.links.bandwidth_Bps[wan[0]] == pytest.approx(128 * 50e9)


def test_rail_optimised_leaves_keep_rails_apart():
    t = load_topology("h100-ib:nodes=4")
    g = t.graph
    # NIC r of every node hangs off leaf rail r
    for n in range(4):
        for r in range(8):
            (leaf,) = [v for v in g.successors(f"n{n}/nic{r}") if g.nodes[v]["kind"] == "switch"]
            assert leaf.endswith(f"rail{r}")


def _bad(doc, source="bad.yaml"):
    with pytest.raises(SpecError) as e:
        build_topology(doc, source=source)
    return str(e.value)


GOOD = {"name": "x", "gpu": "a100-80gb", "nodes": 2,
        "node": {"gpus": 8, "nics": 8, "nic_bandwidth": "200 Gb/s"},
        "fabric": {"tiers": [{"name": "leaf"}]}}


def test_unknown_gpu_kind():
    msg = _bad(GOOD | {"gpu": "h300"})
    assert "bad.yaml" in msg and "gpu" in msg and "h300" in msg and "fix:" in msg


def test_negative_bandwidth():
    msg = _bad(GOOD | {"node": GOOD["node"] | {"nic_bandwidth": "-5 Gb/s"}})
    assert "node.nic_bandwidth" in msg and "fix:" in msg


def test_nodes_without_fabric():
    msg = _bad({k: v for k, v in GOOD.items() if k != "fabric"})
    assert "fabric.tiers" in msg


def test_too_many_nodes_for_fabric():
    msg = _bad(GOOD | {"nodes": 50, "fabric": {"tiers": [{"name": "leaf", "size": 4},
                                                         {"name": "spine", "size": 2}]}})
    assert "nodes" in msg and "exceed" in msg


def test_unknown_field():
    msg = _bad(GOOD | {"nodez": 3})
    assert "nodez" in msg


def test_explicit_gpu_with_no_route():
    doc = {"name": "x", "gpu": "a100-80gb",
           "devices": [{"id": "a", "kind": "gpu"}, {"id": "b", "kind": "gpu"},
                       {"id": "c", "kind": "gpu"}, {"id": "sw", "kind": "switch"}],
           "links": [{"a": "a", "b": "sw", "bandwidth": "10 GB/s"},
                     {"a": "b", "b": "sw", "bandwidth": "10 GB/s"}]}
    msg = _bad(doc)
    assert "devices[2]" in msg and "'c'" in msg and "no route" in msg


def test_explicit_link_to_unknown_device():
    doc = {"name": "x", "gpu": "a100-80gb", "devices": [{"id": "a", "kind": "gpu"}],
           "links": [{"a": "a", "b": "zz", "bandwidth": "10 GB/s"}]}
    assert "links[0].b" in _bad(doc)


def test_yaml_syntax_error(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\nnode: {gpus: 8\n")
    with pytest.raises(SpecError) as e:
        load_topology(str(p))
    assert "broken.yaml" in str(e.value) and "line" in str(e.value)


def test_unknown_topology_name():
    with pytest.raises(SpecError) as e:
        load_topology("selene-z100")
    assert "selene-z100" in str(e.value) and "dgx-a100" in str(e.value)


def test_graph_is_networkx_and_connected():
    t = load_topology("selene-a100:nodes=40")
    assert isinstance(t.graph, nx.DiGraph)
    assert nx.is_strongly_connected(t.graph)
