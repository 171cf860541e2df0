"""The uneven all-to-all probe of ``clusterplan calibrate gloo``: what an all-to-all costs when
the ranks send unequal amounts.

A sharding plan's pooled-embedding all-to-all is uneven: a rank holding wide tables sends more.
A network of per-rank links would finish with the busiest rank, at the time of an equal
exchange of its bytes. Gloo processes sharing a few cores are not such a network: the copies
and the TCP through the kernel are CPU work on shared cores, so a light rank's idle core helps
the heavy one. On the 2-core EPYC VM (2026-11-28, 4 processes) an exchange in which one rank
sent 2.5× the mean took 6.0 / 45 ms at 4 / 32 MiB per rank on average, the equal exchange of
the same total 5.7 / 43 ms and the equal exchange at the busiest rank's bytes 13.2 / 94 ms
(medians of four runs).

The probe times three exchanges of the same per-peer shape at a few sizes: equal at the mean
bytes, skewed (rank ``world - 1`` sends ``(world + 1) / 2`` times the mean, the others half of
it: the same total) and equal at the skewed exchange's busiest rank. ``weight`` places the
skewed time between the other two (0: the mean's time, 1: the busiest rank's), median over
sizes, clipped to [0, 1]; :meth:`simulator.gloo_profile.GlooProfile.comm_time_s` prices an
uneven all-to-all at ``mean + weight · (max − mean)`` bytes per rank. Units: bytes per rank
sent to the other ranks, seconds per call.
"""

from __future__ import annotations

import statistics

from planner.measure.validate.comm_timing import time_calls

__all__ = ["UNEVEN_BYTES", "time_uneven_a2a", "uneven_section"]

#: mean bytes each rank sends to the others per call (fp32 elements × 4)
UNEVEN_BYTES = (1 << 20, 4 << 20, 16 << 20)


def _shapes(world: int, mean_bytes: int) -> dict[str, list[int]]:
    """Elements rank ``r`` sends to each peer, per case."""
    per = max(1, mean_bytes // 4 // max(world - 1, 1))
    heavy = per * (world + 1) // 2
    return {"equal": [per] * world,
            "skewed": [per // 2] * (world - 1) + [heavy],
            "equal_at_max": [heavy] * world}


def _time_case(dist, torch, rank: int, world: int, sends: list[int], repeats: int) -> list:
    out = [0 if q == rank else sends[rank] for q in range(world)]
    inn = [0 if s == rank else sends[s] for s in range(world)]
    x, y = torch.ones(sum(out)), torch.empty(sum(inn))

    def call():
        dist.all_to_all_single(y, x, inn, out)
    return time_calls(dist, call, repeats=repeats, calls=3)


def time_uneven_a2a(dist, torch, rank: int, world: int, *, repeats: int = 5,
                    sizes: tuple = UNEVEN_BYTES) -> dict:
    """This rank's seconds per call, ``{mean bytes: {case: [seconds per repeat]}}``."""
    return {size: {case: _time_case(dist, torch, rank, world, sends, repeats)
                   for case, sends in _shapes(world, size).items()}
            for size in sizes}


def uneven_section(per_rank: list[dict]) -> dict:
    """The profile's ``alltoall_uneven:`` section from every rank's rounds of
    :func:`time_uneven_a2a` (``per_rank[r][round]``): per size the slowest rank's median per
    case, median over rounds, and the weight."""
    rounds = sorted(per_rank[0])
    points, weights = [], []
    for size in sorted(per_rank[0][rounds[0]]):
        t = {}
        for case in ("equal", "skewed", "equal_at_max"):
            per_round = []
            for rnd in rounds:
                reps = zip(*(r[rnd][size][case] for r in per_rank))
                per_round.append(statistics.median(max(rep) for rep in reps))
            t[case] = statistics.median(per_round)
        span = t["equal_at_max"] - t["equal"]
        w = (t["skewed"] - t["equal"]) / span if span > 0 else 1.0
        weights.append(min(1.0, max(0.0, w)))
        points.append([int(size), *(float(f"{t[c]:.4g}") for c in
                                    ("equal", "skewed", "equal_at_max"))])
    return {"alltoall_uneven": {
        "what": "an all-to-all whose ranks send unequal bytes: seconds per call of the equal "
                "exchange at the mean bytes, the skewed one (one rank (world+1)/2 x the mean, the "
                "others half; same total) and the equal one at the busiest rank's bytes; weight "
                "places the skewed time between them (planner/measure/validate/uneven_a2a.py)",
        "points": points,
        "weight": float(f"{statistics.median(weights):.3g}")}}
