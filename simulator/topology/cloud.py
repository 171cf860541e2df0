"""Cloud placements: VMs scattered over hosts, racks and zones, with pairwise costs.

A cloud user rents ``vms`` VMs and gets them in some order; the provider placed them on physical
hosts (several VMs per host), hosts in racks, racks in zones, and says nothing about it. This
module generates such a placement from a seed and turns it into

* a :class:`~simulator.costmatrix.CostMatrix` (pairwise one-way latency and bandwidth of one
  stream alone, plus the shared links as :class:`~simulator.costmatrix.Sharing`), and
* an explicit topology mapping (``devices:``/``links:``, see ``topologies/README.md``) that the
  flow simulator runs on, with the VMs listed in the user's order: **the user's rank order is not
  the physical order** (the hidden placement).

Both come from the same numbers, so the latency of the path between two VMs in the graph equals
the matrix entry and the narrowest link on it equals the pairwise bandwidth.

Cost model of the tree (all per direction)::

    VM --nic--> host switch --host uplink--> rack switch --rack uplink--> zone switch --zone--> WAN

* latency of i → j = vm_latency[i] + vm_latency[j] (per-VM NIC and virtual-switch jitter)
  + 2 · host_latency if the hosts differ + 2 · rack_latency if the racks differ
  + 2 · zone_latency if the zones differ;
* bandwidth of i → j alone = min(nic[i], nic[j], and the up/down links of the groups crossed);
* other tenants' load: each host and rack uplink keeps a random fraction ``tenant_load`` … 1 of its
  capacity (seeded), and each VM's latency carries ± ``jitter`` relative noise.

A YAML file states the generator under ``params.cloud`` next to the rendered graph; see
``topologies/cloud-64.yaml``, which :func:`cloud_topology_yaml` wrote.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

import numpy as np
import yaml

from simulator.costmatrix import CostMatrix, Sharing, SharingLevel
from simulator.errors import SpecError

__all__ = ["CloudSpec", "CloudPlacement", "generate_placement", "placement_cost_matrix",
           "cloud_topology_yaml",
           "cloud_topology_mapping", "cloud_spec_from_mapping", "cloud_spec_for"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CloudSpec:
    """Generator parameters; SI units (seconds, bytes/s), named in each field.

    Capacity is laid out as ``zones × racks_per_zone × hosts_per_rack × vms_per_host`` VM slots,
    of which ``vms`` are taken at random (so hosts and racks are partly filled, as in a shared
    cloud). The user's rank order is a random permutation of the VMs.
    """

    vms: int = 64
    seed: int = 0
    zones: int = 2
    racks_per_zone: int = 4
    hosts_per_rack: int = 4
    vms_per_host: int = 4
    vm_latency_s: float = 5e-6          # NIC + virtual switch, per end
    host_latency_s: float = 5e-6        # host switch ↔ rack switch, per hop
    rack_latency_s: float = 10e-6       # rack switch ↔ zone switch, per hop
    zone_latency_s: float = 125e-6      # zone switch ↔ inter-zone WAN, per hop
    jitter: float = 0.2                 # relative noise on each VM's latency (± uniform)
    nic_Bps: float = 25e9 / 8           # per-VM NIC (25 Gb/s)
    host_oversubscription: float = 2.0  # host uplink = vms_per_host · nic / this
    rack_oversubscription: float = 3.0  # rack uplink = hosts_per_rack · host uplink / this
    zone_oversubscription: float = 2.0  # zone link = racks_per_zone · rack uplink / this
    tenant_load: float = 0.5            # links keep a random 0.5…1 share of capacity

    def __post_init__(self) -> None:
        if self.vms < 2:
            raise SpecError(f"vms {self.vms} is below 2", field="params.cloud.vms",
                            fix="place at least 2 VMs")
        if self.vms > self.slots:
            raise SpecError(f"{self.vms} VMs do not fit {self.slots} slots",
                            field="params.cloud.vms", fix="add racks or hosts")
        if min(self.zones, self.racks_per_zone, self.hosts_per_rack, self.vms_per_host) < 1 \
                or min(self.host_oversubscription, self.rack_oversubscription,
                       self.zone_oversubscription, self.nic_Bps) <= 0:
            raise SpecError("counts must be ≥ 1 and oversubscriptions and nic_Bps positive",
                            field="params.cloud", fix="e.g. rack_oversubscription: 3")
        if not 0 < self.tenant_load <= 1 or not 0 <= self.jitter < 1:
            raise SpecError("tenant_load must be in (0, 1] and jitter in [0, 1)",
                            field="params.cloud", fix="e.g. tenant_load: 0.5, jitter: 0.2")

    @property
    def host_uplink_Bps(self) -> float:
        return self.vms_per_host * self.nic_Bps / self.host_oversubscription

    @property
    def rack_uplink_Bps(self) -> float:
        return self.hosts_per_rack * self.host_uplink_Bps / self.rack_oversubscription

    @property
    def zone_link_Bps(self) -> float:
        return self.racks_per_zone * self.rack_uplink_Bps / self.zone_oversubscription

    @property
    def slots(self) -> int:
        return self.zones * self.racks_per_zone * self.hosts_per_rack * self.vms_per_host


def cloud_spec_for(vms: int, *, seed: int = 0, **kw: Any) -> CloudSpec:
    """A spec scaled to ``vms`` VMs: two zones, slots for twice the VMs, 4 VMs per host,
    4 hosts per rack."""
    zones = kw.pop("zones", 2)
    per_rack = kw.get("hosts_per_rack", 4) * kw.get("vms_per_host", 4)
    racks = max(1, math.ceil(2 * vms / (zones * per_rack)))
    return CloudSpec(vms=vms, seed=seed, zones=zones, racks_per_zone=racks, **kw)


@dataclass(frozen=True, slots=True)
class CloudPlacement:
    """Where each VM landed, indexed by the user's rank (not the physical order).

    ``host``, ``rack`` and ``zone`` are global ids (a rack id is unique across zones).
    ``host_capacity_Bps`` / ``rack_capacity_Bps`` are uplink capacities after tenant load.
    """

    spec: CloudSpec
    host: np.ndarray
    rack: np.ndarray
    zone: np.ndarray
    vm_latency_s: np.ndarray
    host_capacity_Bps: np.ndarray
    rack_capacity_Bps: np.ndarray
    zone_capacity_Bps: np.ndarray

    @property
    def hostnames(self) -> tuple[str, ...]:
        return tuple(f"z{z}-r{r}-h{h}-vm{i}" for i, (z, r, h) in
                     enumerate(zip(self.zone, self.rack, self.host)))

    def physical_order(self) -> np.ndarray:
        """User ranks sorted by (zone, rack, host): the order an informed launcher would use."""
        return np.lexsort((np.arange(len(self.host)), self.host, self.rack, self.zone))


def generate_placement(spec: CloudSpec) -> CloudPlacement:
    """Seeded placement: ``spec.vms`` random slots, then a random user order."""
    rng = np.random.default_rng(spec.seed)
    slot = np.sort(rng.choice(spec.slots, size=spec.vms, replace=False))
    host = slot // spec.vms_per_host
    rack = host // spec.hosts_per_rack
    zone = rack // spec.racks_per_zone
    user = rng.permutation(spec.vms)          # the hidden placement
    host, rack, zone = host[user], rack[user], zone[user]
    n_hosts = spec.slots // spec.vms_per_host
    n_racks = n_hosts // spec.hosts_per_rack
    lo = spec.tenant_load
    host_cap = spec.host_uplink_Bps * rng.uniform(lo, 1.0, n_hosts)
    rack_cap = spec.rack_uplink_Bps * rng.uniform(lo, 1.0, n_racks)
    zone_cap = np.full(spec.zones, spec.zone_link_Bps)
    vm_lat = spec.vm_latency_s * (1 + rng.uniform(-spec.jitter, spec.jitter, spec.vms))
    return CloudPlacement(spec, host, rack, zone, vm_lat, host_cap, rack_cap, zone_cap)


def placement_cost_matrix(p: CloudPlacement) -> CostMatrix:
    """Pairwise costs and shared links of a placement (see the module docstring)."""
    s = p.spec
    n = len(p.host)
    dh = p.host[:, None] != p.host[None, :]
    dr = p.rack[:, None] != p.rack[None, :]
    dz = p.zone[:, None] != p.zone[None, :]
    lat = (p.vm_latency_s[:, None] + p.vm_latency_s[None, :] + 2 * s.host_latency_s * dh
           + 2 * s.rack_latency_s * dr + 2 * s.zone_latency_s * dz)
    bw = np.full((n, n), s.nic_Bps)
    hc = p.host_capacity_Bps[p.host]
    rc = p.rack_capacity_Bps[p.rack]
    zc = p.zone_capacity_Bps[p.zone]
    for cross, cap in ((dh, hc), (dr, rc), (dz, zc)):
        bw = np.where(cross, np.minimum(bw, np.minimum(cap[:, None], cap[None, :])), bw)
    np.fill_diagonal(lat, 0.0)
    np.fill_diagonal(bw, 0.0)
    sharing = Sharing((
        SharingLevel("vm", np.arange(n), np.full(n, s.nic_Bps)),
        SharingLevel("host", p.host.copy(), p.host_capacity_Bps),
        SharingLevel("rack", p.rack.copy(), p.rack_capacity_Bps),
        SharingLevel("zone", p.zone.copy(), p.zone_capacity_Bps)))
    measured = {"method": "generated cloud placement (simulator.topology.cloud)",
                "spec": asdict(s)}
    return CostMatrix(lat, bw, p.hostnames, measured, sharing)


def cloud_topology_mapping(p: CloudPlacement, *, name: str, gpu: str = "a100-40gb") -> dict:
    """An explicit topology mapping of the placement; VMs listed in the user's rank order."""
    s = p.spec
    devices: list[dict] = []
    links: list[dict] = []
    us = lambda t: f"{t * 1e6:.4f} us"       # noqa: E731 - exact enough, readable
    gbs = lambda b: f"{b / 1e9:.6f} GB/s"     # noqa: E731
    hosts = sorted(set(int(h) for h in p.host))
    racks = sorted(set(int(r) for r in p.rack))
    zones = sorted(set(int(z) for z in p.zone))
    for i in range(len(p.host)):
        devices.append({"id": f"vm{i}", "kind": "gpu", "node": int(p.host[i])})
    for h in hosts:
        devices.append({"id": f"host{h}", "kind": "switch"})
    for r in racks:
        devices.append({"id": f"rack{r}", "kind": "switch"})
    for z in zones:
        devices.append({"id": f"zone{z}", "kind": "switch"})
    if len(zones) > 1:
        devices.append({"id": "wan", "kind": "wan"})
    for i in range(len(p.host)):
        links.append({"a": f"vm{i}", "b": f"host{int(p.host[i])}", "bandwidth": gbs(s.nic_Bps),
                      "latency": us(p.vm_latency_s[i]), "kind": "nic"})
    rack_of_host = {int(h): int(r) for h, r in zip(p.host, p.rack)}
    zone_of_rack = {int(r): int(z) for r, z in zip(p.rack, p.zone)}
    for h in hosts:
        links.append({"a": f"host{h}", "b": f"rack{rack_of_host[h]}",
                      "bandwidth": gbs(p.host_capacity_Bps[h]), "latency": us(s.host_latency_s),
                      "kind": "fabric"})
    for r in racks:
        links.append({"a": f"rack{r}", "b": f"zone{zone_of_rack[r]}",
                      "bandwidth": gbs(p.rack_capacity_Bps[r]), "latency": us(s.rack_latency_s),
                      "kind": "fabric"})
    if len(zones) > 1:
        for z in zones:
            links.append({"a": f"zone{z}", "b": "wan", "bandwidth": gbs(p.zone_capacity_Bps[z]),
                          "latency": us(s.zone_latency_s), "kind": "wan"})
    return {"name": name,
            "description": f"{len(p.host)} cloud VMs (one GPU each) placed at random on hosts, "
                           f"racks and {s.zones} zones; VMs are listed in the user's rank order, "
                           "which is not the physical order",
            "source": "generated by simulator.topology.cloud (seeded; illustrative numbers after "
                      "Cloud Collectives, papers.md §4.3)",
            "gpu": gpu, "params": {"cloud": asdict(s)},
            "collectives": {"source": "no software cost: the latencies are the path latencies",
                            "alpha": {"default": 0}},
            "devices": devices, "links": links}


