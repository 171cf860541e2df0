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
(:func:`time_lookup_probe`, inside every calibration round of ``clusterplan calibrate gloo``):
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

import statistics

__all__ = ["PROBE_TYPES", "probe_config", "measure_torchrec", "host_costs", "size_measure",
           "lookup_probe_model", "time_lookup_probe", "predicted_lookup_s", "lookup_scale"]

PROBE_TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")
PROBE_TABLES = 4
PROBE_DIM = 32
PROBE_ROWS = 4096
PROBE_SMALL = 8              # samples per rank
PROBE_LARGE = 1024
PROBE_POOLING = 32
PROBE_DP_LARGE_ROWS = 32768  # 4 MiB fp32 per table at dim 32
#: the co-running lookup probe: (rows, dim, pooling factor, Zipf exponent) per table
LOOKUP_TABLES = ((200_000, 64, 20.0, 1.1), (100_000, 32, 10.0, 1.05), (400_000, 32, 5.0, 1.1),
                 (50_000, 16, 30.0, 1.2))
LOOKUP_BATCH = 2048


def probe_config(kind: str, size: str, world: int, *, steps: int = 30, warmup: int = 5):
    """The probe's :class:`planner.measure.validate.dlrm.DLRMRunConfig` (deterministic: the prediction
    rebuilds it to simulate it)."""
    from planner.model.tables import shards as sh
    from planner.measure.embedding import cpu_topology_ref
    from planner.model.tables.plan import PlannerStats, make_plan
    from planner.model.tables.spec import ModelSpec, TableSpec
    from planner.model.tables.task import ShardingTask, prepare
    from planner.export.torchrec import export_torchrec_plan

    from planner.measure.validate.dlrm import DLRMRunConfig
    large = size == "large"
    rows = PROBE_DP_LARGE_ROWS if (large and kind == "data_parallel") else PROBE_ROWS
    rows -= rows % world
    pooling = float(PROBE_POOLING if large else 1)
    per_rank = PROBE_LARGE if large else PROBE_SMALL
    tables = tuple(TableSpec(name=f"p{i}", num_embeddings=rows, embedding_dim=PROBE_DIM,
                             pooling_factor=pooling, zipf_exponent=1.05)
                   for i in range(PROBE_TABLES))
    model = ModelSpec(name=f"probe-{kind}-{size}", tables=tables, dense=None,
                      batch_size=per_rank * world, optimizer="sgd", source="calibrate_dlrm")
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(world)), world)
    out = []
    for i, t in enumerate(tables):
        if kind == "table_wise":
            out.append(sh.table_wise(i, t.name, rows, PROBE_DIM, i % world))
        elif kind == "column_wise":
            w = PROBE_DIM // world
            out.append(sh.column_wise(i, t.name, rows, PROBE_DIM, list(range(world)),
                                      [w] * world))
        elif kind == "row_wise":
            out.append(sh.row_wise(i, t.name, rows, PROBE_DIM, world))
        else:
            out.append(sh.data_parallel(i, t.name, rows, PROBE_DIM, world))
    plan = make_plan(problem, out, "probe", PlannerStats())
    tr = export_torchrec_plan(plan.to_dict(), device="cpu")
    return DLRMRunConfig(model=model, shardings=tuple(out), torchrec_plan=tr,
                         plan_source=f"<{model.name}>", world=world,
                         local_world=int(tr["local_world_size"]), steps=steps, warmup=warmup)




def measure_torchrec(pool, world: int, *, quick: bool = False, rounds: int | None = None
                     ) -> dict:
    """Run every probe on ``pool`` and return the profile's ``torchrec`` section (None
    where TorchRec or FBGEMM is not installed); ``rounds`` overrides the runs per probe (1 in
    quick mode, else 2)."""
    import importlib.util
    if not all(importlib.util.find_spec(m) for m in ("torchrec", "fbgemm_gpu")):
        return None
    from planner.measure.validate.dlrm_report import measure
    steps, warmup, default_rounds = (4, 2, 1) if quick else (15, 3, 2)
    rounds = default_rounds if rounds is None else rounds
    got: dict[tuple[str, str], list] = {}
    # rounds over all probes (not one probe twice in a row): a whole run of a small step is
    # sometimes 20-40% slower than the next, so each probe is the mean of separate runs
    for _ in range(rounds):
        for kind in PROBE_TYPES:
            for size in ("small", "large"):
                cfg = probe_config(kind, size, world, steps=steps, warmup=warmup)
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


