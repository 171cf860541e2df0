"""Topologies as data: YAML specs, generators for real fabrics, and the graph they build.

>>> topo = load_topology("dgx-a100")
>>> topo.num_gpus, topo.gpu.name
(8, 'a100-80gb')
"""

from simulator.topology.build import DEFAULT_COMM, build_topology, load_topology, sized_topology_ref
from simulator.topology.model import CommProfile, Hierarchy, LinkTable, Routing, Tier, Topology
from simulator.topology.spec import builtin_topology_names, parse_topology_ref

__all__ = ["load_topology", "build_topology", "builtin_topology_names", "parse_topology_ref",
           "sized_topology_ref",
           "Topology", "LinkTable", "Hierarchy", "Tier", "CommProfile", "Routing", "DEFAULT_COMM"]