def cloud_spec_from_mapping(doc: Mapping[str, Any], *, source: str) -> CloudSpec | None:
    """The generator parameters under ``params.cloud`` of a topology mapping, or ``None``."""
    params = doc.get("params")
    if not isinstance(params, Mapping) or params.get("cloud") is None:
        return None
    c = params["cloud"]
    known = {f.name: f for f in fields(CloudSpec)}
    if not isinstance(c, Mapping):
        raise SpecError("expected a mapping", source=source, field="params.cloud",
                        fix="see simulator/topology/cloud.py for the fields")
    kw = {}
    for k, v in c.items():
        if k not in known:
            raise SpecError(f"unknown field {k!r}", source=source, field=f"params.cloud.{k}",
                            fix=f"use one of: {', '.join(known)}")
        want = int if known[k].type in ("int", int) else float
        if isinstance(v, bool) or not isinstance(v, (int, float)) or \
                (want is int and not isinstance(v, int)) or not math.isfinite(v) or v < 0:
            raise SpecError(f"{v!r} is not a non-negative {want.__name__}", source=source,
                            field=f"params.cloud.{k}", fix="write a number")
        kw[k] = want(v)
    try:
        return replace(CloudSpec(), **kw)
    except SpecError as e:
        raise e.at(source=source) from None


def cloud_topology_yaml(spec: CloudSpec, *, name: str, gpu: str = "a100-40gb") -> str:
    """The YAML text of :func:`cloud_topology_mapping` for ``spec`` (how cloud-64.yaml was made)."""

    doc = cloud_topology_mapping(generate_placement(spec), name=name, gpu=gpu)
    head = yaml.dump({k: v for k, v in doc.items() if k not in ("devices", "links")},
                     Dumper=yaml.SafeDumper, sort_keys=False, width=100, allow_unicode=True)
    out = [f"# Generated by simulator.topology.cloud.cloud_topology_yaml(cloud_spec_for({spec.vms}, "
           f"seed={spec.seed}),",
           f"#   name={name!r}); regenerate rather than edit by hand.",
           "# params.cloud is the generator (clusterplan reorder --topology reads it);",
           "# devices/links render the same placement for the flow simulator, VMs in user rank "
           "order.", head.rstrip()]
    for key in ("devices", "links"):
        out.append(f"{key}:")
        out += ["  - " + yaml.dump(item, Dumper=yaml.SafeDumper, default_flow_style=True,
                                   sort_keys=False, width=200).strip() for item in doc[key]]
    return "\n".join(out) + "\n"
