"""Pairwise costs of any topology, and the cost matrix behind a topology name.

:func:`topology_cost_matrix` routes one flow for every ordered GPU pair through the simulator's own
router and records the path latency and the narrowest link's effective capacity (line rate ×
protocol efficiency, divided by the share of the flow the link carries under ECMP). That is what a
probe on the real cluster would measure for each pair alone.

:func:`cost_matrix_for` is what ``clusterplan reorder --topology NAME`` uses: a topology whose file
states a cloud generator under ``params.cloud`` gives the generator's matrix with its shared links
(:mod:`.cloud`); any other topology gives :func:`topology_cost_matrix` without sharing.
"""

from __future__ import annotations

import numpy as np

from simulator.costmatrix import CostMatrix
from simulator.errors import SpecError
from simulator.network.route import route
from simulator.topology.build import build_topology
from simulator.topology.cloud import (
    cloud_spec_from_mapping,
    generate_placement,
    placement_cost_matrix,
)
from simulator.topology.spec import read_topology_mapping

__all__ = ["topology_cost_matrix", "cost_matrix_for", "MAX_PAIRWISE_GPUS"]

#: Largest topology whose n² pairs are routed for a matrix.
MAX_PAIRWISE_GPUS = 4096


def topology_cost_matrix(topo) -> CostMatrix:
    """Latency (s) and bandwidth (bytes/s) of one flow alone between every GPU pair."""

    n = topo.num_gpus
    if n > MAX_PAIRWISE_GPUS:
        raise SpecError(f"{topo.name} has {n:,} GPUs; pairwise costs stop at "
                        f"{MAX_PAIRWISE_GPUS:,}", field="--topology",
                        fix="resize it (NAME:nodes=N) or measure a matrix with clusterplan probe")
    src, dst = np.divmod(np.arange(n * n), n)
    r = route(topo, src, dst)
    cap = topo.effective_capacity_Bps()
    per = cap[r.link] / np.maximum(r.frac, 1e-300)
    bw = np.full(n * n, np.inf)
    np.minimum.at(bw, r.flow, per)
    bw = bw.reshape(n, n)
    lat = r.latency_s.reshape(n, n).copy()
    np.fill_diagonal(bw, 0.0)
    np.fill_diagonal(lat, 0.0)
    hosts = tuple(f"{topo.name}-node{topo.node_of(i)}" for i in range(n))
    return CostMatrix(lat, bw, hosts, {"method": "routed on the topology (one flow per pair)",
                                       "topology": topo.name})


def cost_matrix_for(ref: str) -> CostMatrix:
    """The cost matrix of a built-in topology name or YAML file (see the module docstring)."""

    doc, source = read_topology_mapping(ref)
    spec = cloud_spec_from_mapping(doc, source=source)
    if spec is not None:
        cm = placement_cost_matrix(generate_placement(spec))
        return CostMatrix(cm.latency_s, cm.bandwidth_Bps, cm.hostnames,
                          dict(cm.measured) | {"topology": source}, cm.sharing)
    return topology_cost_matrix(build_topology(doc, source=source))
