"""The gloo profile document (``format: clusterplan.gloo-profile``) from the raw rows of one
or several ``clusterplan calibrate gloo`` runs (:mod:`planner.measure.validate.calibrate`).

Every rank measured the same thing at the same time, so each entry is the slowest rank's time
per round and the median over rounds, with the spread between rounds recorded as its
``noise``: the collectives by kind and size (:func:`comm_tables`, made monotone in size), one
core's matmul, attention and memory curves relative to their peaks and the per-op dispatch
(:func:`compute_section`), eager PyTorch's host time per block (:func:`host_section`), the
wake-up penalty after compute (:func:`wake_section`, a nonnegative line through the points),
and the sections of the TorchRec, lookup, permute, linear-layer, uneven all-to-all and
page-fault probes. Times are seconds, sizes bytes.
"""

from __future__ import annotations

import datetime
import os
import statistics
from dataclasses import replace

from simulator.gloo_profile import CommTable, gloo_profile_from_dict

from planner.machine import MMAP_THRESHOLD_BYTES, platform_description
from planner.measure.validate.calibrate_dlrm import lookup_sections, merge_torchrec
from planner.measure.validate.comm_timing import alltoallv_chunk
from planner.measure.validate.core_probes import WAKE_PROBE_BYTES, WAKE_SEGMENTS
from planner.measure.validate.dlrm_linear import linear_section
from planner.measure.validate.dlrm_permute import permute_section
from planner.measure.validate.uneven_a2a import uneven_section

__all__ = ["KINDS", "profile_document", "profile_from_raw", "comm_tables", "compute_section",
           "host_section", "wake_section", "fresh_section"]

#: the collectives a calibration times, in the profile's order
KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "alltoallv", "broadcast",
         "sendrecv")


def profile_from_raw(raws: list[dict]) -> dict:
    """The profile mapping of one or several
    :func:`planner.measure.validate.calibrate.measure_gloo_raw` runs of the same calibration
    (several: each run's rounds count as rounds of one calibration, so runs spread over a
    benchmark average the machine's slow and fast spells as its measurements do)."""
    if not raws:
        raise ValueError("profile_from_raw needs at least one run")
    rounds = [r["cfg"].rounds for r in raws]
    cfg = replace(raws[0]["cfg"], rounds=sum(rounds))
    ranks = [_renumbered([r["ranks"][i] for r in raws], rounds)
             for i in range(len(raws[0]["ranks"]))]
    other = statistics.fmean(r["other_cores"] for r in raws)
    doc = profile_document(ranks, cfg, load={"other_cores": _sig(other, 3),
                                             "runs": len(raws)})
    torchrec = merge_torchrec([r["torchrec"] for r in raws if r["torchrec"] is not None])
    if torchrec is not None:
        doc["torchrec"] = torchrec
    gloo_profile_from_dict(doc)          # what we write must load
    return doc


def _renumbered(rank_rows: list[dict], rounds: list[int]) -> dict:
    """One rank's rows of several runs as one run's, rounds numbered on from run to run."""
    out = {"rank": rank_rows[0]["rank"], "comm": {}, "compute": {}, "host": {}, "wake": {},
           "cpu": [0.0, 0.0]}
    base = 0
    for rows, n in zip(rank_rows, rounds):
        for (rnd, kind, size), v in rows["comm"].items():
            out["comm"][(base + rnd, kind, size)] = v
        for key in ("compute", "host", "wake", "lookup", "lookup_series", "permute", "uneven",
                    "linear"):
            for rnd, v in rows.get(key, {}).items():
                out.setdefault(key, {})[base + rnd] = v
        out["cpu"] = [a + b for a, b in zip(out["cpu"], rows["cpu"])]
        base += n
    return out


def profile_document(ranks: list[dict], cfg, *, load: dict | None = None) -> dict:
    """The profile mapping from the ranks' raw rows of calibration ``cfg``
    (:class:`planner.measure.validate.calibrate.GlooCalibration`)."""
    world, rounds = cfg.world, cfg.rounds
    comm, noise_comm = comm_tables(ranks, cfg)
    compute, noise_compute = compute_section(ranks, rounds)
    host, host_rounds = host_section(ranks, rounds)
    wake, wake_raw = wake_section(ranks, rounds, comm[f"allreduce@{world}"])
    cpu_used = sum(r["cpu"][0] for r in ranks)
    wall = max(r["cpu"][1] for r in ranks)
    return {
        "format": "clusterplan.gloo-profile",
        "version": 1,
        "what": "torch.distributed gloo on this machine, measured by clusterplan calibrate gloo",
        "measured": {"date": datetime.datetime.now().isoformat(timespec="seconds"),
                     "machine": _machine(), "processes": world, "threads_per_process": 1,
                     "heap": cfg.heap,
                     "rounds": rounds, "repeats": cfg.repeats, "wall_s": _sig(wall),
                     "our_cpu_s": _sig(cpu_used), **(load or {})},
        "shared_core": True,
        "comm": comm,
        "wake_penalty_s": wake,
        "wake_penalty_measured_s": wake_raw,
        "compute": compute,
        **_probe_sections(ranks, rounds, world),
        "host_block_s": host["swiglu"],
        "host_block_gelu_s": host["gelu"],
        f"host_block_tp{world}_s": host[f"tp{world}"],
        "noise": {"what": "relative spread (max-min)/median between rounds, per entry",
                  "comm": noise_comm, **noise_compute,
                  "host": {key: {k: _sig(_median_rel_spread(v)) for k, v in per.items()}
                           for key, per in host_rounds.items()},
                  "host_rounds_s": host_rounds},
    }


