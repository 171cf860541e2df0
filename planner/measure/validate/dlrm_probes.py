"""The probes of a DLRM calibration and how their measurements enter a prediction.

The probe plans (:func:`probe_config`, rebuilt from this module's constants) and the
co-running lookup probe (:mod:`planner.measure.validate.lookup_probe`) are run by
:mod:`planner.measure.validate.calibrate_dlrm`; a prediction turns their stored times into
TorchRec host seconds per rank (:func:`host_costs`, in the size measure of
:func:`size_measure`), a lookup time scale (:func:`lookup_scale`) and, for a run that timed the
lookup probe too, the host's speed then against the calibration's (:func:`host_speed`)."""

from __future__ import annotations

from planner.export.torchrec import export_torchrec_plan
from planner.measure.tables.plans import cpu_topology_ref
from planner.measure.validate.dlrm import DLRMRunConfig
from planner.measure.validate.dlrm_ops import expected_ops
from planner.measure.validate.lookup_probe import host_mean, lookup_probe_model, probe_shardings
from planner.model.tables import shards as sh
from planner.model.tables.plan import PlannerStats, evaluate_shardings, make_plan
from planner.model.tables.spec import ModelSpec, TableSpec
from planner.model.tables.task import ShardingTask, prepare

__all__ = ["PROBE_TYPES", "SHARED_SLOPE_TYPES", "probe_config", "host_costs", "size_measure",
           "predicted_lookup_s", "lookup_scale", "host_speed", "at_host", "stale_note", "STALE_SPEED"]


PROBE_TYPES = ("table_wise", "column_wise", "row_wise", "data_parallel")


PROBE_TABLES = 4


PROBE_DIM = 32


PROBE_ROWS = 4096


PROBE_SMALL = 8              # samples per rank


PROBE_LARGE = 1024


PROBE_POOLING = 32


PROBE_DP_LARGE_ROWS = 32768  # 4 MiB fp32 per table at dim 32




def probe_config(kind: str, size: str, world: int, *, steps: int = 30, warmup: int = 5):
    """The probe's :class:`planner.measure.validate.dlrm.DLRMRunConfig` (deterministic: the prediction
    rebuilds it to simulate it)."""
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


#: the types whose host cost per unit of size is one slope: TorchRec runs the same input
#: dist for them (the ids' KeyedJaggedTensor split, sent and received per id), so what their
#: probes' residuals differ by is the model's error on each probe, not host work
SHARED_SLOPE_TYPES = ("table_wise", "column_wise", "row_wise")


def host_costs(calibration, world: int, simulate_probe, *, iterations: int = 4) -> dict:
    """Per type ``(intercept_s, slope_s_per_unit)`` from the stored probes.

    ``simulate_probe(cfg, host_s) -> seconds`` simulates a probe with ``host_s`` seconds of
    host work per rank (the model the prediction uses). The host cost is what makes the model
    reproduce the measured probes: each probe's target is measured − simulated with the
    current host work added back, and the lines are refitted to the targets a few times (the
    host work lengthens the compute gap before the next call, whose wake-up cost the model
    then charges too, so one subtraction would count that twice). Each type has its own
    intercept (the fixed host work of its sharding in a step); the types of
    :data:`SHARED_SLOPE_TYPES` share one slope, least squares over their probe pairs (one
    pair's own slope would carry the model's error on that pair to a plan of millions of
    ids), and data-parallel has its own."""
    tr = getattr(calibration, "torchrec", None) or {}
    if int(tr.get("world", -1)) != world:
        return {}
    by_size: dict[str, dict] = {}
    for p in tr.get("probes", []):
        cfg = probe_config(p["sharding_type"], p["size"], world)
        ops = expected_ops(cfg, cfg.warmup)
        xs = [size_measure(p["sharding_type"], cfg, ops, r) for r in range(world)]
        by_size.setdefault(p["sharding_type"], {})[p["size"]] = (cfg, xs, float(p["step_s"]))
    probes = {k: [got[s] for s in ("small", "large") if s in got]
              for k, got in sorted(by_size.items()) if "small" in got}
    shared = [k for k in probes if k in SHARED_SLOPE_TYPES]
    lines = {k: (0.0, 0.0) for k in probes}
    for _ in range(iterations):
        targets = {k: _targets(pts, lines[k], simulate_probe) for k, pts in probes.items()}
        for k in probes:
            b = _slope([targets[q] for q in (shared if k in shared else [k])])
            x0, t0 = targets[k][0]
            lines[k] = (max(0.0, t0 - b * x0), b)
    return lines


