"""Flow-level network: routing, max-min fair sharing, and the SimPy flow scheduler."""

from simulator.network.flows import FlowNetwork, NetworkStats
from simulator.network.symmetric import link_classes, symmetric_reduce
from simulator.network.maxmin import maxmin_rates
from simulator.network.route import Routes, route, route_to_node_switch

__all__ = ["FlowNetwork", "NetworkStats", "Routes", "route", "route_to_node_switch",
           "maxmin_rates", "link_classes", "symmetric_reduce"]