def comm_tables(ranks: list[dict], cfg) -> tuple[dict, dict]:
    """Per kind the table ``[[bytes, seconds], ...]`` (key ``kind@world``, bytes in the
    kind's convention, :func:`_bytes`) and the median and largest spread between rounds."""
    world, rounds = cfg.world, cfg.rounds
    comm, noise = {}, {}
    for kind in KINDS:
        rows, spreads = [], []
        for size in cfg.sizes:
            per_round = []
            for rnd in range(rounds):
                reps = zip(*(r["comm"][(rnd, kind, size)] for r in ranks))
                per_round.append(statistics.median(max(rep) for rep in reps))
            rows.append([float(_bytes(kind, size, world)), _sig(statistics.median(per_round))])
            spreads.append(_median_rel_spread(per_round))
        # sizes rounded to a multiple of the world can coincide (4 and 8 B on 4 ranks): keep
        # the first of each, so the table's sizes increase
        rows = [r for i, r in enumerate(rows) if i == 0 or r[0] > rows[i - 1][0]]
        # a size measured no slower than a larger one keeps the table monotone in time
        for i in range(len(rows) - 2, -1, -1):
            rows[i][1] = min(rows[i][1], rows[i + 1][1])
        comm[f"{kind}@{world}"] = rows
        noise[kind] = {"median": _sig(statistics.median(spreads)), "max": _sig(max(spreads))}
    return comm, noise


def _merged(ranks: list[dict], rounds: int, key: str) -> list[tuple[float, float, float]]:
    """``(size, seconds, spread)`` per point of compute probe ``key``: per round the slowest
    rank's time (they ran side by side), the median over rounds."""
    out = []
    for i in range(len(ranks[0]["compute"][0][key])):
        per_round = [max(r["compute"][rnd][key][i][1] if key != "launch"
                         else r["compute"][rnd][key][i] for r in ranks)
                     for rnd in range(rounds)]
        size = ranks[0]["compute"][0][key][i][0] if key != "launch" else 0.0
        out.append((size, statistics.median(per_round), _median_rel_spread(per_round)))
    return out


def compute_section(ranks: list[dict], rounds: int) -> tuple[dict, dict]:
    """One core's compute profile (peak FLOP/s and bytes/s, dispatch seconds, the matmul,
    attention and memory efficiency curves) and the matmul and memory noise."""
    launch = _merged(ranks, rounds, "launch")[0][1]
    mm = _merged(ranks, rounds, "matmul")

    def net(t: float) -> float:        # an op's time without its dispatch (at least half)
        return max(t - launch, 0.5 * t)
    rates = [(f, f / net(t)) for f, t, _ in mm]
    peak = max(r for _, r in rates)
    by_flops: dict[float, list[float]] = {}
    for f, r in rates:
        by_flops.setdefault(f, []).append(r / peak)
    attn = {}
    for key in ("attention", "attention_backward"):
        by: dict[float, list[float]] = {}
        for f, t, _ in _merged(ranks, rounds, key):
            by.setdefault(f, []).append(f / net(t) / peak)
        attn[key] = [[f, _sig(min(1.0, statistics.median(v)), 3)] for f, v in sorted(by.items())]
    mem = _merged(ranks, rounds, "memory")
    mrates = [(b, b / net(t)) for b, t, _ in mem]
    mpeak = max(r for _, r in mrates)
    compute = {"peak_fp32_flops": _sig(peak), "memory_bandwidth_Bps": _sig(mpeak),
               "launch_overhead_s": _sig(launch),
               "matmul_fp32": [[f, _sig(statistics.median(v), 3)]
                               for f, v in sorted(by_flops.items())],
               "memory": [[b, _sig(r / mpeak, 3)] for b, r in mrates],
               "attention_fp32": attn["attention"],
               "attention_backward_fp32": attn["attention_backward"]}
    noise = {name: {"median": _sig(statistics.median(s for *_, s in pts)),
                    "max": _sig(max(s for *_, s in pts))}
             for name, pts in (("matmul", mm), ("memory", mem))}
    return compute, noise


