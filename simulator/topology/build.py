"""Turn a topology mapping (see ``topologies/README.md``) into a :class:`Topology`.

Two forms share one loader:

* **generated**: ``node:`` (GPUs per host, NVSwitch or PCIe, NICs), ``fabric:`` (rail-optimised
  or not, a list of switching tiers with sizes and uplink oversubscription) and ``buildings:``
  (count, inter-building links, latency). Nothing lists 100k links by hand.
* **explicit**: ``devices:`` and ``links:`` lists, for odd boxes and hand-made test cases.

Either may have a ``network:`` section saying how flows use equal-cost paths
(:class:`~simulator.topology.model.Routing`): ``routing: ideal`` (the default) or ``ecmp``,
with ``qps``, ``hash_seed`` and ``port_bandwidth``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.errors import SpecError
from simulator.hardware import GPUSpec, gpu_spec, gpu_spec_from_dict
from simulator.topology.explicit import build_explicit
from simulator.topology.model import (
    LINK_KINDS,
    ROUTING_MODES,
    CommProfile,
    Hierarchy,
    LinkTable,
    Routing,
    Tier,
    Topology,
)
from simulator.topology.spec import parse_topology_ref, read_topology_mapping
from simulator.validation import Fields

__all__ = ["load_topology", "build_topology", "sized_topology_ref", "DEFAULT_COMM"]

#: Defaults when a topology file has no ``collectives:`` section. alpha: NCCL-like per-step
#: latency of the same order as the vTrain A100 tables' small-message floor; efficiency 1.0 means
#: "line rate" until a calibration says otherwise.
DEFAULT_COMM = CommProfile(
    alpha_s={"default": 5e-6},
    efficiency={k: 1.0 for k in LINK_KINDS},
    source="defaults (uncalibrated: line rate, 5 us per step)",
)

_TOP_KEYS = {"name", "description", "source", "gpu", "nodes", "node", "fabric", "buildings",
             "collectives", "devices", "links", "params", "notes", "network"}


def load_topology(ref: str | Path, *, overrides: Mapping[str, Any] | None = None,
                  gpus: int | None = None) -> Topology:
    """Load a built-in topology by name or a YAML file, with optional overrides.

    Parameters
    ----------
    ref:
        ``'selene-a100'``, ``'selene-a100:nodes=192'`` or a path to a YAML file.
    overrides:
        Dotted field → value, applied after those in ``ref``.
    gpus:
        Resize a generated topology to hold at least this many GPUs (sets ``nodes``).
    """
    doc, source = read_topology_mapping(ref, overrides)
    if gpus is not None:
        per = doc.get("node", {}).get("gpus") if isinstance(doc.get("node"), dict) else None
        if not isinstance(per, int) or per <= 0:
            raise SpecError("--gpus needs a generated topology with node.gpus", source=source,
                            field="node.gpus", fix="use --topology NAME:nodes=N instead")
        if gpus <= 0:
            raise SpecError(f"--gpus must be positive, got {gpus}", source="--gpus",
                            fix="pass a positive GPU count")
        doc["nodes"] = _nodes_for(doc, per, gpus)
    return build_topology(doc, source=source)


def _nodes_for(doc: Mapping[str, Any], per_node: int, gpus: int) -> int:
    """Nodes (per building) a generated topology needs to hold ``gpus`` GPUs."""
    b = doc.get("buildings", {}) or {}
    return math.ceil(gpus / per_node / max(1, int(b.get("count", 1) or 1)))


def sized_topology_ref(ref: str, gpus: int) -> str:
    """``ref`` grown to hold ``gpus`` GPUs: ``NAME:nodes=K`` appended when it names a generated
    topology with fewer GPUs and sets no ``nodes`` itself, else ``ref`` unchanged.

    For callers that keep the reference (a sharding plan records it), where
    ``load_topology(ref, gpus=...)`` would lose it.

    >>> sized_topology_ref("dgx-h100", 64), sized_topology_ref("dgx-h100", 8)
    ('dgx-h100:nodes=8', 'dgx-h100')
    """
    if Path(ref).exists() or "nodes" in parse_topology_ref(ref)[1]:
        return ref
    doc, _ = read_topology_mapping(ref)
    per = doc.get("node", {}).get("gpus") if isinstance(doc.get("node"), dict) else None
    if not isinstance(per, int) or per <= 0 or load_topology(ref).num_gpus >= gpus:
        return ref
    return f"{ref}{',' if ':' in ref else ':'}nodes={_nodes_for(doc, per, gpus)}"


def build_topology(doc: Mapping[str, Any], *, source: str = "<mapping>") -> Topology:
    """Validate a topology mapping and build the topology; errors name ``source`` and the field."""
    f = Fields(doc, source)
    f.check_keys(_TOP_KEYS)
    gpu = _gpu(f)
    comm = _comm(f.sub("collectives"))
    routing = _routing(f.sub("network"))
    if f.has("devices") or f.has("links"):
        if routing.port_Bps is not None:
            raise f.err("network.port_bandwidth", "a hand-written graph lists its links itself",
                        "remove port_bandwidth (explicit graphs hash over their own paths)")
        return replace(build_explicit(f, gpu=gpu, comm=comm), routing=routing)
    return _build_generated(f, gpu=gpu, comm=comm, routing=routing)


def _routing(f: Fields) -> Routing:
    """The ``network:`` section: how flows use equal-cost paths (default: ideal spreading)."""
    f.check_keys({"routing", "qps", "hash_seed", "port_bandwidth", "source", "notes"})
    mode = f.str("routing", "ideal", choices=ROUTING_MODES)
    r = Routing(mode=mode, qps=f.int("qps", 1, minimum=1, maximum=1024),
                seed=f.int("hash_seed", 0, minimum=0),
                port_Bps=f.bandwidth("port_bandwidth", None))
    if mode == "ideal" and (r.qps != 1 or r.port_Bps is not None):
        raise f.err("routing", "qps and port_bandwidth only matter under routing: ecmp",
                    "set routing: ecmp or remove them")
    if r.port_Bps is not None and r.port_Bps <= 0:
        raise f.err("port_bandwidth", "must be positive", "write e.g. 400 Gb/s")
    return r


def _gpu(f: Fields) -> GPUSpec:
    value = f.data.get("gpu")
    if value is None:
        raise f.err("gpu", "missing field", "add e.g. 'gpu: h100-sxm' (see clusterplan gpus)")
    if isinstance(value, str):
        return gpu_spec(value, source=f.source, field=f.path("gpu"))
    if isinstance(value, Mapping):
        name = value.get("name")
        if not isinstance(name, str):
            raise f.err("gpu.name", "a custom GPU needs a name", "add 'name:' under gpu")
        return gpu_spec_from_dict(name, value, source=f.source)
    raise f.err("gpu", f"expected a GPU kind or a mapping, got {value!r}",
                "write e.g. 'gpu: a100-80gb'")


def _comm(f: Fields) -> CommProfile:
    if not f.data:
        return DEFAULT_COMM
    f.check_keys({"source", "alpha", "efficiency", "local_bandwidth", "notes"})
    alpha = dict(DEFAULT_COMM.alpha_s)
    a = f.sub("alpha")
    for key in a.data:
        alpha[str(key)] = a.time(str(key), required=True)
    eff = dict(DEFAULT_COMM.efficiency)
    e = f.sub("efficiency")
    for key in e.data:
        if key not in LINK_KINDS:
            raise e.err(str(key), f"unknown link kind {key!r}",
                        f"use one of: {', '.join(LINK_KINDS)}")
        eff[str(key)] = e.float(str(key), minimum=0.0, exclusive=True, maximum=1.0, required=True)
    local = {}
    lf = f.sub("local_bandwidth")
    for key in lf.data:
        local[str(key)] = lf.bandwidth(str(key), required=True)
    return CommProfile(alpha_s=alpha, efficiency=eff, source=f.str("source", "unstated"),
                       local_Bps=local)


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


def wan_link_goodput(bandwidth_Bps: float, latency_s: float, loss_rate: float, *,
                     flows: int = 4, segment_bytes: float = 4096) -> float:
    """Bytes/s one long link delivers under random loss: ``flows`` loss-recovering transport
    flows share it, each held to the Mathis et al. (1997) bound ``1.22·MSS / (RTT·√p)`` with
    RTT twice the one-way latency; never more than the line rate. ``loss_rate`` 0: the line."""
    if loss_rate <= 0:
        return bandwidth_Bps
    per_flow = 1.22 * segment_bytes / (2 * latency_s * math.sqrt(loss_rate)) \
        if latency_s > 0 else math.inf
    return min(bandwidth_Bps, flows * per_flow)


# the largest topology built (GPUs in all): link tables and routes grow with it
MAX_GPUS = 262_144


def _build_generated(f: Fields, *, gpu: GPUSpec, comm: CommProfile,
                     routing: Routing | None = None) -> Topology:
    """Build a generated topology: ``nodes`` hosts per building from ``node:``, joined by the
    switching tiers of ``fabric:``, and the buildings of ``buildings:`` by a wide-area level;
    under ECMP routing each bundle above the NICs also as its separate ports."""
    routing = routing or Routing()
    nodes = f.int("nodes", 1, minimum=1, maximum=MAX_GPUS)
    node = _NodeSpec(f, nodes, gpu)
    rail_opt, tiers = _read_fabric(f, node, nodes)
    bld = _Buildings(f, nodes * node.gpus, tiers)
    if tiers:
        _size_top_tier(f, nodes, tiers)

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


class _NodeSpec:
    """One host of a generated topology, read from ``node:``: GPUs, NICs, and the bandwidth
    (bytes/s) and latency (seconds) of its GPU-switch, PCIe and NIC links."""

    __slots__ = ("fields", "gpus", "interconnect", "intra_Bps", "intra_latency_s", "intra_kind",
                 "pcie_Bps", "pcie_latency_s", "nics", "nic_Bps", "nic_latency_s", "reduces",
                 "host_memory", "host_links")

    def __init__(self, f: Fields, nodes: int, gpu: GPUSpec) -> None:
        """Read and check ``node:`` for ``nodes`` hosts per building (``f``: the whole mapping)."""
        nf = self.fields = f.sub("node", required=True)
        nf.check_keys({"gpus", "interconnect", "nvlink_bandwidth", "nvlink_latency",
                       "pcie_bandwidth", "pcie_latency", "loopback_bandwidth", "loopback_latency",
                       "nics", "nic_bandwidth", "nic_latency", "in_switch_reduction",
                       "host_memory", "host_links"})
        G = self.gpus = nf.int("gpus", required=True, minimum=1, maximum=1024)
        if nodes * G > MAX_GPUS:
            raise f.err("nodes", f"{nodes:,} nodes × {G} GPUs = {nodes * G:,} GPUs in a building "
                        f"is more than the {MAX_GPUS:,} a topology may hold",
                        f"use at most {MAX_GPUS // G:,} nodes")
        inter = self.interconnect = nf.str("interconnect", "nvswitch",
                                           choices=("nvswitch", "pcie", "loopback"))
        self.intra_Bps, self.intra_latency_s, self.intra_kind = _read_interconnect(nf, inter, gpu)
        self.pcie_Bps = nf.bandwidth("pcie_bandwidth", "25 GB/s") if inter == "nvswitch" \
            else self.intra_Bps
        self.pcie_latency_s = nf.time("pcie_latency", "1 us")
        R = self.nics = nf.int("nics", 0, minimum=0)
        if R > G:
            raise nf.err("nics", f"{R} NICs for {G} GPUs per node is not supported",
                         "use at most one NIC per GPU (aggregate dual-port NICs into one)")
        self.nic_Bps = nf.bandwidth("nic_bandwidth", required=R > 0) if R else 0.0
        self.nic_latency_s = nf.time("nic_latency", "1 us")
        self.reduces = nf.bool("in_switch_reduction", False)
        # host memory (bytes per node; 0: not stated) and the PCIe uplinks to it that the GPUs
        # share for copies to and from host memory (activation offload)
        self.host_memory = nf.bytes("host_memory", 0.0)
        self.host_links = nf.int("host_links", G, minimum=1, maximum=G)
        if self.reduces and inter != "nvswitch":
            raise nf.err("in_switch_reduction", "in-switch reduction needs an NVSwitch",
                         "set interconnect: nvswitch or in_switch_reduction: false")


def _read_interconnect(nf: Fields, inter: str, gpu: GPUSpec) -> tuple[float, float, str]:
    """Bandwidth (bytes/s), latency (seconds) and link kind of one GPU's link to its node's
    switch for the ``interconnect`` ``inter``."""
    if inter == "nvswitch":
        intra_bw = nf.bandwidth("nvlink_bandwidth", gpu.nvlink_bandwidth_Bps or None)
        if intra_bw is None:
            raise nf.err("nvlink_bandwidth", f"GPU {gpu.name} has no NVLink bandwidth",
                         "set node.nvlink_bandwidth or use interconnect: pcie")
        return intra_bw, nf.time("nvlink_latency", "0.7 us"), "nvlink"
    if inter == "pcie":
        intra_bw = nf.bandwidth("pcie_bandwidth", required=True)
        return intra_bw, nf.time("pcie_latency", "1 us"), "pcie"
    intra_bw = nf.bandwidth("loopback_bandwidth", required=True)
    return intra_bw, nf.time("loopback_latency", "10 us"), "loopback"


def _read_fabric(f: Fields, node: _NodeSpec, nodes: int) -> tuple[bool, list[dict]]:
    """``fabric:``: whether it is rail-optimised, and its tiers from the leaves up, each a dict
    ``name, size`` (units below one switch; None for a top tier to derive), ``over`` (uplink
    oversubscription) and ``lat`` (seconds)."""
    ff = f.sub("fabric")
    ff.check_keys({"rail_optimized", "tiers"})
    rail_opt = ff.bool("rail_optimized", True)
    tiers_raw = ff.data.get("tiers") or []
    if not isinstance(tiers_raw, list):
        raise ff.err("tiers", "expected a list of tiers", "write '- {name: leaf, size: 32}' items")
    if nodes > 1 and node.nics == 0:
        raise node.fields.err("nics", f"{nodes} nodes but no NICs to connect them",
                              "set node.nics and node.nic_bandwidth")
    if nodes > 1 and not tiers_raw:
        raise ff.err("tiers", f"{nodes} nodes but no switching tiers",
                     "add fabric.tiers, e.g. [{name: leaf}]")
    return rail_opt, [_read_tier(f, ff, i, t, last=i == len(tiers_raw) - 1)
                      for i, t in enumerate(tiers_raw)]


def _read_tier(f: Fields, ff: Fields, i: int, t: Any, *, last: bool) -> dict:
    """Tier ``i`` of ``fabric.tiers`` as a dict (see :func:`_read_fabric`)."""
    if not isinstance(t, Mapping):
        raise ff.err(f"tiers[{i}]", f"expected a mapping, got {t!r}",
                     "write {name: leaf, size: 32}")
    tf = Fields(t, f.source, ff.path(f"tiers[{i}]"))
    tf.check_keys({"name", "size", "uplink_oversubscription", "latency"})
    size = tf.int("size", None, minimum=1)
    if size is None and not last:
        raise tf.err("size", "missing field (only the top tier may omit it)",
                     "give the number of units below one switch unit")
    return {"name": tf.str("name", f"tier{i}"), "size": size,
            "over": tf.float("uplink_oversubscription", 1.0, minimum=1e-9, exclusive=True),
            "lat": tf.time("latency", "0.6 us")}


class _Buildings:
    """``buildings:``: how many, and (with more than one) the wide-area links joining them:
    ``links`` per building, their line rate and loss-limited goodput (bytes/s), latency (s)."""

    __slots__ = ("count", "links", "bandwidth_Bps", "latency_s", "loss_rate", "goodput_Bps")

    def __init__(self, f: Fields, gpus_per_building: int, tiers: list[dict]) -> None:
        """Read and check ``buildings:`` of ``f`` (the whole mapping)."""
        bf = f.sub("buildings")
        bf.check_keys({"count", "links", "link_bandwidth", "latency", "loss_rate",
                       "flows_per_link", "segment_size"})
        B = self.count = bf.int("count", 1, minimum=1, maximum=64)
        if B * gpus_per_building > MAX_GPUS:
            raise bf.err("count", f"{B} buildings × {gpus_per_building:,} GPUs = "
                         f"{B * gpus_per_building:,} GPUs is more "
                         f"than the {MAX_GPUS:,} a topology may hold",
                         f"use at most {max(1, MAX_GPUS // gpus_per_building)} buildings or "
                         "fewer nodes")
        self.links = self.bandwidth_Bps = self.latency_s = None
        self.loss_rate = self.goodput_Bps = None
        if B > 1:
            if not tiers:
                raise f.err("fabric.tiers", "several buildings need a fabric", "add fabric.tiers")
            self.links = bf.int("links", required=True, minimum=1)
            self.bandwidth_Bps = bf.bandwidth("link_bandwidth", required=True)
            self.latency_s = bf.time("latency", required=True)
            self.loss_rate = bf.float("loss_rate", 0.0, minimum=0.0, maximum=0.5)
            self.goodput_Bps = wan_link_goodput(
                self.bandwidth_Bps, self.latency_s, self.loss_rate,
                flows=bf.int("flows_per_link", 4, minimum=1),
                segment_bytes=bf.bytes("segment_size", "4 KiB"))


def _size_top_tier(f: Fields, nodes: int, tiers: list[dict]) -> None:
    """Set the top tier's size to the units it needs for ``nodes`` per building; an error when
    a given top size is too small (capacity: the product of the sizes below the top tier)."""
    cap = 1
    for t in tiers[:-1]:
        cap *= t["size"]
    top_size = tiers[-1]["size"]
    need_top = math.ceil(nodes / cap)
    if top_size is not None and top_size < need_top:
        raise f.err("nodes", f"{nodes} nodes per building exceed the fabric's "
                    f"{cap * top_size} ({' × '.join(str(t['size']) for t in tiers)})",
                    "raise the top tier's size or remove it so it is derived")
    tiers[-1]["size"] = need_top


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


def _add_hosts(links: _Links, devices: dict, node: _NodeSpec, nodes: int, buildings: int,
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


def _add_fabric(links: _Links, devices: dict, node: _NodeSpec, nodes: int, bld: _Buildings,
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


def _add_leaves(links: _Links, devices: dict, node: _NodeSpec, nodes: int, buildings: int,
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


def _hierarchy(node: _NodeSpec, nodes: int, buildings: int, hosts: _HostLinks,
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
