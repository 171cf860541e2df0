"""Measured evaluation of a sharding plan on this machine: the ground truth beside the model.

For a plan on N ranks (``clusterplan measure TABLES PLAN.json`` or ``clusterplan plan …
--measure``):

1. **Ids.** Every table gets one global batch of ids drawn from its access distribution
   (:mod:`planner.model.tables.ids`: reuse bins or Zipf). Same seed, same ids, whatever the
   plan, so every planner's plan of a task is measured on the same data.
2. **Lookups, per rank.** The rank's shards as one fused table-batched EmbeddingBag
   (:mod:`.kernels`; FBGEMM's CPU TBE, or ``torch.nn.EmbeddingBag``): table- and
   column-wise shards serve the global batch, a row-wise block the ids that fall in it, a
   data-parallel replica the rank's local batch (dense gradient, whole-table update). Forward
   and backward with the fused optimizer, one thread, caches flushed before each iteration,
   median of ``repeats`` after ``warmup``. The ranks run one at a time in this process,
   iterations interleaved over ranks, so compute is timed free of interference (as NeuroShard
   times it).
3. **Communication, per rank.** ``torch.distributed`` with gloo across N spawned processes
   (:mod:`.comm`), with the exact split sizes the plan and the ids imply: the ids
   all-to-all (8-byte ids + a 4-byte length per bag, from each rank's local batch to the ranks
   holding the shards), the pooled-embedding all-to-all forward (each table/column-wise shard's
   rows for every rank's samples) and backward (the transpose), row-wise reduce-scatter and
   all-gather of the ``batch × dim`` partial sums, and one all-reduce of all data-parallel
   tables' fp32 gradients (DDP-style bucketing). After a barrier every rank stamps its call's
   start and end on the system-wide monotonic clock; a rank's time counts from the last rank's
   start (:func:`~.comm.align`: waiting for a process the scheduler had not yet run is
   not communication); median of ``comm_repeats``.
4. **Cost per rank** = lookups forward + backward + all of its communication; the plan's cost
   is the maximum over ranks (NeuroShard's and DreamShard's definition). Beside it the analytic
   prediction of :class:`~planner.model.tables.cost.CostModel` for the same layouts on this machine
   (on a CPU target: the calibrated CPU profile, ``traces/calibration/cpu-embedding.yaml``).

With more processes than cores (8 ranks on 2 cores) the collectives share the cores: the
result says so (``oversubscription``) and such communication times include scheduling.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from simulator.errors import SpecError
from simulator.units import format_bytes

from planner.machine import cpu_description
from planner.measure.heap import DEFAULT_HEAP, apply_heap_policy
from planner.measure.tables.comm import GlooGroup, oversubscription
from planner.measure.tables.kernels import time_ranks
from planner.measure.tables.plan_work import comm_ops, rank_work
from planner.measure.tables.measurement import (
    COMM_KEYS,
    LOOKUP_KEYS,
    Measurement,
    format_measurement,
)
from planner.model.tables.features import BREAKDOWN_KEYS
from planner.model.tables.ids import TableIds, model_ids
from planner.model.tables.memory import shard_memory_bytes
from planner.model.tables.plan import evaluate_shardings
from planner.model.tables.shards import TableSharding
from planner.model.tables.spec import ModelSpec
from planner.model.tables.task import prepare
from planner.progress import Bar

__all__ = ["Measurement", "measure_shardings", "measure_many", "measure_plan", "scale_model",
           "cpu_topology_ref", "LOOKUP_KEYS", "COMM_KEYS", "format_measurement"]

def cpu_topology_ref(devices: int) -> str:
    """The topology of this machine with ``devices`` gloo processes on one host."""
    return f"localhost-gloo:node.gpus={int(devices)}"


_OP_KEY = {"input_a2a_s": "input_a2a_s", "output_a2a_fwd_s": "output_a2a_fwd_s",
           "output_a2a_bwd_s": "output_a2a_bwd_s", "rw_reducescatter": "row_wise_comm_s",
           "rw_allgather": "row_wise_comm_s", "twrw_reducescatter": "table_row_wise_comm_s",
           "twrw_allgather": "table_row_wise_comm_s",
           "data_parallel_allreduce_s": "data_parallel_allreduce_s"}


# ---------------------------------------------------------------------------------------------
# measuring

def scale_model(model: ModelSpec, factor: float, *, name: str | None = None) -> ModelSpec:
    """The model with rows and global batch scaled by ``factor`` (pooling, dims, access
    statistics unchanged), so lookups, distinct rows and memory all scale alike: a benchmark
    task shrunk to fit this machine."""
    if not factor > 0:
        raise SpecError(f"scale factor must be positive, got {factor}", source="--scale",
                        fix="pass e.g. 0.0625")
    tables = tuple(replace(t, num_embeddings=max(1, int(round(t.num_embeddings * factor))))
                   for t in model.tables)
    return replace(model, tables=tables, batch_size=max(1, int(round(model.batch_size * factor))),
                   name=name or model.name)


def _check_fits(model: ModelSpec, shardings: Sequence[TableSharding], devices: int,
                limit_bytes: float | None) -> float:
    per = np.zeros(devices)
    for ts in shardings:
        t = model.tables[ts.table]
        for s in ts.shards:
            per[s.rank] += shard_memory_bytes(t, s.rows, s.cols, ts.sharding_type,
                                              model.optimizer)
    total = float(per.sum())
    if limit_bytes is None:
        limit_bytes = 0.5 * _available_bytes()
    if float(per.max()) > limit_bytes:
        r = int(per.argmax())
        raise SpecError(f"rank {r} holds {format_bytes(per[r])} of embeddings, more than "
                        f"{format_bytes(limit_bytes)} this machine can measure",
                        source=model.source or model.name, field="tables",
                        fix="measure a scaled-down model (fewer rows; see measure.scale_model) "
                            "or fewer tables")
    return total


def _available_bytes() -> float:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 8.0 * 1024 ** 3


def measure_shardings(problem, shardings: Sequence[TableSharding], *, repeats: int = 5,
                      warmup: int = 2, comm_repeats: int = 7, comm_warmup: int = 2,
                      comm: bool = True, group=None, ids: Sequence[TableIds] | None = None,
                      seed: int = 0, backend: str = "auto", flush: bool = True,
                      threads: int = 1, interleave: bool | None = None,
                      memory_limit_bytes: float | None = None,
                      heap: str | None = None) -> Measurement:
    """Measure ``shardings`` (one per table) of ``problem``'s model on its ``devices`` ranks.

    ``group``: a :class:`~.comm.GlooGroup` of ``devices`` processes to reuse (else one is
    started and closed here); ``comm=False`` skips the collectives (their columns are 0).
    ``ids``: precomputed :func:`model_ids` (else drawn with ``seed``). The prediction is
    ``problem``'s cost model on the same layouts. ``heap``: a C heap policy of
    :mod:`planner.measure.heap` to set in this process before the kernels are built (None
    leaves it as it is; gloo processes started here use it too, else ``retain``). Without
    ``retain`` a data-parallel replica's dense gradient above glibc's 32 MiB mmap threshold is
    page-faulted in anew every iteration (2.5-4× the backward of such a table on a 2-core EPYC
    VM), which a trainer on jemalloc/tcmalloc does not pay and the prediction does not model.
    """
    t0 = time.perf_counter()
    if heap is not None:
        apply_heap_policy(heap)
    model = problem.model
    n = problem.devices
    total = _check_fits(model, shardings, n, memory_limit_bytes)
    if ids is None:
        ids = model_ids(model, seed=seed)
    work = rank_work(model, shardings, ids, n)
    if interleave is None:
        interleave = total <= 0.25 * _available_bytes()
    timings = time_ranks(work, optimizer=model.optimizer, repeats=repeats, warmup=warmup,
                         backend=backend, flush=flush, threads=threads, interleave=interleave)
    measured: dict[str, list[float]] = {k: [0.0] * n for k in BREAKDOWN_KEYS}
    measured["lookup_fwd_s"] = [t.fwd_s for t in timings]
    measured["lookup_bwd_s"] = [t.bwd_s for t in timings]
    notes: list[str] = []
    ops = comm_ops(model, shardings, ids, n, problem.hosts)
    if comm and ops and n > 1:
        res = _run_collectives(ops, n, group, heap, repeats=comm_repeats, warmup=comm_warmup)
        for r in range(n):
            for name, v in res[r].items():
                measured[_OP_KEY[name]][r] += float(v["median_s"])
        over = oversubscription(n)
        if over > 1:
            notes.append(f"{n} gloo processes share {n / over:.0f} cores ({over:.1f} per core): "
                         "collective times include CPU scheduling")
    elif not comm:
        notes.append("collectives not measured (--no-comm): communication columns are 0")
    ev = evaluate_shardings(problem, shardings)
    predicted = {k: [float(x) for x in ev.breakdown_s[k]] for k in BREAKDOWN_KEYS}
    if problem.topology.gpu.name != "cpu":
        notes.append(f"predicted for {problem.topology_ref} ({problem.topology.gpu.name}), "
                     "measured on this CPU: compare shapes, not values")
    info = cpu_description()
    settings = {"batch_size": model.batch_size, "repeats": repeats, "warmup": warmup,
                "comm_repeats": comm_repeats, "comm_warmup": comm_warmup,
                "kernel": timings[0].backend if timings else backend, "threads": threads,
                "flush_caches": flush, "interleaved": bool(interleave), "seed": seed,
                "optimizer": model.optimizer, "comm_backend": "gloo", "heap": heap,
                "oversubscription": oversubscription(n),
                "machine": f"{info.get('cpu_model', '?')}, {info.get('cpu_count')} cores",
                "torch": info.get("torch"), "fbgemm_gpu": info.get("fbgemm_gpu"),
                "predicted_with": problem.topology_ref}
    return Measurement(devices=n, measured_s=measured, predicted_s=predicted, settings=settings,
                       notes=tuple(notes), wall_s=time.perf_counter() - t0)


def measure_many(problem, plans: Sequence[Sequence[TableSharding]], **kw) -> list[Measurement]:
    """See :func:`_measure_many`; draws a progress bar (kernels, then collectives) on a
    terminal."""
    bar = Bar(2, f"measuring {len(plans)} plan(s) on {problem.devices} ranks "
                 "(kernels, collectives)")
    try:
        return _measure_many(problem, plans, bar=bar, **kw)
    finally:
        bar.close()


def _measure_many(problem, plans: Sequence[Sequence[TableSharding]], *, repeats: int = 5,
                  warmup: int = 2, comm_repeats: int = 7, comm_warmup: int = 2,
                  comm: bool = True, group=None, ids: Sequence[TableIds] | None = None,
                  seed: int = 0, backend: str = "auto", flush: bool = True, threads: int = 1,
                  memory_limit_bytes: float | None = None, heap: str | None = None,
                  bar=None) -> list[Measurement]:
    """Measure several plans of one problem *paired*: the kernels of every plan's ranks are built
    together and their iterations interleaved (plan 0 rank 0, plan 0 rank 1, …, plan 1 rank 0,
    …), and all plans' collectives run in one gloo job, interleaved per round — so load from
    other processes, and its drift over time, hits every plan alike and per-task ratios between
    plans are fair. When all plans together would not fit in memory, the plans are measured one
    after another twice, in forward then reverse order, and each rank's two medians averaged.
    ``heap``: as :func:`measure_shardings`.
    """
    t0 = time.perf_counter()
    if heap is not None:
        apply_heap_policy(heap)
    model = problem.model
    n = problem.devices
    if not plans:
        return []
    totals = [_check_fits(model, sh, n, memory_limit_bytes) for sh in plans]
    if ids is None:
        ids = model_ids(model, seed=seed)
    measured = [{k: [0.0] * n for k in BREAKDOWN_KEYS} for _ in plans]
    samples: list[dict[str, list[list[float]]]] = [{} for _ in plans]
    together = sum(totals) <= 0.3 * _available_bytes()
    timing = dict(repeats=repeats, warmup=warmup, backend=backend, flush=flush, threads=threads)
    kind = (_time_lookups(model, plans, ids, n, measured, samples, **timing) if together
            else _time_lookups_in_turn(model, plans, ids, n, measured, totals, **timing))
    if bar is not None:
        bar.update(1)
    notes: list[str] = []
    if comm and n > 1:
        _time_collectives(model, plans, ids, n, measured, samples if together else None,
                          group=group, heap=heap, repeats=comm_repeats, warmup=comm_warmup)
        over = oversubscription(n)
        if over > 1:
            notes.append(f"{n} gloo processes share {n / over:.0f} cores ({over:.1f} per core): "
                         "collective times include CPU scheduling")
    info = cpu_description()
    out = []
    for i, sh in enumerate(plans):
        ev = evaluate_shardings(problem, sh)
        settings = {"batch_size": model.batch_size, "repeats": repeats, "warmup": warmup,
                    "comm_repeats": comm_repeats, "comm_warmup": comm_warmup, "kernel": kind,
                    "threads": threads, "flush_caches": flush, "paired_with": len(plans) - 1,
                    "interleaved": together, "seed": seed, "optimizer": model.optimizer,
                    "comm_backend": "gloo", "heap": heap,
                    "oversubscription": oversubscription(n),
                    "machine": f"{info.get('cpu_model', '?')}, {info.get('cpu_count')} cores",
                    "torch": info.get("torch"), "fbgemm_gpu": info.get("fbgemm_gpu"),
                    "predicted_with": problem.topology_ref}
        out.append(Measurement(devices=n, measured_s=measured[i], samples_s=samples[i],
                               predicted_s={k: [float(x) for x in ev.breakdown_s[k]]
                                            for k in BREAKDOWN_KEYS},
                               settings=settings, notes=tuple(notes),
                               wall_s=time.perf_counter() - t0))
    return out


def _time_lookups(model, plans, ids, n: int, measured: list[dict], samples: list[dict], *,
                  repeats: int, warmup: int, backend: str, flush: bool, threads: int) -> str:
    """Every plan's ranks' lookups built together, their iterations interleaved; medians
    into ``measured`` and every sample into ``samples``; the kernel backend used."""
    work = [w for sh in plans for w in rank_work(model, sh, ids, n)]
    tm = time_ranks(work, optimizer=model.optimizer, repeats=repeats, warmup=warmup,
                    backend=backend, flush=flush, threads=threads, interleave=True)
    for i in range(len(plans)):
        measured[i]["lookup_fwd_s"] = [t.fwd_s for t in tm[i * n:(i + 1) * n]]
        measured[i]["lookup_bwd_s"] = [t.bwd_s for t in tm[i * n:(i + 1) * n]]
        samples[i]["lookup_fwd_s"] = [list(t.fwd_samples) for t in tm[i * n:(i + 1) * n]]
        samples[i]["lookup_bwd_s"] = [list(t.bwd_samples) for t in tm[i * n:(i + 1) * n]]
    return tm[0].backend


def _time_lookups_in_turn(model, plans, ids, n: int, measured: list[dict], totals: list[float],
                          *, repeats: int, warmup: int, backend: str, flush: bool,
                          threads: int) -> str:
    """Plans too large to hold together (``totals``: each plan's bytes): each plan's lookups
    alone, in forward then reverse order, each rank's two medians averaged into
    ``measured``; the kernel backend used."""
    kind = backend
    order = list(range(len(plans)))
    for i in order + order[::-1]:
        tm = time_ranks(rank_work(model, plans[i], ids, n), optimizer=model.optimizer,
                        repeats=repeats, warmup=warmup, backend=backend, flush=flush,
                        threads=threads, interleave=totals[i] <= 0.25 * _available_bytes())
        kind = tm[0].backend
        for r, t in enumerate(tm):
            measured[i]["lookup_fwd_s"][r] += t.fwd_s / 2
            measured[i]["lookup_bwd_s"][r] += t.bwd_s / 2
    return kind


def _time_collectives(model, plans, ids, n: int, measured: list[dict],
                      samples: list[dict] | None, *, group, heap: str | None, repeats: int,
                      warmup: int) -> None:
    """Every plan's collectives in one gloo job (``group``, else one made and closed here),
    interleaved per round; medians added into ``measured``, each round into ``samples``
    when given."""
    ops = []
    for i, sh in enumerate(plans):
        ops += [(k, f"{i}|{name}", arg) for k, name, arg in comm_ops(model, sh, ids, n)]
    if not ops:
        return
    res = _run_collectives(ops, n, group, heap, repeats=repeats, warmup=warmup)
    for r in range(n):
        for name, v in res[r].items():
            i, op = name.split("|", 1)
            measured[int(i)][_OP_KEY[op]][r] += float(v["median_s"])
            if samples is not None:
                _add_rounds(samples[int(i)], _OP_KEY[op], r, n, v["samples_s"])


def _run_collectives(ops: list, n: int, group, heap: str | None, *, repeats: int,
                     warmup: int) -> list[dict]:
    """Per rank, each op's timings from one gloo job on ``group`` (of ``n`` ranks), or on a
    group of its own, made and closed here."""
    own = group is None
    g = GlooGroup(n, heap=heap or DEFAULT_HEAP) if own else group
    if g.world != n:
        raise ValueError(f"gloo group has {g.world} ranks, the plan {n}")
    try:
        return g.run(ops, repeats=repeats, warmup=warmup)
    finally:
        if own:
            g.close()


def _add_rounds(samples: dict, key: str, rank: int, n: int, rounds: Sequence[float]) -> None:
    """Add one collective's per-round times to ``samples[key][rank]`` round by round (several
    collectives fall under one key, as their medians add up in ``measured_s``)."""
    per_rank = samples.setdefault(key, [[] for _ in range(n)])
    have = per_rank[rank]
    if not have:
        have.extend(float(x) for x in rounds)
    elif len(rounds) == len(have):
        per_rank[rank] = [a + float(b) for a, b in zip(have, rounds)]


def measure_plan(plan, task, **kw) -> Measurement:
    """Measure a :class:`~planner.model.tables.plan.Plan` of ``task`` (see
    :func:`measure_shardings`)."""
    return measure_shardings(prepare(task, plan.devices), plan.shardings, **kw)