def size_measure(kind: str, cfg, ops, rank: int) -> float:
    """The size a type's host cost grows with on ``rank``: ids it sends plus receives in the
    type's values all-to-all (table-wise, column-wise, row-wise), or the bytes of its
    data-parallel tables."""
    if kind == "data_parallel":
        return float(sum(4 * ts.shards[0].rows * ts.shards[0].cols for ts in cfg.shardings
                         if ts.sharding_type.value == kind))
    for op in ops:
        if op.name == f"{kind} values a2a":
            i = op.group.index(rank)
            return float(op.matrix[i].sum() + op.matrix[:, i].sum()) / 8.0
    return 0.0


def host_costs(calibration, world: int, simulate_probe, *, iterations: int = 4) -> dict:
    """Per type ``(intercept_s, slope_s_per_unit)`` from the stored probes.

    ``simulate_probe(cfg, host_s) -> seconds`` simulates a probe with ``host_s`` seconds of
    host work per rank (the model the prediction uses). The host cost is what makes the model
    reproduce the measured probe: starting from measured − simulated without host work, the
    line through the two probes is corrected by the remaining difference a few times (the
    host work lengthens the compute gap before the next call, whose wake-up cost the model
    then charges too, so one subtraction would count that twice)."""
    tr = getattr(calibration, "torchrec", None) or {}
    if int(tr.get("world", -1)) != world:
        return {}
    from planner.measure.validate.dlrm_report import expected_ops
    probes: dict[str, dict] = {}
    for p in tr.get("probes", []):
        cfg = probe_config(p["sharding_type"], p["size"], world)
        ops = expected_ops(cfg, cfg.warmup)
        xs = [size_measure(p["sharding_type"], cfg, ops, r) for r in range(world)]
        probes.setdefault(p["sharding_type"], {})[p["size"]] = (cfg, xs, float(p["step_s"]))
    out = {}
    for kind, got in probes.items():
        if "small" not in got:
            continue
        pts = [got[k] for k in ("small", "large") if k in got]
        target = [0.0] * len(pts)                 # host seconds (slowest rank) per probe
        a = b = 0.0
        for _ in range(iterations):
            for i, (cfg, xs, meas) in enumerate(pts):
                host = [a + b * x for x in xs]
                target[i] = max(host) + meas - simulate_probe(cfg, host)
            x0, t0 = max(pts[0][1]), target[0]
            if len(pts) > 1 and max(pts[1][1]) > x0:
                b = max(0.0, (target[1] - t0) / (max(pts[1][1]) - x0))
            a = max(0.0, t0 - b * x0)
        out[kind] = (a, b)
    return out


# -- the co-running lookup probe ------------------------------------------------------------

def lookup_probe_model():
    """The probe's tables (:data:`LOOKUP_TABLES`) as a model, all table-wise on one rank."""
    from planner.model.tables.spec import ModelSpec, TableSpec
    tables = tuple(TableSpec(name=f"l{i}", num_embeddings=r, embedding_dim=d, pooling_factor=p,
                             zipf_exponent=z) for i, (r, d, p, z) in enumerate(LOOKUP_TABLES))
    return ModelSpec(name="lookup-probe", tables=tables, batch_size=LOOKUP_BATCH,
                     optimizer="sgd", source="planner/measure/validate/calibrate_dlrm.py")


def _probe_shardings(model):
    from planner.model.tables.shards import table_wise
    return [table_wise(i, t.name, t.num_embeddings, t.embedding_dim, 0)
            for i, t in enumerate(model.tables)]


def time_lookup_probe(dist, *, repeats: int = 9) -> float:
    """Seconds of the probe's fused forward + backward on this rank, every rank starting
    together after a barrier (median of ``repeats``, caches flushed before each)."""
    from planner.measure.embedding import model_ids, rank_work
    from planner.measure.kernels import time_shard_set
    model = lookup_probe_model()
    tables = rank_work(model, _probe_shardings(model), model_ids(model), 1)[0]
    dist.barrier()
    return time_shard_set(tables, repeats=repeats, warmup=2).total_s


def predicted_lookup_s() -> float:
    """The CPU embedding profile's forward + backward lookup seconds of the probe."""
    from planner.measure.embedding import cpu_topology_ref
    from planner.model.tables.plan import evaluate_shardings
    from planner.model.tables.task import ShardingTask, prepare
    model = lookup_probe_model()
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(2)), 2)
    ev = evaluate_shardings(problem, _probe_shardings(model))
    return float(ev.breakdown_s["lookup_fwd_s"][0] + ev.breakdown_s["lookup_bwd_s"][0])


def lookup_scale(calibration) -> float:
    """Measured / predicted lookup time of the probe (1.0 when the calibration has none)."""
    lk = getattr(calibration, "lookup", None) or {}
    measured = lk.get("measured_s")
    if not measured:
        return 1.0
    return float(measured) / predicted_lookup_s()
