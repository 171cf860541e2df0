"""The lookup probe: one fused FBGEMM TBE of fixed tables, timed on ranks as a run pins them.

``clusterplan calibrate gloo`` times it in every round (:func:`time_lookup_probe`: every rank
at once, and each rank alone) and, every rank at once, between the calibration's stages
(:class:`ProbeSeries`), and stores the mean of the slowest rank's readings as
``lookup.measured_s`` (:func:`planner.measure.validate.calibrate_dlrm.lookup_sections`);
a validation run with ``host_probe`` times it again before its warm-up and after its last timed
step (:func:`time_together`), so a prediction can say how fast the host was during the run
against during the calibration (:func:`planner.measure.validate.dlrm_probes.host_speed`). The
tables are fixed here and nothing in them comes from a validated plan.
"""

from __future__ import annotations

import statistics

from planner.measure.tables.kernels import time_shard_set
from planner.measure.tables.plan_work import rank_work
from planner.model.tables.ids import model_ids
from planner.model.tables.shards import table_wise
from planner.model.tables.spec import ModelSpec, TableSpec

__all__ = ["LOOKUP_TABLES", "LOOKUP_BATCH", "lookup_probe_model", "probe_shardings",
           "time_together", "time_lookup_probe", "ProbeSeries", "SERIES_REPEATS", "host_mean",
           "TRIM"]

#: (rows, dim, pooling factor, Zipf exponent) per table
LOOKUP_TABLES = ((200_000, 64, 20.0, 1.1), (100_000, 32, 10.0, 1.05), (400_000, 32, 5.0, 1.1),
                 (50_000, 16, 30.0, 1.2))

#: samples per probe call (the whole batch on one rank)
LOOKUP_BATCH = 2048


def lookup_probe_model() -> ModelSpec:
    """The probe's tables (:data:`LOOKUP_TABLES`) as a model, all table-wise on one rank."""
    tables = tuple(TableSpec(name=f"l{i}", num_embeddings=r, embedding_dim=d, pooling_factor=p,
                             zipf_exponent=z) for i, (r, d, p, z) in enumerate(LOOKUP_TABLES))
    return ModelSpec(name="lookup-probe", tables=tables, batch_size=LOOKUP_BATCH,
                     optimizer="sgd", source="planner/measure/validate/lookup_probe.py")


def probe_shardings(model: ModelSpec) -> list:
    """Every table of ``model`` table-wise on rank 0."""
    return [table_wise(i, t.name, t.num_embeddings, t.embedding_dim, 0)
            for i, t in enumerate(model.tables)]


def _probe_tables():
    model = lookup_probe_model()
    return rank_work(model, probe_shardings(model), model_ids(model), 1)[0]


def time_together(dist, *, repeats: int = 9, tables=None) -> float:
    """Seconds of the probe's fused forward + backward on this rank, every rank starting
    together after a barrier: the median of ``repeats``, caches flushed before each."""
    tables = _probe_tables() if tables is None else tables
    dist.barrier()
    return time_shard_set(tables, repeats=repeats, warmup=2).total_s


def time_lookup_probe(dist, *, repeats: int = 9, pairs: int = 3) -> tuple[float, float]:
    """Seconds of the probe on this rank together (:func:`time_together`) and alone, while
    the others wait at a barrier (one rank after another); ``pairs`` times each, alternated so
    that the host's drift hits both alike; the medians of the pairs. Their ratio is how much
    the cores slow each other down (:mod:`simulator.cpushare`)."""
    tables = _probe_tables()
    together, alone = [], []
    for _ in range(pairs):
        together.append(time_together(dist, repeats=repeats, tables=tables))
        for who in range(dist.get_world_size()):
            dist.barrier()
            if dist.get_rank() == who:
                alone.append(time_shard_set(tables, repeats=repeats, warmup=2).total_s)
    dist.barrier()
    return statistics.median(together), statistics.median(alone)


#: timed calls per reading of :class:`ProbeSeries` (after two warm-up calls)
SERIES_REPEATS = 3


class ProbeSeries:
    """Readings of the probe, every rank at once, taken between a calibration's stages.

    Why: on a shared VM a core's speed switches between states within seconds (the 2-core
    Intel VM of 2026-11-29 ran the probe alone at 7.7 or 10.9 ms, about half the time each,
    111 readings 2 s apart over 4 minutes), so one or two readings per round catch one state at
    random, while a plan's measured steps span several: the calibration of 03:54 caught 9.9 ms
    for 2 processes, the one of 04:01 6.3 ms per core for 4, and the 2-process plans of the
    family run after it were over-predicted, the 4-process ones under-predicted.
    ``readings[round]`` is this rank's seconds per reading (:func:`time_together`,
    :data:`SERIES_REPEATS` calls)."""

    def __init__(self, dist, *, enabled: bool = True):
        self._dist = dist
        self._tables = _probe_tables() if enabled else None
        self.readings: dict[int, list[float]] = {}

    def sample(self, rnd: int) -> None:
        """Take one reading now (every rank must call it at the same point)."""
        if self._tables is None:
            return
        self.readings.setdefault(rnd, []).append(
            time_together(self._dist, repeats=SERIES_REPEATS, tables=self._tables))


#: share of readings dropped at each end before :func:`host_mean` averages them
TRIM = 0.1


def host_mean(readings) -> float:
    """The mean of probe readings (seconds) without the lowest and highest :data:`TRIM` of
    them (none dropped below ten readings): the host's average speed over the readings, not
    moved by one that a stray process doubled.

    >>> host_mean([1.0, 2.0, 3.0])
    2.0
    >>> host_mean([1.0] * 9 + [50.0])
    1.0
    """
    xs = sorted(float(x) for x in readings)
    k = int(TRIM * len(xs)) if len(xs) >= 10 else 0
    return statistics.fmean(xs[k:len(xs) - k])