def _targets(pts: list, line: tuple[float, float], simulate_probe) -> list[tuple[float, float]]:
    """``(size, host seconds)`` of each probe of one type: its slowest rank's size and the
    host time that makes the model meet its measured step, given the current ``line``."""
    a, b = line
    out = []
    for cfg, xs, meas in pts:
        host = [a + b * x for x in xs]
        out.append((max(xs), max(host) + meas - simulate_probe(cfg, host)))
    return out


def _slope(pairs: list[list[tuple[float, float]]]) -> float:
    """The least-squares slope (≥ 0) of host seconds on size over each type's small-to-large
    probe differences (a type's intercept is its own)."""
    num = den = 0.0
    for pts in pairs:
        if len(pts) > 1 and pts[1][0] > pts[0][0]:
            dx, dt = pts[1][0] - pts[0][0], pts[1][1] - pts[0][1]
            num, den = num + dx * dt, den + dx * dx
    return max(0.0, num / den) if den > 0 else 0.0


def predicted_lookup_s() -> float:
    """The CPU embedding profile's forward + backward lookup seconds of the probe."""
    model = lookup_probe_model()
    problem = prepare(ShardingTask(model=model, topology=cpu_topology_ref(2)), 2)
    ev = evaluate_shardings(problem, probe_shardings(model))
    return float(ev.breakdown_s["lookup_fwd_s"][0] + ev.breakdown_s["lookup_bwd_s"][0])


def lookup_scale(calibration) -> float:
    """Measured / predicted lookup time of the probe (1.0 when the calibration has none)."""
    lk = getattr(calibration, "lookup", None) or {}
    measured = lk.get("measured_s")
    if not measured:
        return 1.0
    return float(measured) / predicted_lookup_s()


def host_speed(calibration, probe_s: float | None) -> float | None:
    """How much slower the host ran the lookup probe during a run (``probe_s``, the slowest
    rank's seconds, :func:`planner.measure.validate.lookup_probe.time_together`) than during
    ``calibration`` (``lookup.measured_s``): above 1 when slower; None without either."""
    lk = getattr(calibration, "lookup", None) or {}
    then = lk.get("measured_s")
    if not then or not probe_s:
        return None
    return float(probe_s) / float(then)


def at_host(predicted_s: float, probe_s, calibration) -> dict:
    """A run's host probes (``probe_s``: the slowest rank's seconds before and after its
    steps), the host's speed then (their mean over the calibration's, :func:`host_speed`)
    and the prediction at that speed; {} without a probe or a calibrated one."""
    speed = host_speed(calibration, host_mean(probe_s) if probe_s else None)
    if speed is None:
        return {}
    return {"host_probe_s": list(probe_s), "host_speed": speed,
            "predicted_at_host_s": predicted_s * speed}


#: a host speed this far from 1 (either way) suggests measuring the calibration again
STALE_SPEED = 0.15


def stale_note(speed: float | None) -> str | None:
    """What to do when the host ran ``speed`` times its calibrated time (None when close)."""
    if speed is None or abs(speed - 1.0) <= STALE_SPEED:
        return None
    how = "slower" if speed > 1 else "faster"
    return (f"the host ran the lookup probe {speed:.2f}x its calibrated time ({how} than when "
            "calibrated): `clusterplan calibrate gloo` measures the calibration again")
