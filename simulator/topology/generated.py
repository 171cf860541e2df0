"""The graph of a generated topology: every host's GPUs, switch and NICs, the switching tiers
above them (one leaf per rail when rail-optimised), a wide-area level joining the buildings and,
under ECMP routing, every bundle again as its ports; and the :class:`Hierarchy` routes are found
in. Nothing lists 100k links by hand: :func:`build_generated` builds them from the sections
:mod:`simulator.topology.generated_spec` reads. Bandwidths are bytes/s, latencies seconds.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.hardware import GPUSpec
from simulator.topology.generated_spec import (
    MAX_GPUS,
    Buildings,
    NodeSpec,
    read_fabric,
    size_top_tier,
)
from simulator.topology.model import CommProfile, Hierarchy, LinkTable, Routing, Tier, Topology
from simulator.validation import Fields

__all__ = ["build_generated"]

def build_generated(f: Fields, *, gpu: GPUSpec, comm: CommProfile,
                     routing: Routing | None = None) -> Topology:
    """Build a generated topology: ``nodes`` hosts per building from ``node:``, joined by the
    switching tiers of ``fabric:``, and the buildings of ``buildings:`` by a wide-area level;
    under ECMP routing each bundle above the NICs also as its separate ports."""
    routing = routing or Routing()
    nodes = f.int("nodes", 1, minimum=1, maximum=MAX_GPUS)
    node = NodeSpec(f, nodes, gpu)
    rail_opt, tiers = read_fabric(f, node, nodes)
    bld = Buildings(f, nodes * node.gpus, tiers)
    if tiers:
        size_top_tier(f, nodes, tiers)

    links = _Links()
    devices: dict[str, dict] = {}
    hosts = _add_hosts(links, devices, node, nodes, bld.count, gpu)
    levels = _add_fabric(links, devices, node, nodes, bld, rail_opt, tiers)
    ports = _add_ports(links, levels, routing.port_Bps or node.nic_Bps) if routing.ecmp \
        else None

    hier = _hierarchy(node, nodes, bld.count, hosts, levels, ports)
    params = {"nodes": nodes, "gpus_per_node": node.gpus, "nics_per_node": node.nics,
              "buildings": bld.count, "rail_optimized": rail_opt,
              "host_memory_bytes": node.host_memory, "host_links": node.host_links,
              "pcie_Bps": node.pcie_Bps}
    if routing.ecmp:
        params["routing"] = routing.to_dict()
    if bld.count > 1:
        params.update(wan_link_Bps=bld.bandwidth_Bps, wan_goodput_Bps=bld.goodput_Bps,
                      wan_loss_rate=bld.loss_rate)
    return Topology(name=f.str("name", "unnamed"), source=f.source, gpu=gpu, devices=devices,
                    gpus=tuple(hosts.gpus), links=links.table(), comm=comm,
                    tiers=tuple(levels.tiers), hierarchy=hier, params=params,
                    description=f.str("description", "") or "", routing=routing)


class _Links:
    """Accumulates directed links; ``pair`` adds both directions and returns (a→b, b→a) ids."""

    def __init__(self) -> None:
        self.src: list[str] = []
        self.dst: list[str] = []
        self.bw: list[float] = []
        self.lat: list[float] = []
        self.kind: list[str] = []
        self.count: list[int] = []
        self.tier: list[str] = []

    def pair(self, a: str, b: str, bw: float, lat: float, kind: str, *, count: int = 1,
             tier: str = "") -> tuple[int, int]:
        i = len(self.src)
        for s, d in ((a, b), (b, a)):
            self.src.append(s)
            self.dst.append(d)
            self.bw.append(bw)
            self.lat.append(lat)
            self.kind.append(kind)
            self.count.append(count)
            self.tier.append(tier)
        return i, i + 1

    def table(self) -> LinkTable:
        return LinkTable(tuple(self.src), tuple(self.dst), np.asarray(self.bw, dtype=float),
                         np.asarray(self.lat, dtype=float), tuple(self.kind),
                         np.asarray(self.count, dtype=np.int64), tuple(self.tier))


def _building_prefix(b: int, buildings: int) -> str:
    """Device-name prefix of building ``b``: ``b3/`` when there are several, else empty."""
    return f"b{b}/" if buildings > 1 else ""


class _HostLinks:
    """What :func:`_add_hosts` built: GPU names by rank, each node's switch, and per GPU the
    link ids of its switch link and of its PCIe link to its NIC (-1: none), both directions."""

    __slots__ = ("gpus", "node_switch", "gpu_up", "gpu_down", "gpu_nic_up", "gpu_nic_down",
                 "rail_of_local")

    def __init__(self, n_gpus: int, rail_of_local: np.ndarray) -> None:
        self.gpus: list[str] = []
        self.node_switch: list[str] = []
        self.gpu_up = np.empty(n_gpus, dtype=np.int64)
        self.gpu_down = np.empty_like(self.gpu_up)
        self.gpu_nic_up = np.full_like(self.gpu_up, -1)
        self.gpu_nic_down = np.full_like(self.gpu_up, -1)
        self.rail_of_local = rail_of_local


def _add_hosts(links: _Links, devices: dict, node: NodeSpec, nodes: int, buildings: int,
               gpu: GPUSpec) -> _HostLinks:
    """Add every host's switch, GPUs and NICs to ``devices`` and their links to ``links``."""
    G, R, inter = node.gpus, node.nics, node.interconnect
    n_total = nodes * buildings
    rail_of_local = (np.arange(G) * R // G) if R else np.zeros(G, dtype=int)
    out = _HostLinks(n_total * G, rail_of_local)
    sw_kind = {"nvswitch": "nvswitch", "pcie": "pcie_switch", "loopback": "cpu"}[inter]
    for n in range(n_total):
        b, nl = divmod(n, nodes)
        host = f"{_building_prefix(b, buildings)}n{nl}"
        sw = f"{host}/{'nvswitch' if inter == 'nvswitch' else 'pcie' if inter == 'pcie' else 'cpu'}"
        devices[sw] = {"kind": sw_kind, "node": n, "building": b, "reduces": node.reduces}
        out.node_switch.append(sw)
        for l in range(G):
            g = n * G + l
            gid = f"{host}/gpu{l}"
            devices[gid] = {"kind": "gpu" if gpu.name != "cpu" else "cpu", "node": n,
                            "building": b, "local": l, "rank": g}
            out.gpus.append(gid)
            out.gpu_up[g], out.gpu_down[g] = links.pair(gid, sw, node.intra_Bps,
                                                        node.intra_latency_s, node.intra_kind,
                                                        tier="node")
        for r in range(R):
            nid = f"{host}/nic{r}"
            devices[nid] = {"kind": "nic", "node": n, "building": b, "rail": r}
        for l in range(G):
            if R:
                g = n * G + l
                out.gpu_nic_up[g], out.gpu_nic_down[g] = links.pair(
                    out.gpus[g], f"{host}/nic{rail_of_local[l]}", node.pcie_Bps,
                    node.pcie_latency_s, "pcie", tier="node")
    return out


class _Levels:
    """Switching levels, level 0 = NICs, level 1 = leaf switches (one per rail when rail-
    optimised), level k+1 = tier k, and a last "wan" level joining buildings. Per level: the
    unit of each node, the rail multiplier, each unit's up and down link ids and the name; and
    a :class:`Tier` summary per level above the NICs."""

    __slots__ = ("node_unit", "rail_mult", "up", "down", "names", "tiers")

    def __init__(self, n_total: int, nics: int, nic_up: np.ndarray, nic_down: np.ndarray) -> None:
        self.node_unit: list[np.ndarray] = [np.arange(n_total)]
        self.rail_mult: list[int] = [max(nics, 1)]
        self.up: list[np.ndarray] = [nic_up]
        self.down: list[np.ndarray] = [nic_down]
        self.names = ["nic"]
        self.tiers: list[Tier] = []


def _add_fabric(links: _Links, devices: dict, node: NodeSpec, nodes: int, bld: Buildings,
                rail_opt: bool, tiers: list[dict]) -> _Levels:
    """Add the switches above the NICs and their links; the levels they form."""
    R, B = node.nics, bld.count
    n_total = nodes * B
    nic_up = np.full(n_total * max(R, 1), -1, dtype=np.int64)
    nic_down = np.full_like(nic_up, -1)
    levels = _Levels(n_total, R, nic_up, nic_down)
    if not (tiers and R):
        return levels
    bld_of = np.arange(n_total) // nodes
    nib = np.arange(n_total) % nodes
    div, ub, tier_unit = 1, [], []
    for t in tiers:
        div *= t["size"]
        ub.append(math.ceil(nodes / div))
        tier_unit.append(bld_of * ub[-1] + nib // div)
    child_names, child_cap, rails = _add_leaves(links, devices, node, nodes, B, rail_opt,
                                                tiers[0], ub[0], tier_unit[0], nic_up, nic_down)
    levels.node_unit.append(tier_unit[0])
    levels.rail_mult.append(R if rail_opt else 0)
    levels.names.append(tiers[0]["name"])
    # the tier unit (per building numbering) of each child device
    child_unit = np.repeat(np.arange(B * ub[0]), rails)
    for k in range(1, len(tiers) + (1 if B > 1 else 0)):
        below = tiers[k - 1]
        if k < len(tiers):
            t = tiers[k]
            parent = (child_unit // ub[k - 1]) * ub[k] + (child_unit % ub[k - 1]) // t["size"]
            parent_names = _add_tier_switches(devices, t, ub[k], B)
            caps = child_cap / below["over"]
            lat, kind, cnt, tier_name = t["lat"], "fabric", 1, t["name"]
            levels.node_unit.append(tier_unit[k])
            levels.names.append(t["name"])
        else:  # buildings joined through the wide-area level
            parent = np.zeros(len(child_names), dtype=np.int64)
            parent_names = ["wan"]
            devices["wan"] = {"kind": "wan", "buildings": B}
            caps = np.full(len(child_names), bld.links * bld.goodput_Bps)
            lat, kind, cnt, tier_name = bld.latency_s, "wan", bld.links, "wan"
            levels.node_unit.append(np.zeros(n_total, dtype=np.int64))
            levels.names.append("wan")
        up_k, down_k, parent_cap = _link_to_parents(links, child_names, parent, parent_names,
                                                    caps, lat, kind, cnt, tier_name)
        levels.tiers.append(Tier(name=below["name"], units=len(child_names),
                                 down_Bps_per_unit=float(child_cap.mean()),
                                 up_Bps_per_unit=float(caps.mean()), latency_s=below["lat"]))
        levels.up.append(up_k)
        levels.down.append(down_k)
        levels.rail_mult.append(0)
        child_names, child_cap, child_unit = parent_names, parent_cap, np.arange(len(parent_names))
    top_name = tiers[-1]["name"] if B == 1 else "wan"
    levels.tiers.append(Tier(name=top_name, units=len(child_names),
                             down_Bps_per_unit=float(child_cap.mean()), up_Bps_per_unit=0.0,
                             latency_s=tiers[-1]["lat"] if B == 1 else bld.latency_s))
    levels.up.append(np.full(len(child_names), -1, dtype=np.int64))
    levels.down.append(np.full(len(child_names), -1, dtype=np.int64))
    return levels


def _add_leaves(links: _Links, devices: dict, node: NodeSpec, nodes: int, buildings: int,
                rail_opt: bool, leaf: dict, units: int, leaf_of_node: np.ndarray,
                nic_up: np.ndarray, nic_down: np.ndarray) -> tuple[list[str], np.ndarray, int]:
    """Add the leaf switches (``units`` per building, one per rail when ``rail_opt``) and each
    NIC's link to its leaf, filling ``nic_up``/``nic_down``; the leaves' names, their summed
    NIC bandwidth (bytes/s) and the number of leaves per unit."""
    R = node.nics
    rails = range(R) if rail_opt else [None]
    n_leaf = buildings * units
    child_names = [f"{_building_prefix(u // units, buildings)}{leaf['name']}{u % units}"
                   + (f"/rail{r}" if r is not None else "")
                   for u in range(n_leaf) for r in rails]
    for nm, u in zip(child_names, np.repeat(np.arange(n_leaf), len(rails))):
        devices[nm] = {"kind": "switch", "tier": leaf["name"], "building": int(u // units)}
    child_cap = np.zeros(len(child_names))
    for n in range(nodes * buildings):
        host = f"{_building_prefix(n // nodes, buildings)}n{n % nodes}"
        for r in range(R):
            sw_i = leaf_of_node[n] * R + r if rail_opt else leaf_of_node[n]
            nic_up[n * R + r], nic_down[n * R + r] = links.pair(
                f"{host}/nic{r}", child_names[sw_i], node.nic_Bps,
                node.nic_latency_s + leaf["lat"], "nic", tier=leaf["name"])
            child_cap[sw_i] += node.nic_Bps
    return child_names, child_cap, len(rails)


def _add_tier_switches(devices: dict, tier: dict, units: int, buildings: int) -> list[str]:
    """Add the ``units`` switches per building of ``tier``; their names."""
    names = [f"{_building_prefix(u // units, buildings)}{tier['name']}{u % units}"
             for u in range(buildings * units)]
    for u, nm in enumerate(names):
        devices[nm] = {"kind": "switch", "tier": tier["name"], "building": u // units,
                       "aggregate": True}
    return names


def _link_to_parents(links: _Links, child_names: list[str], parent: np.ndarray,
                     parent_names: list[str], caps: np.ndarray, lat: float, kind: str, cnt: int,
                     tier_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Link each child to its parent (capacity ``caps[c]`` bytes/s, latency ``lat`` s); the
    up and down link ids per child and the summed capacity per parent (bytes/s)."""
    up_k = np.empty(len(child_names), dtype=np.int64)
    down_k = np.empty_like(up_k)
    parent_cap = np.zeros(len(parent_names))
    for c, cname in enumerate(child_names):
        p = int(parent[c])
        up_k[c], down_k[c] = links.pair(cname, parent_names[p], float(caps[c]), lat, kind,
                                        count=cnt, tier=tier_name)
        parent_cap[p] += caps[c]
    return up_k, down_k, parent_cap


def _add_ports(links: _Links, levels: _Levels, port_Bps: float
               ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...], int]:
    """Append every bundle above the NICs again as its separate ports (ECMP routing).

    A bundle of capacity C (bytes/s) stands for ``n = round(C / port_Bps)`` uplinks (at least
    one; a wide-area bundle for its ``count`` links), each C / n, so the ports add up to the
    bundle. They are appended after all other links so no other id moves. Returns the first
    port id and port count per unit of every level (-1 and 0 where none), and the number of
    links before the ports (the ones the graph shows)."""
    n_before = len(links.src)
    first, count = [np.full(len(levels.up[0]), -1, np.int64)], [np.zeros(len(levels.up[0]),
                                                                          np.int64)]
    for k in range(1, len(levels.up)):
        up = levels.up[k]
        f_k, c_k = np.full(len(up), -1, np.int64), np.zeros(len(up), np.int64)
        for u, b in enumerate(up.tolist()):
            if b < 0:
                continue
            cap = links.bw[b]
            n = int(links.count[b]) if links.count[b] > 1 else max(1, round(cap / port_Bps))
            for j in range(n):
                i, _ = links.pair(links.src[b], links.dst[b], cap / n, links.lat[b],
                                  links.kind[b], tier=links.tier[b])
                if j == 0:
                    f_k[u] = i
            c_k[u] = n
        first.append(f_k)
        count.append(c_k)
    return tuple(first), tuple(count), n_before


def _hierarchy(node: NodeSpec, nodes: int, buildings: int, hosts: _HostLinks,
               levels: _Levels, ports=None) -> Hierarchy:
    """The :class:`Hierarchy` routes are found in, from the hosts and levels built (and the
    ECMP ports of :func:`_add_ports`, when routing hashes)."""
    G, n_total = node.gpus, nodes * buildings
    port_first, port_count, graph_links = ports if ports is not None else (None, None, None)
    return Hierarchy(
        gpus_per_node=G, nics_per_node=node.nics, node_of_gpu=np.repeat(np.arange(n_total), G),
        local_of_gpu=np.tile(np.arange(G), n_total),
        rail_of_gpu=np.tile(hosts.rail_of_local, n_total), gpu_up=hosts.gpu_up,
        gpu_down=hosts.gpu_down, gpu_nic_up=hosts.gpu_nic_up, gpu_nic_down=hosts.gpu_nic_down,
        node_unit=tuple(levels.node_unit), rail_mult=tuple(levels.rail_mult),
        up=tuple(levels.up), down=tuple(levels.down), level_names=tuple(levels.names),
        node_switch_reduces=node.reduces, node_switch=tuple(hosts.node_switch),
        building_of_node=np.arange(n_total) // nodes, port_first=port_first,
        port_count=port_count, graph_links=graph_links)
