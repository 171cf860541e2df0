"""TorchRec probes of ``clusterplan calibrate gloo``: what a DLRM step costs beyond its kernels.

A TorchRec ``DistributedModelParallel`` step on CPU spends a good part of its time in Python and
small tensor ops around the collectives and the FBGEMM kernels: building, splitting and
permuting ``KeyedJaggedTensor``s for the input dist, bucketising ids by row block (row-wise),
the awaitables and the autograd nodes of the dists, DDP around data-parallel lookups. None of
that is in the collectives' tables or the kernels' curves. So the calibration runs **probe
plans** on the same pool and with the same worker as ``clusterplan validate``
(:mod:`planner.measure.validate.dlrm_worker`: pinned ranks, one thread each, inputs made before the
timed steps), right after the gloo measurements:

- per sharding type (table-wise, column-wise, row-wise, data-parallel) two plans of
  :data:`PROBE_TABLES` tables of that type (dim :data:`PROBE_DIM`), no dense part: ``small``
  (:data:`PROBE_SMALL` samples per rank, one id per bag: the zero-size intercept, like an
  empty kernel's launch time) and ``large`` (:data:`PROBE_LARGE` samples per rank,
  :data:`PROBE_POOLING` ids per bag, bigger tables for data-parallel): the size-dependent part;
  two rounds over all eight (a whole run of a small step is sometimes 20-40% slower than the
  next), 15 steps after 3 warm-up each.

A second, smaller probe times the **lookups themselves under the run's conditions**
(:func:`~planner.measure.validate.lookup_probe.time_lookup_probe`, inside every calibration
round of ``clusterplan calibrate gloo``):
one fused FBGEMM TBE of :data:`LOOKUP_TABLES` (forward and backward with the fused SGD update,
the global batch :data:`LOOKUP_BATCH`) on every rank at once, pinned to one thread each as the
TorchRec ranks are, sharing the cores and the last-level cache. The CPU embedding profile
(``traces/calibration/cpu-embedding.yaml``) was fitted to kernels timed alone; the ratio of the
probe's measured time to that profile's prediction (:func:`lookup_scale`) scales every lookup
of the validated plans (``CostConfig.lookup_time_scale``). Like the probe plans, it is a
microbenchmark: nothing in it comes from the plans being validated.

Only the probes' measured steps (median of the slowest rank, as validation measures; the mean of
the rounds) are stored
(``torchrec:`` in the profile); the probes are rebuilt from this module's constants
(:func:`probe_config`). The prediction (:func:`planner.measure.validate.dlrm_report.predicted`)
simulates each probe with the same model it uses for a real plan and finds the host seconds
per rank that make the model reproduce the measured probe (:func:`host_costs`): a line per type
in the type's size measure (:func:`size_measure`: ids a rank sends plus receives in the type's
values all-to-all; data-parallel: the table bytes a rank holds), intercept and slope never
below zero. Nothing is fitted to the plans being validated.
"""

from __future__ import annotations

import importlib.util
import statistics
from dataclasses import replace

from planner.measure.validate.dlrm_probes import PROBE_TYPES, probe_config
from planner.measure.validate.dlrm_report import measure
from planner.measure.validate.lookup_probe import LOOKUP_BATCH, LOOKUP_TABLES, host_mean

__all__ = ["measure_torchrec", "merge_torchrec", "lookup_sections"]


def measure_torchrec(pool, world: int, *, quick: bool = False, rounds: int | None = None
                     ) -> dict:
    """Run every probe on ``pool`` and return the profile's ``torchrec`` section (None
    where TorchRec or FBGEMM is not installed); ``rounds`` overrides the runs per probe (1 in
    quick mode, else 2)."""
    if not all(importlib.util.find_spec(m) for m in ("torchrec", "fbgemm_gpu")):
        return None
    steps, warmup, default_rounds = (4, 2, 1) if quick else (15, 3, 2)
    rounds = default_rounds if rounds is None else rounds
    got: dict[tuple[str, str], list] = {}
    # rounds over all probes (not one probe twice in a row): a whole run of a small step is
    # sometimes 20-40% slower than the next, so each probe is the mean of separate runs
    for _ in range(rounds):
        for kind in PROBE_TYPES:
            for size in ("small", "large"):
                cfg = replace(probe_config(kind, size, world, steps=steps, warmup=warmup),
                              heap=pool.heap)
                m = measure(cfg, pool.run(cfg))
                got.setdefault((kind, size), []).append((m["step_time_s"], _spread(m["steps_s"])))
    rows = [{"sharding_type": kind, "size": size,
             "step_s": float(f"{statistics.fmean(t for t, _ in v):.4g}"),
             "runs_s": [float(f"{t:.4g}") for t, _ in v],
             "spread": float(f"{max(s_ for _, s_ in v):.3g}")} for (kind, size), v in got.items()]
    return {"what": "TorchRec DMP probe plans on this pool (planner/measure/validate/calibrate_dlrm.py): "
                    "median step of the slowest rank per run, mean over runs",
            "world": world, "steps": steps, "warmup": warmup, "rounds": rounds, "probes": rows}


