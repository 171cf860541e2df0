"""Where a layout's parallel groups land on a multi-building topology (ScaleAcross).

A parallel axis *crosses* the building boundary when one of its groups holds ranks in more than
one building: its collectives (TP/CP/DP) or sends (PP) then use the inter-building links.
"Mixed" placements cross with two axes at once, e.g. four buildings with ``pp = 2`` outermost:
each pipeline stage spans two buildings, so its data-parallel reduction crosses too.
"""

from __future__ import annotations

from simulator.topology import Topology

from planner.model.llm.layout import AXES, Layout

__all__ = ["building_of_ranks", "crossing_axes", "stages_per_building"]


def building_of_ranks(topo: Topology) -> list[int]:
    """Building index of every rank (0 on single-building topologies)."""
    return [int(topo.devices[g].get("building", 0)) for g in topo.gpus]


def _group_starts(lay: Layout, axis: str, limit: int = 256) -> list[int]:
    """Ranks whose ``axis`` coordinate is 0 (one per group), at most ``limit`` spread evenly."""
    starts = [r for r in range(lay.world) if lay.coords(r)[axis] == 0] \
        if lay.world <= 4096 else [lay.rank(**{a: 0 for a in AXES})]
    if len(starts) <= limit:
        return starts
    step = len(starts) / limit
    return [starts[int(i * step)] for i in range(limit)]


def crossing_axes(lay: Layout, topo: Topology) -> list[str]:
    """Axes (outermost first) with a group spanning more than one building."""
    where = building_of_ranks(topo)
    if len(set(where)) <= 1:
        return []
    out = []
    for axis in reversed(lay.order.split("-")):
        if getattr(lay, axis) == 1:
            continue
        if lay.world > 4096:
            # regular layouts on equal, contiguous buildings: the group of one rank per
            # building tells for all of them
            firsts = {where.index(b) for b in set(where)}
            starts = sorted({lay.group(axis, r)[0] for r in firsts})
        else:
            starts = _group_starts(lay, axis)
        if any(len({where[r] for r in lay.group(axis, s)}) > 1 for s in starts):
            out.append(axis)
    return out


def stages_per_building(lay: Layout, topo: Topology) -> list[int]:
    """Number of pipeline stages with ranks in each building, building by building."""
    where = building_of_ranks(topo)
    n = max(where) + 1
    stages: list[set[int]] = [set() for _ in range(n)]
    for r in range(lay.world):
        stages[where[r]].add(lay.coords(r)["pp"])
    return [len(x) for x in stages]
