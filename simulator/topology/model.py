"""The topology every other part of the simulator reads: a networkx graph plus fast link tables.

Devices are graph nodes with a ``kind`` (gpu, cpu, nvswitch, pcie_switch, nic, switch, wan); links
are directed edges, one per direction, with ``bandwidth`` (bytes/s), ``latency`` (s), a link
``kind`` (nvlink, pcie, nic, fabric, wan, loopback) and an integer ``id`` indexing the arrays of
:class:`LinkTable`, which the flow solver uses instead of the graph.

Generated hierarchical fabrics also carry a :class:`Hierarchy` that routes flows arithmetically
(vectorised numpy) instead of by graph search; hand-written graphs are routed on the graph.
:class:`Routing` says how a flow uses equal-cost paths: spread ideally over all of them, or
pinned to one hashed path (ECMP as switches do it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Mapping

import numpy as np

from simulator.hardware import GPUSpec

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["LINK_KINDS", "DEVICE_KINDS", "ROUTING_MODES", "LinkTable", "Hierarchy", "Tier",
           "CommProfile", "Routing", "Topology"]

#: derived structures a topology keeps (:meth:`Topology.memoized`; routes of a few thousand
#: flows each)
MEMO_ENTRIES = 4096

LINK_KINDS = ("nvlink", "pcie", "nic", "fabric", "wan", "loopback")
DEVICE_KINDS = ("gpu", "cpu", "nvswitch", "pcie_switch", "nic", "switch", "wan")
ROUTING_MODES = ("ideal", "ecmp")


@dataclass(frozen=True, slots=True)
class Routing:
    """How flows use equal-cost paths (the ``network:`` section of a topology file).

    Attributes
    ----------
    mode : str
        ``ideal``: every flow is split evenly over all equal-cost paths (a bundle of uplinks is
        one link of their summed capacity), the behaviour before this option existed and the
        default. ``ecmp``: a switch hashes each flow's header onto *one* of its equal-cost
        uplinks, so several flows can share an uplink while others idle (RoCE and IP fabrics;
        Llama 3 §3.3.1 runs 16 flows per GPU pair and Enhanced-ECMP against exactly this).
    qps : int
        Sub-flows each simulated flow is cut into, each hashed on its own: NCCL spreads a
        connection's data round-robin over ``NCCL_IB_QPS_PER_CONNECTION`` queue pairs (default
        1 in the NCCL documentation), each a separate 5-tuple. Since the chunks go round-robin,
        a flow moves at the pace of its slowest sub-flow; that is how it is simulated (one flow
        with a ``1/qps`` share on each hashed path). For channels × QPs per connection give the
        product.
    seed : int
        Hash seed: the same topology, flows and seed give the same paths (a different seed is
        another draw of the switches' hash functions).
    port_Bps : float or None
        Line rate of one uplink port, bytes/s, which sets how many equal-cost ports a bundle
        stands for (bundle capacity / port rate); None: the node NIC's rate.
    """

    mode: str = "ideal"
    qps: int = 1
    seed: int = 0
    port_Bps: float | None = None

    @property
    def ecmp(self) -> bool:
        """True when flows are hashed onto single paths."""
        return self.mode == "ecmp"

    def to_dict(self) -> dict:
        """The settings as plain JSON values (bandwidth in bytes/s)."""
        return {"mode": self.mode, "qps": self.qps, "seed": self.seed, "port_Bps": self.port_Bps}


@dataclass(frozen=True, slots=True)
class LinkTable:
    """Directed links as parallel arrays indexed by link id.

    Attributes
    ----------
    src, dst : tuple of str
        Node ids at each end.
    bandwidth_Bps : np.ndarray
        Line rate per direction, bytes/s (all parallel physical links of a bundle together).
    latency_s : np.ndarray
        One-way latency of the hop, seconds.
    kind : tuple of str
        Link kind, one of :data:`LINK_KINDS`.
    count : np.ndarray
        Physical links aggregated in the bundle (1 for a single cable).
    """

    src: tuple[str, ...]
    dst: tuple[str, ...]
    bandwidth_Bps: np.ndarray
    latency_s: np.ndarray
    kind: tuple[str, ...]
    count: np.ndarray
    tier: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Arithmetic routing tables of a generated tree-of-bundles fabric.

    A GPU flow leaves its node through a NIC (selected by rail), climbs levels until it reaches a
    unit that contains the destination, and descends. Level 0 is the NIC, level 1 the leaf switch,
    then one level per further tier, then the inter-building level. The unit of node ``n`` on rail
    ``r`` at level ``k`` is ``node_unit[k][n] * rail_mult[k] + r`` when ``rail_mult[k] > 0`` (rails
    are kept apart at that level) and ``node_unit[k][n]`` otherwise. ``up[k][u]`` / ``down[k][u]``
    are the link ids from unit ``u`` of level ``k`` to its parent and back (-1 at the top).
    Equal-cost multipath inside a tier is folded into bundles (ideal ECMP), so routes are unique.

    Under ``ecmp`` routing each bundle above the NICs also exists as its separate ports (links
    appended after every other link, so the ids of the others do not change, and left out of
    :attr:`Topology.graph`): ``port_first[k][u]`` is the id of unit ``u``'s first upward port
    at level ``k`` (-1: none), ``port_count[k][u]`` how many; port ``j`` goes up on id
    ``port_first + 2j`` and comes down on ``port_first + 2j + 1``. ``graph_links``: how many
    links (from id 0) the graph shows; None: all.
    """

    gpus_per_node: int
    nics_per_node: int
    node_of_gpu: np.ndarray
    local_of_gpu: np.ndarray
    rail_of_gpu: np.ndarray
    gpu_up: np.ndarray        # gpu -> node switch (nvlink / pcie)
    gpu_down: np.ndarray
    gpu_nic_up: np.ndarray    # gpu -> own nic (pcie), -1 when the node has no nic
    gpu_nic_down: np.ndarray
    node_unit: tuple[np.ndarray, ...]
    rail_mult: tuple[int, ...]
    up: tuple[np.ndarray, ...]
    down: tuple[np.ndarray, ...]
    level_names: tuple[str, ...]
    node_switch_reduces: bool  # NVLink SHARP (NVLS)-style in-switch reduction inside a node
    node_switch: tuple[str, ...]  # per node: the id of the intra-node switch device
    building_of_node: np.ndarray
    port_first: tuple[np.ndarray, ...] | None = None
    port_count: tuple[np.ndarray, ...] | None = None
    graph_links: int | None = None


@dataclass(frozen=True, slots=True)
class Tier:
    """One switching tier for summaries: units, down and up capacity per unit, bytes/s."""

    name: str
    units: int
    down_Bps_per_unit: float
    up_Bps_per_unit: float
    latency_s: float

    @property
    def oversubscription(self) -> float:
        return self.down_Bps_per_unit / self.up_Bps_per_unit if self.up_Bps_per_unit else float("inf")


@dataclass(frozen=True, slots=True)
class CommProfile:
    """Calibrated collective parameters kept as data in the topology file.

    Attributes
    ----------
    alpha_s : Mapping[str, float]
        Per-step software/protocol latency of each algorithm (ring, tree, nvls, direct, pairwise,
        halving_doubling, p2p), seconds. NCCL's per-step launch and synchronisation cost.
    efficiency : Mapping[str, float]
        Fraction of the line rate a collective achieves on each link kind (protocol headers,
        flow control, chunking), in (0, 1].
    local_Bps : Mapping[str, float]
        Rate of the per-byte local pass an algorithm makes over the user buffer on each rank
        (copies in and out of the communication buffers), bytes/s; its time ``size / rate`` adds
        to the collective. Absent means no such cost. NCCL's measured bus bandwidth inside a node
        grows with the GPU count (vTrain A100 tables: 197 GB/s at 2 GPUs, 229 at 8), which a
        pure alpha-beta ring cannot produce; this term does.
    source : str
        Where the numbers come from (a fit to a measured table, a datasheet, a default).
    """

    alpha_s: Mapping[str, float]
    efficiency: Mapping[str, float]
    source: str = "defaults"
    local_Bps: Mapping[str, float] = field(default_factory=dict)

    def alpha(self, algorithm: str) -> float:
        return float(self.alpha_s.get(algorithm, self.alpha_s.get("default", 5e-6)))

    def local_time(self, algorithm: str, nbytes: float) -> float:
        """Seconds of the per-byte local pass of ``algorithm`` over ``nbytes``."""
        rate = self.local_Bps.get(algorithm, self.local_Bps.get("default"))
        return float(nbytes) / rate if rate else 0.0


@dataclass(frozen=True)
class Topology:
    """A cluster: GPUs in global rank order, the device/link graph, link tables and profiles.

    ``gpus[i]`` is the graph node of global rank ``i``; ranks are numbered building-major, then
    node, then local GPU index, which is the launch order of torchrun and of the trainers.
    ``devices`` maps every device id to its attributes (``kind``, ``node`` ...); :attr:`graph`
    is built from it and the link table on first use, so huge generated fabrics stay cheap.
    """

    name: str
    source: str
    gpu: GPUSpec
    devices: Mapping[str, Mapping[str, object]]
    gpus: tuple[str, ...]
    links: LinkTable
    comm: CommProfile
    tiers: tuple[Tier, ...]
    hierarchy: Hierarchy | None
    params: Mapping[str, object] = field(default_factory=dict)
    description: str = ""
    routing: Routing = field(default_factory=Routing)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The device/link graph (networkx, imported here: most runs never draw or search it),
        one directed edge per link direction."""
        import networkx as nx

        g = nx.DiGraph(name=self.name)
        g.add_nodes_from(self.devices.items())
        lt = self.links
        h = self.hierarchy
        # ECMP ports run parallel to their bundle: the graph keeps one edge per device pair
        shown = h.graph_links if h is not None and h.graph_links is not None else len(lt)
        g.add_edges_from(
            (lt.src[i], lt.dst[i], {"id": i, "bandwidth": float(lt.bandwidth_Bps[i]),
                                    "latency": float(lt.latency_s[i]), "kind": lt.kind[i],
                                    "count": int(lt.count[i]), "tier": lt.tier[i]})
            for i in range(shown))
        return g

    @cached_property
    def _memo(self) -> dict:
        return {}

    def memoized(self, key: tuple, make):
        """``make()`` once per ``key`` on this topology, then kept: structures derived from it
        on demand (a collective group's routes, its link classes); not part of its identity.
        At most :data:`MEMO_ENTRIES` are kept (all are dropped when it is full)."""
        memo = self._memo
        if key not in memo:
            if len(memo) >= MEMO_ENTRIES:
                memo.clear()
            memo[key] = make()
        return memo[key]

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def num_nodes(self) -> int:
        if self.hierarchy is not None:
            return int(self.hierarchy.node_of_gpu.max()) + 1
        return len({self.devices[g].get("node", g) for g in self.gpus})

    @property
    def gpus_per_node(self) -> int:
        if self.hierarchy is not None:
            return self.hierarchy.gpus_per_node
        return max(1, self.num_gpus // max(1, self.num_nodes))

    def node_of(self, rank: int) -> int:
        """Host index of a global rank."""
        if self.hierarchy is not None:
            return int(self.hierarchy.node_of_gpu[rank])
        return int(self.devices[self.gpus[rank]].get("node", rank))

    def effective_capacity_Bps(self) -> np.ndarray:
        """Per-link capacity a collective can use: line rate × protocol efficiency of its kind."""
        return self._effective_capacity

    @cached_property
    def _effective_capacity(self) -> np.ndarray:
        kinds = {k: self.comm.efficiency.get(k, 1.0) for k in set(self.links.kind)}
        eff = np.fromiter((kinds[k] for k in self.links.kind), dtype=float,
                          count=len(self.links.kind))
        cap = self.links.bandwidth_Bps * eff
        cap.setflags(write=False)
        return cap
