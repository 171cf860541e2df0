"""Turn a topology mapping (see ``topologies/README.md``) into a :class:`Topology`.

Two forms share one loader:

* **generated**: ``node:`` (GPUs per host, NVSwitch or PCIe, NICs), ``fabric:`` (rail-optimised
  or not, a list of switching tiers with sizes and uplink oversubscription) and ``buildings:``
  (count, inter-building links, latency). Nothing lists 100k links by hand.
* **explicit**: ``devices:`` and ``links:`` lists, for odd boxes and hand-made test cases.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from simulator.errors import SpecError
from simulator.hardware import GPUSpec, gpu_spec, gpu_spec_from_dict
from simulator.topology.model import LINK_KINDS, CommProfile, Hierarchy, LinkTable, Tier, Topology
from simulator.topology.spec import read_topology_mapping
from simulator.validation import Fields

__all__ = ["load_topology", "build_topology", "DEFAULT_COMM"]

#: Defaults when a topology file has no ``collectives:`` section. alpha: NCCL-like per-step
#: latency of the same order as the vTrain A100 tables' small-message floor; efficiency 1.0 means
#: "line rate" until a calibration says otherwise.
DEFAULT_COMM = CommProfile(
    alpha_s={"default": 5e-6},
    efficiency={k: 1.0 for k in LINK_KINDS},
    source="defaults (uncalibrated: line rate, 5 us per step)",
)

_TOP_KEYS = {"name", "description", "source", "gpu", "nodes", "node", "fabric", "buildings",
             "collectives", "devices", "links", "params", "notes"}


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
        b = doc.get("buildings", {}) or {}
        per_building = math.ceil(gpus / per / max(1, int(b.get("count", 1) or 1)))
        doc["nodes"] = per_building
    return build_topology(doc, source=source)


def build_topology(doc: Mapping[str, Any], *, source: str = "<mapping>") -> Topology:
    """Validate a topology mapping and build the topology; errors name ``source`` and the field."""
    f = Fields(doc, source)
    f.check_keys(_TOP_KEYS)
    gpu = _gpu(f)
    comm = _comm(f.sub("collectives"))
    if f.has("devices") or f.has("links"):
        from simulator.topology.explicit import build_explicit
        return build_explicit(f, gpu=gpu, comm=comm)
    return _build_generated(f, gpu=gpu, comm=comm)


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


def _build_generated(f: Fields, *, gpu: GPUSpec, comm: CommProfile) -> Topology:
    nodes = f.int("nodes", 1, minimum=1, maximum=MAX_GPUS)
    nf = f.sub("node", required=True)
    nf.check_keys({"gpus", "interconnect", "nvlink_bandwidth", "nvlink_latency", "pcie_bandwidth",
                   "pcie_latency", "loopback_bandwidth", "loopback_latency", "nics", "nic_bandwidth", "nic_latency", "in_switch_reduction"})
    G = nf.int("gpus", required=True, minimum=1, maximum=1024)
    if nodes * G > MAX_GPUS:
        raise f.err("nodes", f"{nodes:,} nodes × {G} GPUs = {nodes * G:,} GPUs in a building is "
                    f"more than the {MAX_GPUS:,} a topology may hold",
                    f"use at most {MAX_GPUS // G:,} nodes")
    inter = nf.str("interconnect", "nvswitch", choices=("nvswitch", "pcie", "loopback"))
    if inter == "nvswitch":
        intra_bw = nf.bandwidth("nvlink_bandwidth", gpu.nvlink_bandwidth_Bps or None)
        if intra_bw is None:
            raise nf.err("nvlink_bandwidth", f"GPU {gpu.name} has no NVLink bandwidth",
                         "set node.nvlink_bandwidth or use interconnect: pcie")
        intra_lat, intra_kind = nf.time("nvlink_latency", "0.7 us"), "nvlink"
    elif inter == "pcie":
        intra_bw = nf.bandwidth("pcie_bandwidth", required=True)
        intra_lat, intra_kind = nf.time("pcie_latency", "1 us"), "pcie"
    else:
        intra_bw = nf.bandwidth("loopback_bandwidth", required=True)
        intra_lat, intra_kind = nf.time("loopback_latency", "10 us"), "loopback"
    pcie_bw = nf.bandwidth("pcie_bandwidth", "25 GB/s") if inter == "nvswitch" else intra_bw
    pcie_lat = nf.time("pcie_latency", "1 us")
    R = nf.int("nics", 0, minimum=0)
    if R > G:
        raise nf.err("nics", f"{R} NICs for {G} GPUs per node is not supported",
                     "use at most one NIC per GPU (aggregate dual-port NICs into one)")
    nic_bw = nf.bandwidth("nic_bandwidth", required=R > 0) if R else 0.0
    nic_lat = nf.time("nic_latency", "1 us")
    reduces = nf.bool("in_switch_reduction", False)
    if reduces and inter != "nvswitch":
        raise nf.err("in_switch_reduction", "in-switch reduction needs an NVSwitch",
                     "set interconnect: nvswitch or in_switch_reduction: false")

    ff = f.sub("fabric")
    ff.check_keys({"rail_optimized", "tiers"})
    rail_opt = ff.bool("rail_optimized", True)
    tiers_raw = ff.data.get("tiers") or []
    if not isinstance(tiers_raw, list):
        raise ff.err("tiers", "expected a list of tiers", "write '- {name: leaf, size: 32}' items")
    if nodes > 1 and R == 0:
        raise nf.err("nics", f"{nodes} nodes but no NICs to connect them",
                     "set node.nics and node.nic_bandwidth")
    if nodes > 1 and not tiers_raw:
        raise ff.err("tiers", f"{nodes} nodes but no switching tiers",
                     "add fabric.tiers, e.g. [{name: leaf}]")
    tiers = []
    for i, t in enumerate(tiers_raw):
        if not isinstance(t, Mapping):
            raise ff.err(f"tiers[{i}]", f"expected a mapping, got {t!r}", "write {name: leaf, size: 32}")
        tf = Fields(t, f.source, ff.path(f"tiers[{i}]"))
        tf.check_keys({"name", "size", "uplink_oversubscription", "latency"})
        last = i == len(tiers_raw) - 1
        size = tf.int("size", None, minimum=1)
        if size is None and not last:
            raise tf.err("size", "missing field (only the top tier may omit it)",
                         "give the number of units below one switch unit")
        tiers.append({"name": tf.str("name", f"tier{i}"), "size": size,
                      "over": tf.float("uplink_oversubscription", 1.0, minimum=1e-9, exclusive=True),
                      "lat": tf.time("latency", "0.6 us")})
    bf = f.sub("buildings")
    bf.check_keys({"count", "links", "link_bandwidth", "latency", "loss_rate", "flows_per_link",
                   "segment_size"})
    B = bf.int("count", 1, minimum=1, maximum=64)
    if B * nodes * G > MAX_GPUS:
        raise bf.err("count", f"{B} buildings × {nodes * G:,} GPUs = {B * nodes * G:,} GPUs is more "
                     f"than the {MAX_GPUS:,} a topology may hold",
                     f"use at most {max(1, MAX_GPUS // (nodes * G))} buildings or fewer nodes")
    if B > 1:
        if not tiers:
            raise f.err("fabric.tiers", "several buildings need a fabric", "add fabric.tiers")
        wan_links = bf.int("links", required=True, minimum=1)
        wan_bw = bf.bandwidth("link_bandwidth", required=True)
        wan_lat = bf.time("latency", required=True)
        loss = bf.float("loss_rate", 0.0, minimum=0.0, maximum=0.5)
        wan_goodput = wan_link_goodput(wan_bw, wan_lat, loss,
                                       flows=bf.int("flows_per_link", 4, minimum=1),
                                       segment_bytes=bf.bytes("segment_size", "4 KiB"))

    # capacity check: product of sizes below the top tier
    if tiers:
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

    links = _Links()
    devices: dict[str, dict] = {}
    n_total = nodes * B
    gpus: list[str] = []
    node_of_gpu = np.repeat(np.arange(n_total), G)
    local = np.tile(np.arange(G), n_total)
    rail_of_local = (np.arange(G) * R // G) if R else np.zeros(G, dtype=int)
    gpu_up = np.empty(n_total * G, dtype=np.int64)
    gpu_down = np.empty_like(gpu_up)
    gpu_nic_up = np.full_like(gpu_up, -1)
    gpu_nic_down = np.full_like(gpu_up, -1)
    node_switch = []
    nic_up = np.full(n_total * max(R, 1), -1, dtype=np.int64)
    nic_down = np.full_like(nic_up, -1)
    pre = (lambda b: f"b{b}/") if B > 1 else (lambda b: "")
    sw_kind = {"nvswitch": "nvswitch", "pcie": "pcie_switch", "loopback": "cpu"}[inter]
    for n in range(n_total):
        b, nl = divmod(n, nodes)
        host = f"{pre(b)}n{nl}"
        sw = f"{host}/{'nvswitch' if inter == 'nvswitch' else 'pcie' if inter == 'pcie' else 'cpu'}"
        devices[sw] = {"kind": sw_kind, "node": n, "building": b, "reduces": reduces}
        node_switch.append(sw)
        for l in range(G):
            g = n * G + l
            gid = f"{host}/gpu{l}"
            devices[gid] = {"kind": "gpu" if gpu.name != "cpu" else "cpu", "node": n,
                            "building": b, "local": l, "rank": g}
            gpus.append(gid)
            gpu_up[g], gpu_down[g] = links.pair(gid, sw, intra_bw, intra_lat, intra_kind,
                                                tier="node")
        for r in range(R):
            nid = f"{host}/nic{r}"
            devices[nid] = {"kind": "nic", "node": n, "building": b, "rail": r}
        for l in range(G):
            if R:
                g = n * G + l
                gpu_nic_up[g], gpu_nic_down[g] = links.pair(
                    gpus[g], f"{host}/nic{rail_of_local[l]}", pcie_bw, pcie_lat, "pcie", tier="node")

    # Switching levels: level 0 = NICs, level 1 = leaf switches (one per rail when rail-
    # optimised), level k+1 = tier k, and a last "wan" level joining buildings.
    node_unit: list[np.ndarray] = [np.arange(n_total)]
    rail_mult: list[int] = [max(R, 1)]
    up: list[np.ndarray] = [nic_up]
    down: list[np.ndarray] = [nic_down]
    names = ["nic"]
    tier_summ: list[Tier] = []
    if tiers and R:
        bld = np.arange(n_total) // nodes
        nib = np.arange(n_total) % nodes
        div, ub, tier_unit = 1, [], []
        for t in tiers:
            div *= t["size"]
            ub.append(math.ceil(nodes / div))
            tier_unit.append(bld * ub[-1] + nib // div)
        # leaf switches and NIC links
        rails = range(R) if rail_opt else [None]
        n_leaf = B * ub[0]
        child_names = [f"{pre(u // ub[0])}{tiers[0]['name']}{u % ub[0]}"
                       + (f"/rail{r}" if r is not None else "")
                       for u in range(n_leaf) for r in rails]
        for nm, u in zip(child_names, np.repeat(np.arange(n_leaf), len(rails))):
            devices[nm] = {"kind": "switch", "tier": tiers[0]["name"], "building": int(u // ub[0])}
        child_cap = np.zeros(len(child_names))
        for n in range(n_total):
            host = f"{pre(n // nodes)}n{n % nodes}"
            for r in range(R):
                sw_i = tier_unit[0][n] * R + r if rail_opt else tier_unit[0][n]
                nic_up[n * R + r], nic_down[n * R + r] = links.pair(
                    f"{host}/nic{r}", child_names[sw_i], nic_bw, nic_lat + tiers[0]["lat"], "nic",
                    tier=tiers[0]["name"])
                child_cap[sw_i] += nic_bw
        node_unit.append(tier_unit[0])
        rail_mult.append(R if rail_opt else 0)
        names.append(tiers[0]["name"])
        # the tier unit (per building numbering) of each child device
        child_unit = np.repeat(np.arange(n_leaf), len(rails))
        levels = len(tiers) + (1 if B > 1 else 0)
        for k in range(1, levels):
            below = tiers[k - 1]
            if k < len(tiers):
                t = tiers[k]
                parent = (child_unit // ub[k - 1]) * ub[k] + (child_unit % ub[k - 1]) // t["size"]
                n_par = B * ub[k]
                parent_names = [f"{pre(u // ub[k])}{t['name']}{u % ub[k]}" for u in range(n_par)]
                for u, nm in enumerate(parent_names):
                    devices[nm] = {"kind": "switch", "tier": t["name"], "building": u // ub[k],
                                   "aggregate": True}
                caps = child_cap / below["over"]
                lat, kind, cnt, tier_name = t["lat"], "fabric", 1, t["name"]
                node_unit.append(tier_unit[k])
                names.append(t["name"])
            else:  # buildings joined through the wide-area level
                parent = np.zeros(len(child_names), dtype=np.int64)
                parent_names = ["wan"]
                devices["wan"] = {"kind": "wan", "buildings": B}
                caps = np.full(len(child_names), wan_links * wan_goodput)
                lat, kind, cnt, tier_name = wan_lat, "wan", wan_links, "wan"
                node_unit.append(np.zeros(n_total, dtype=np.int64))
                names.append("wan")
            up_k = np.empty(len(child_names), dtype=np.int64)
            down_k = np.empty_like(up_k)
            parent_cap = np.zeros(len(parent_names))
            for c, cname in enumerate(child_names):
                p = int(parent[c])
                up_k[c], down_k[c] = links.pair(cname, parent_names[p], float(caps[c]), lat, kind,
                                                count=cnt, tier=tier_name)
                parent_cap[p] += caps[c]
            tier_summ.append(Tier(name=below["name"], units=len(child_names),
                                  down_Bps_per_unit=float(child_cap.mean()),
                                  up_Bps_per_unit=float(caps.mean()), latency_s=below["lat"]))
            up.append(up_k)
            down.append(down_k)
            rail_mult.append(0)
            child_names, child_cap, child_unit = parent_names, parent_cap, np.arange(len(parent_names))
        top_name = tiers[-1]["name"] if B == 1 else "wan"
        tier_summ.append(Tier(name=top_name, units=len(child_names),
                              down_Bps_per_unit=float(child_cap.mean()), up_Bps_per_unit=0.0,
                              latency_s=tiers[-1]["lat"] if B == 1 else wan_lat))
        up.append(np.full(len(child_names), -1, dtype=np.int64))
        down.append(np.full(len(child_names), -1, dtype=np.int64))

    hier = Hierarchy(
        gpus_per_node=G, nics_per_node=R, node_of_gpu=node_of_gpu, local_of_gpu=local,
        rail_of_gpu=np.tile(rail_of_local, n_total), gpu_up=gpu_up, gpu_down=gpu_down,
        gpu_nic_up=gpu_nic_up, gpu_nic_down=gpu_nic_down, node_unit=tuple(node_unit),
        rail_mult=tuple(rail_mult), up=tuple(up), down=tuple(down), level_names=tuple(names),
        node_switch_reduces=reduces, node_switch=tuple(node_switch),
        building_of_node=np.arange(n_total) // nodes)
    params = {"nodes": nodes, "gpus_per_node": G, "nics_per_node": R, "buildings": B,
              "rail_optimized": rail_opt}
    if B > 1:
        params.update(wan_link_Bps=wan_bw, wan_goodput_Bps=wan_goodput, wan_loss_rate=loss)
    return Topology(name=f.str("name", "unnamed"), source=f.source, gpu=gpu, devices=devices,
                    gpus=tuple(gpus), links=links.table(), comm=comm, tiers=tuple(tier_summ),
                    hierarchy=hier, params=params, description=f.str("description", "") or "")