def merge_torchrec(sections: list[dict]) -> dict | None:
    """One ``torchrec`` section from several runs' (each probe the mean over all their runs);
    None when there are none."""
    if not sections:
        return None
    if len(sections) == 1:
        return sections[0]
    runs: dict[tuple[str, str], list] = {}
    for sec in sections:
        for p in sec["probes"]:
            v = runs.setdefault((p["sharding_type"], p["size"]), [[], 0.0])
            v[0].extend(p["runs_s"])
            v[1] = max(v[1], p["spread"])
    rows = [{"sharding_type": kind, "size": size, "step_s": float(f"{statistics.fmean(t):.4g}"),
             "runs_s": t, "spread": spread} for (kind, size), (t, spread) in runs.items()]
    return {**sections[0], "rounds": sum(s["rounds"] for s in sections), "probes": rows}


def _spread(xs) -> float:
    m = statistics.median(xs)
    return (max(xs) - min(xs)) / m if m > 0 else 0.0


# -- the co-running lookup probe ------------------------------------------------------------


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def lookup_sections(per_rank: list[dict], world: int, cores: int,
                    series: list[dict] | None = None) -> dict:
    """The profile's ``lookup`` and ``contention`` sections from each rank's ``{round:
    (together_s, alone_s)}`` of :func:`~planner.measure.validate.lookup_probe.time_lookup_probe`
    and, when given, each rank's ``{round: [seconds, ...]}`` of the readings between stages
    (:class:`~planner.measure.validate.lookup_probe.ProbeSeries`).

    ``lookup.measured_s`` (what scales the plans' lookups): the trimmed mean
    (:func:`~planner.measure.validate.lookup_probe.host_mean`) over every reading of the
    slowest rank's seconds: each round's probe together (median of its pairs) and every
    reading of the series. The mean, not the median: a host whose cores switch between a fast
    and a slow state within seconds runs a plan's steps at its average speed, and the median
    of readings each caught in one state lands in either. ``rounds_s``: the probe per round;
    ``readings_s``: those, then the series' readings round by round.
    ``contention.alone_speedup``: the probe together, at the share of a core each of ``world``
    ranks had on ``cores`` cores, over the median rank alone (over ranks and rounds; the
    pairs alternate, so both see the same states): how much faster a core computes while it
    is the only busy one, at least 1 (a smaller ratio is noise); read by
    :mod:`simulator.cpushare`."""
    rounds = sorted(per_rank[0])
    per = [max(r[rnd][0] for r in per_rank) for rnd in rounds]
    readings = list(per)
    for rnd in sorted((series or [{}])[0]):
        readings += [max(xs) for xs in zip(*(s[rnd] for s in series))]
    together = statistics.median(per)
    alone = statistics.median(r[rnd][1] for r in per_rank for rnd in rounds)
    share = min(1.0, cores / world)
    return {"lookup": {"what": "fused TBE forward+backward of the tables [rows, dim, pooling, "
                               "zipf] at the batch, on every rank at once "
                               "(planner/measure/validate/calibrate_dlrm.py)",
                       "tables": [list(t) for t in LOOKUP_TABLES], "batch": LOOKUP_BATCH,
                       "measured_s": _sig(host_mean(readings)),
                       "statistic": f"trimmed mean of {len(readings)} readings",
                       "rounds_s": [_sig(x) for x in per],
                       "readings_s": [_sig(x) for x in readings]},
            "contention": {"what": "a core's speed while it is the only busy one over its "
                                   "speed with every rank busy, from the lookup probe "
                                   "(planner/measure/validate/lookup_probe.py); read by "
                                   "simulator/cpushare.py",
                           "together_s": _sig(together), "share_of_core": _sig(share),
                           "alone_s": _sig(alone),
                           "alone_speedup": _sig(max(1.0, together * share / alone))}}