def host_section(ranks: list[dict], rounds: int) -> tuple[dict, dict]:
    """Per block kind the host seconds of a forward and a backward pass (the slowest rank's,
    median over rounds), and every round's."""
    host, host_rounds = {}, {}
    for key in ranks[0]["host"][0]:
        per = {k: [max(r["host"][rnd][key][k] for r in ranks) for rnd in range(rounds)]
               for k in ("forward", "backward")}
        host[key] = {k: _sig(statistics.median(v)) for k, v in per.items()}
        host_rounds[key] = {k: [_sig(x) for x in v] for k, v in per.items()}
    return host, host_rounds


def wake_section(ranks: list[dict], rounds: int, allreduce: list) -> tuple[list, list]:
    """The wake-up penalty ``[[gap_s, extra_s], ...]``: per gap the slowest rank's extra time,
    minus the back-to-back call's (from the ``allreduce`` table); single points are noisy (the
    ranks' skew after a long segment varies from run to run), so a line extra = a + b·gap
    (a, b ≥ 0) is fitted through them and written at the gaps; and the points measured."""
    world = len(ranks)
    probe = CommTable("allreduce", world, tuple(r[0] for r in allreduce),
                      tuple(r[1] for r in allreduce)).time_s(WAKE_PROBE_BYTES)
    raw = []
    for i in range(len(WAKE_SEGMENTS)):
        gap = statistics.median(max(r["wake"][rnd][i][0] for r in ranks) for rnd in range(rounds))
        extra = statistics.median(max(r["wake"][rnd][i][1] for r in ranks)
                                  for rnd in range(rounds))
        raw.append([_sig(gap), _sig(max(0.0, extra - probe))])
    raw.sort()
    return [[g, _sig(e)] for g, e in _nonneg_line(raw)], raw


def _probe_sections(ranks: list[dict], rounds: int, world: int) -> dict:
    """The sections of the probes a calibration may have run: lookups, permutes, linear
    layers, uneven all-to-alls, new tensors' page faults."""
    first = ranks[0]
    return {
        **(lookup_sections([r["lookup"] for r in ranks], world, os.cpu_count() or 1,
                           series=[r.get("lookup_series", {}) for r in ranks])
           if "lookup" in first else {}),
        **({"permute_pooled": permute_section([r["permute"] for r in ranks])}
           if "permute" in first else {}),
        **({"linear_layers": linear_section([r["linear"] for r in ranks])}
           if "linear" in first else {}),
        **(uneven_section([r["uneven"] for r in ranks]) if "uneven" in first else {}),
        **({"fresh_alloc": fresh_section(ranks, rounds)}
           if first["compute"][0].get("fresh") else {})}


def fresh_section(ranks: list[dict], rounds: int) -> dict:
    """Page-fault cost of new tensors: per size the slowest rank's extra time of a new tensor
    over a reused one (median over rounds), and the bytes per second above the mmap threshold."""
    points = []
    for i, row in enumerate(ranks[0]["compute"][0]["fresh"]):
        extra = statistics.median(max(r["compute"][rnd]["fresh"][i][1]
                                      - r["compute"][rnd]["fresh"][i][2] for r in ranks)
                                  for rnd in range(rounds))
        points.append([row[0], _sig(max(0.0, extra))])
    above = [b / e for b, e in points if b > MMAP_THRESHOLD_BYTES and e > 0]
    return {"what": "extra seconds of torch.empty(n).fill_ over filling a kept tensor, by bytes",
            "threshold_bytes": MMAP_THRESHOLD_BYTES, "points": points,
            "Bps": _sig(statistics.median(above)) if above else None}


def _nonneg_line(points: list) -> list:
    """Least-squares a + b·x through (x, y) points with a, b ≥ 0, evaluated at each x."""
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx) if sxx > 0 else 0.0
    a = my - b * mx
    if a < 0:                               # through the origin instead
        a, b = 0.0, max(0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs))
    return [(x, a + b * x) for x in xs]


def _bytes(kind: str, size: int, world: int) -> int:
    """The bytes a ``kind`` probe of ``size`` moved, in its table's convention."""
    if kind == "alltoallv":
        return 4 * alltoallv_chunk(size, world) * (world - 1)
    n = max(1, size // 4)
    if kind in ("allgather", "reducescatter", "alltoall"):
        n = max(world, n - n % world)
    return 4 * n


def _median_rel_spread(values: list[float]) -> float:
    m = statistics.median(values)
    return (max(values) - min(values)) / m if m > 0 else 0.0


def _sig(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def _machine() -> dict:
    """This machine as the other measurements describe it, plus the torch version."""
    import torch

    return {**platform_description(), "torch": str(torch.__version__)}
