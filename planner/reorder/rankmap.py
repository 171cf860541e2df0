"""The chosen order as launcher input: host order, rank → host, and torchrun settings.

``order[k]`` is the measured rank (VM) that should become global rank ``k``. Launchers place ranks
by host: torchrun gives host ``node_rank`` the ranks ``node_rank · nproc … + nproc − 1``, so the
order is expressible with torchrun exactly when every host's new ranks form one contiguous block
of equal size; then the host order *is* the rank order (one VM per host: always). Otherwise an
explicit per-rank map is needed (MPI rankfile, or a ``RANK`` remap in the training script), and
``torchrun_ok`` is false.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["rank_map"]


def rank_map(order: Sequence[int], hostnames: Sequence[str]) -> dict:
    """Rank map document (format ``clusterplan.rank-map``, the exporters' shape) for ``order``."""
    order = [int(x) for x in order]
    hosts_in_order: list[str] = []
    blocks: dict[str, list[int]] = {}
    for k, old in enumerate(order):
        h = hostnames[old]
        if h not in blocks:
            hosts_in_order.append(h)
            blocks[h] = []
        blocks[h].append(k)
    sizes = {len(v) for v in blocks.values()}
    contiguous = all(v == list(range(v[0], v[0] + len(v))) for v in blocks.values())
    torchrun_ok = contiguous and len(sizes) == 1
    node_rank = {h: i for i, h in enumerate(hosts_in_order)}
    local = {}
    for h, ranks in blocks.items():
        for i, k in enumerate(ranks):
            local[k] = i
    return {
        "format": "clusterplan.rank-map", "schema_version": 1, "world_size": len(order),
        "torchrun_ok": torchrun_ok,
        "nproc_per_node": sizes.pop() if torchrun_ok else None,
        "hosts": [{"name": h, "node_rank": i, "ranks": blocks[h]}
                  for i, h in enumerate(hosts_in_order)],
        "ranks": [{"rank": k, "measured_rank": old, "host": hostnames[old],
                   "node_rank": node_rank[hostnames[old]], "local_rank": local[k]}
                  for k, old in enumerate(order)],
    }
