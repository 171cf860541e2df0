"""The lookup probe: one fused FBGEMM TBE of fixed tables, timed on ranks as a run pins them.

``clusterplan calibrate gloo`` times it in every round (:func:`time_lookup_probe`: every rank
at once, and each rank alone) and stores the slowest rank together as ``lookup.measured_s``;
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
           "time_together", "time_lookup_probe"]

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
