"""Rank reordering: measure the network, then choose the rank order (Cloud Collectives, §4).

Modules, one job each:

* measured in :mod:`planner.measure.network.probe` — pairwise latency/bandwidth with torch.distributed
  send/recv (``clusterplan probe``); :mod:`planner.measure.network.emulate` a real ring
  all-reduce over an emulated network.
* :mod:`.model` — alpha-beta times of ring/tree/all-to-all on a cost matrix, with shared links.
* :mod:`.tsp_exact` (brute force, DFJ MIP with CBC), :mod:`.tsp_local` (2-opt/Or-opt),
  :mod:`.bottleneck` (slowest-hop rings) — the ring solvers.
* :mod:`.search` — candidates judged by the model; :mod:`.groups` — LLM plan groups on VMs.
* :mod:`.rankmap` — the order as launcher input; :mod:`planner.cli.reorder` — ``clusterplan reorder``.
"""

from planner.reorder.model import collective_time, ring_allreduce_time
from planner.reorder.rankmap import rank_map
from planner.reorder.search import ReorderResult, reorder

__all__ = ["reorder", "ReorderResult", "rank_map", "collective_time", "ring_allreduce_time"]
