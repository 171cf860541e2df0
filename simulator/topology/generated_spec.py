"""The ``node:``, ``fabric:`` and ``buildings:`` sections of a generated topology, read and
checked (errors name the file and the field) into what :mod:`simulator.topology.generated`
builds the graph from: one host's links (:class:`NodeSpec`), the switching tiers
(:func:`read_fabric`), the buildings and their wide-area links (:class:`Buildings`, with the
loss-limited goodput of :func:`wan_link_goodput`). Bandwidths are bytes/s, latencies seconds.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from simulator.hardware import GPUSpec
from simulator.validation import Fields

__all__ = ["MAX_GPUS", "NodeSpec", "Buildings", "read_fabric", "size_top_tier",
           "wan_link_goodput"]

# the largest topology built (GPUs in all): link tables and routes grow with it
MAX_GPUS = 262_144

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


class NodeSpec:
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


def read_fabric(f: Fields, node: NodeSpec, nodes: int) -> tuple[bool, list[dict]]:
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
    """Tier ``i`` of ``fabric.tiers`` as a dict (see :func:`read_fabric`)."""
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


class Buildings:
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


def size_top_tier(f: Fields, nodes: int, tiers: list[dict]) -> None:
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
