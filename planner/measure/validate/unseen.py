"""``clusterplan validate unseen``: sharding plans of table sets nothing was fitted to, run for
real under TorchRec on gloo and predicted beside.

A seeded family (:func:`unseen_cases`) of ``sets`` random table sets, each with several plans:

- ranks 2 or 4; 4-40 tables; dims from {16, 32, 64, 128, 256}; pooling factors log-uniform in
  [1, 60]; rows log-uniform in [10³, 10⁷]; batch log-uniform in [1,024, 65,536] (a multiple
  of 4 × ranks); Zipf exponents uniform in [0, 1.2]; half the sets with a DCNv2 dense part;
- so that a run fits this machine, a table over :data:`MAX_TABLE_BYTES` keeps the rows that
  fit, a set over :data:`MAX_SET_BYTES` has its rows shrunk in proportion, and one whose
  lookups per step exceed :data:`MAX_LOOKUPS` its batch halved until it fits (all recorded in
  the set's name);
- plans: the greedy planner (every type allowed), the seeded random table-wise placement, every
  table column-wise in equal blocks over the ranks, and row-wise tables with the smallest ones
  data-parallel (up to 1 MiB in all); a plan whose export would give a row shard no rows (which FBGEMM's
  CPU kernel cannot run) or repeats another plan is left out.

Seeds: the family is drawn from ``SeedSequence([seed, 0x0E5EE7])``; the CPU profile's kernel
sweep uses ``0xCA1B`` and the gloo calibration fixed probe tables, so no set here was ever
fitted to. Each plan runs ``warmup`` + ``steps`` steps; its measured time is the median over
the steps of the slowest rank; the prediction is :func:`planner.measure.validate.dlrm_report.
validate_dlrm`'s with the given calibration.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from simulator.errors import SpecError

from planner.measure.heap import DEFAULT_HEAP
from planner.measure.validate.dlrm_probes import at_host, stale_note
import planner.model.tables.shards as sh
from planner.model.tables.plan import PlannerStats, make_plan
from planner.model.tables.shards import ShardingType
from planner.model.tables.spec import DenseSpec, ModelSpec, TableSpec, load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.sharding.planners import get_planner

__all__ = ["UnseenCase", "unseen_cases", "write_case", "kendall_tau_within", "summarise",
           "run_cases", "steps_for", "merge_rounds", "repredict_rows", "format_rows",
           "MAX_SET_BYTES", "MAX_LOOKUPS", "MAX_STEPS"]

#: weights of one table (bytes) and of one set, so 4 ranks fit in this machine's memory
MAX_TABLE_BYTES = 256 * 2 ** 20
MAX_SET_BYTES = 2 ** 30
#: ids looked up per step over all tables, so one step stays under a few seconds on one core
MAX_LOOKUPS = 6_000_000
#: measured steps of a plan at most, however short its predicted step (``min_seconds``)
MAX_STEPS = 100
DIMS = (16, 32, 64, 128, 256)
PLAN_KINDS = ("greedy", "random", "column_wise", "row_wise+dp")
#: data-parallel tables of a row_wise+dp plan in all (DDP keeps them in one 1 MiB bucket)
DP_BYTES = 1024 * 1024


@dataclass(frozen=True)
class UnseenCase:
    """One plan of one table set: ``set_name``, ``plan_kind``, the model and the plan's
    layouts on ``ranks`` ranks."""

    set_name: str
    plan_kind: str
    model: ModelSpec
    ranks: int
    shardings: tuple


def _table_set(rng: np.random.Generator, k: int, max_lookups: int = MAX_LOOKUPS,
               max_bytes: int = MAX_SET_BYTES) -> tuple[ModelSpec, int]:
    ranks = int(rng.choice((2, 4)))
    T = int(rng.integers(4, 41))
    tables, capped = [], 0
    for i in range(T):
        rows = int(round(10 ** rng.uniform(3.0, 7.0)))
        dim = int(rng.choice(DIMS))
        if rows * dim * 4 > MAX_TABLE_BYTES:
            rows, capped = MAX_TABLE_BYTES // (dim * 4), capped + 1
        tables.append(TableSpec(name=f"u{k}t{i}", num_embeddings=rows, embedding_dim=dim,
                                pooling_factor=round(float(10 ** rng.uniform(0, math.log10(60))), 3),
                                zipf_exponent=round(float(rng.uniform(0.0, 1.2)), 3)))
    batch = int(round(10 ** rng.uniform(math.log10(1024), math.log10(65536))))
    step = 4 * ranks
    batch = max(step, batch - batch % step)
    notes = [f"{capped} tables capped"] if capped else []
    size = sum(t.weight_bytes for t in tables)
    if size > max_bytes:
        f = max_bytes / size
        tables = [replace(t, num_embeddings=max(1000, int(t.num_embeddings * f))) for t in tables]
        notes.append(f"rows×{f:.2g}")
    while batch * sum(t.pooling_factor for t in tables) > max_lookups and batch // 2 >= 1024:
        batch = max(step, (batch // 2) - (batch // 2) % step)
        notes.append("batch/2")
    dense = None
    if rng.random() < 0.5:
        dense = DenseSpec(bottom_mlp=(64, 32), top_mlp=(64, 1), interaction="dcnv2",
                          dcn_layers=1, dcn_projection=32)
    name = f"unseen-{k}" + (f" ({', '.join(notes)})" if notes else "")
    return ModelSpec(name=f"unseen-{k}", tables=tuple(tables), dense=dense, batch_size=batch,
                     optimizer="sgd", description=name), ranks


def _hand_plan(model: ModelSpec, ranks: int, kind: str) -> tuple:
    """Column-wise: every table in ``ranks`` equal column blocks, rotated over the ranks;
    row-wise+dp: data-parallel for the smallest tables up to :data:`DP_BYTES` in all (so DDP
    keeps one bucket), row-wise for the rest."""
    out, dp_left = [], DP_BYTES
    for i, t in enumerate(model.tables):
        rows, dim = t.num_embeddings, t.embedding_dim
        if kind == "column_wise":
            parts = min(ranks, dim // 4)
            out.append(sh.column_wise(i, t.name, rows, dim,
                                      [(i + j) % ranks for j in range(parts)],
                                      sh.column_widths(dim, parts)))
        elif t.weight_bytes <= dp_left and t.weight_bytes <= DP_BYTES // 4:
            dp_left -= t.weight_bytes
            out.append(sh.data_parallel(i, t.name, rows, dim, ranks))
        else:
            out.append(sh.row_wise(i, t.name, rows, dim, ranks))
    return tuple(out)


def _plans(model: ModelSpec, ranks: int, seed: int) -> list[tuple[str, tuple]]:
    topo = f"localhost-gloo:node.gpus={ranks}"
    out, seen = [], set()
    for kind in PLAN_KINDS:
        if kind in ("greedy", "random"):
            task = ShardingTask(model=model, topology=topo)
            try:
                shardings = get_planner(kind).plan(task, ranks, seed=seed).shardings
            except SpecError:
                continue
        else:
            shardings = _hand_plan(model, ranks, kind)
        key = tuple((ts.sharding_type, tuple((s.rank, s.rows, s.cols) for s in ts.shards))
                    for ts in shardings)
        if key in seen or _empty_row_shard(shardings):
            continue
        seen.add(key)
        out.append((kind, tuple(shardings)))
    return out


def _empty_row_shard(shardings) -> bool:
    return any(s.rows == 0 for ts in shardings for s in ts.shards
               if ts.sharding_type in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE))


def unseen_cases(sets: int, *, seed: int = 0, max_lookups: int = MAX_LOOKUPS,
                 max_bytes: int = MAX_SET_BYTES) -> list[UnseenCase]:
    """The family's cases (see the module docstring), same seed same cases; ``max_lookups``
    and ``max_bytes`` lower the caps on ids per step and weights per set (shorter runs: the
    tests' reduced set)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x0E5EE7]))
    out = []
    for k in range(sets):
        model, ranks = _table_set(rng, k, max_lookups, max_bytes)
        for kind, shardings in _plans(model, ranks, seed):
            out.append(UnseenCase(model.description, kind, model, ranks, shardings))
    return out


def _spec_yaml(m: ModelSpec) -> str:
    doc = m.canonical()
    for t in doc["tables"]:
        for key in ("reuse_bins", "sharding_types"):
            t.pop(key, None)
    if doc["dense"] is None:
        doc.pop("dense")
    return yaml.safe_dump(doc, sort_keys=False)


def write_case(case: UnseenCase, folder: Path) -> Path:
    """Write the case's table spec and plan JSON into ``folder``; the plan's path."""
    stem = f"{case.model.name}-{case.plan_kind}"
    spec = folder / f"{case.model.name}.yaml"
    spec.write_text(_spec_yaml(case.model))
    model = load_model_spec(str(spec))
    problem = prepare(ShardingTask(model=model, topology=f"localhost-gloo:node.gpus="
                                                        f"{case.ranks}"), case.ranks)
    plan = make_plan(problem, case.shardings, case.plan_kind, PlannerStats())
    out = folder / f"{stem}.json"
    out.write_text(json.dumps(plan.to_dict(stable=True)))
    return out


def kendall_tau_within(rows: Sequence[dict], key: str = "predicted_s") -> float | None:
    """Kendall tau between predicted (``key``) and measured step times over every pair of
    plans of the same table set (ties count half; failed runs left out); None without such a
    pair."""
    conc = disc = 0.0
    by_set: dict = {}
    for r in _ok(rows):
        by_set.setdefault(r["set"], []).append(r)
    for group in by_set.values():
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                a = group[i][key] - group[j][key]
                b = group[i]["measured_s"] - group[j]["measured_s"]
                s = np.sign(a) * np.sign(b)
                conc += (s > 0) + 0.5 * (s == 0)
                disc += (s < 0) + 0.5 * (s == 0)
    return None if conc + disc == 0 else float((conc - disc) / (conc + disc))


def _ok(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if "error" not in r]


def _errors(rows: Sequence[dict], key: str, failed: int) -> dict:
    """MAPE, mean and worst error, rows within 25%, within-set tau and the issue's goals of
    ``rows``' prediction ``key`` against their measured steps."""
    errs = [r[key] / r["measured_s"] - 1.0 for r in rows]
    mape = statistics.mean(abs(e) for e in errs) if errs else None
    tau = kendall_tau_within(rows, key)
    return {"mape": mape, "mean_error": statistics.mean(errs) if errs else None,
            "worst": max(errs, key=abs) if errs else None,
            "within_25pct": sum(abs(e) <= 0.25 for e in errs),
            "kendall_tau_within_sets": tau,
            "goals": {"mape_le_15pct": mape is not None and mape <= 0.15,
                      "every_row_within_25pct": bool(errs) and not failed
                      and all(abs(e) <= 0.25 for e in errs),
                      "tau_ge_0.8": (tau or -1) >= 0.8}}


def summarise(rows: Sequence[dict]) -> dict:
    """MAPE, worst error, rows within 25%, mean error and within-set tau of the rows that ran
    (``failed``: those that did not, which fail the every-row goal). Where every row timed
    the host probe, ``at_host_speed``: the same of the predictions at the host's speed during
    each run (``predicted_at_host_s``), and ``host_speed``: the lowest, median and highest
    speed (the probe's time over the calibration's)."""
    failed = len(rows) - len(_ok(rows))
    rows = _ok(rows)
    out = {"plans": len(rows), "failed": failed, "sets": len({r["set"] for r in rows}),
           **_errors(rows, "predicted_s", failed),
           "extrapolated": sum(bool(r.get("extrapolated")) for r in rows)}
    speeds = [r.get("host_speed") for r in rows]
    if rows and all(x is not None for x in speeds):
        out["host_speed"] = [min(speeds), statistics.median(speeds), max(speeds)]
        out["at_host_speed"] = _errors(rows, "predicted_at_host_s", failed)
    return out


def run_cases(cases: Sequence[UnseenCase], folder: Path, *, steps: int, warmup: int,
              calibrations: dict, timeout_s: float = 300.0, progress=None,
              heap: str = DEFAULT_HEAP, rounds: int = 1, host_probe: bool = True,
              min_seconds: float = 0.0) -> list[dict]:
    """Run every case for real and predict it with the calibration of its world size; one row
    per case (see :func:`summarise`). With ``host_probe`` each run times the calibration's
    lookup probe before its warm-up and after its steps, and its row has the host's speed
    then against the calibration's and the prediction at that speed. Each table set gets
    fresh processes (a pool that ran big tables keeps its memory) with the heap policy ``heap`` (:mod:`planner.measure.heap`); a
    plan whose run fails is a row with its ``error`` and the run goes on. ``rounds`` > 1 runs
    the whole family that many times, one round after the other, and keeps per plan the
    median round (:func:`merge_rounds`): a shared host's speed drifts by tens of percent over
    an hour, which one run per plan cannot tell from a model error. ``min_seconds`` > 0 gives
    a plan predicted short more measured steps (:func:`steps_for`), the same in every round."""
    per_case = {(c.set_name, c.plan_kind): steps_for(c, folder, steps, warmup,
                                                    calibrations[c.ranks], min_seconds)
                for c in cases}
    per_round: list[list[dict]] = []
    for k in range(rounds):
        def tell(i, n, row, k=k):
            if progress is not None:
                progress(k * len(cases) + i, rounds * len(cases), row)
        per_round.append(_run_round(cases, folder, steps=per_case, warmup=warmup,
                                    calibrations=calibrations, timeout_s=timeout_s,
                                    progress=tell, heap=heap, host_probe=host_probe))
    return merge_rounds(per_round)


def merge_rounds(per_round: Sequence[Sequence[dict]]) -> list[dict]:
    """One row per plan from several rounds' rows (same plans, same order): the round whose
    measured step is the median (the lower middle one of an even count), with every round's
    measured step in ``rounds_s`` and all their steps in ``steps_s``; a plan that failed in
    any round is that round's failed row."""
    out = []
    for rows in zip(*per_round):
        failed = [r for r in rows if "error" in r]
        if failed:
            out.append(failed[0])
            continue
        if len(rows) == 1:
            out.append(rows[0])
            continue
        order = sorted(rows, key=lambda r: r["measured_s"])
        mid = order[(len(order) - 1) // 2]
        speeds = {"rounds_host_speed": [r["host_speed"] for r in rows]} \
            if all("host_speed" in r for r in rows) else {}
        out.append({**mid, "rounds_s": [r["measured_s"] for r in rows],
                    "steps_s": [s for r in rows for s in r["steps_s"]], **speeds})
    return out


def steps_for(case: UnseenCase, folder: Path, steps: int, warmup: int, calibration,
              min_seconds: float) -> int:
    """Measured steps of ``case``: ``steps``, or more for a plan whose predicted steps would
    not fill ``min_seconds`` (up to :data:`MAX_STEPS`). A 100 ms plan's ten steps span one
    second, which one slow spell of a shared host covers whole; thirty span three."""
    if min_seconds <= 0:
        return steps
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import predicted
    cfg = load_dlrm_config(str(write_case(case, folder)), nproc=case.ranks, steps=steps,
                           warmup=warmup)
    step_s = predicted(cfg, warmup, calibration)["step_time_s"]
    return int(max(steps, min(MAX_STEPS, math.ceil(min_seconds / max(step_s, 1e-6)))))


def _run_round(cases: Sequence[UnseenCase], folder: Path, *, steps: dict, warmup: int,
               calibrations: dict, timeout_s: float, progress, heap: str,
               host_probe: bool) -> list[dict]:
    from planner.measure.validate.runner import Pool, RunFailed
    rows: list[dict] = []
    for name in dict.fromkeys(c.model.name for c in cases):
        group = [c for c in cases if c.model.name == name]
        pool = Pool(group[0].ranks, heap)
        try:
            for case in group:
                try:
                    row = _run_case(case, folder, pool,
                                    steps=steps[(case.set_name, case.plan_kind)], warmup=warmup,
                                    calibration=calibrations[case.ranks], timeout_s=timeout_s,
                                    heap=heap, host_probe=host_probe)
                except RunFailed as e:
                    row = _row(case, error=str(e))
                    pool.close()
                    pool = Pool(case.ranks, heap)
                rows.append(row)
                progress(len(rows), len(cases), row)
        finally:
            pool.close()
    return rows


def repredict_rows(cases: Sequence[UnseenCase], recorded: Sequence[dict], folder: Path, *,
                   steps: int, warmup: int, calibrations: dict) -> list[dict]:
    """``recorded``'s rows (a run of the same family) with their measured times kept and each
    plan predicted again by the current model with ``calibrations``: how a model change moves
    the predictions of runs already made, without running them again. A recorded row whose
    plan is not among ``cases`` raises :class:`SpecError`; failed rows stay failed."""
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import per_kind_rows, predicted
    by_key = {(c.set_name, c.plan_kind): c for c in cases}
    rows = []
    for r in recorded:
        case = by_key.get((r.get("set"), r.get("plan")))
        if case is None:
            raise SpecError(f"recorded plan {r.get('set')!r} / {r.get('plan')!r} is not in the "
                            "family of this seed and number of sets", field="rows",
                            fix="re-predict a file written by this version's "
                                "`validate unseen --out`")
        if "error" in r:
            rows.append(dict(r))
            continue
        cfg = load_dlrm_config(str(write_case(case, folder)), nproc=case.ranks, steps=steps,
                               warmup=warmup)
        pred = predicted(cfg, warmup, calibrations[case.ranks])
        measured = {k: v.get("measured_s") for k, v in r.get("per_kind", {}).items()}
        per_kind = per_kind_rows(pred["per_kind"], measured)
        rows.append({**r, "predicted_s": pred["step_time_s"], "per_kind": per_kind,
                     "predicted_parts": pred["per_kind"], "predicted_before_s": r["predicted_s"],
                     "extrapolated": pred["extrapolated"],
                     **at_host(pred["step_time_s"], r.get("host_probe_s") or (),
                               calibrations[case.ranks])})
    return rows


def _row(case: UnseenCase, **kw) -> dict:
    return {"set": case.set_name, "plan": case.plan_kind, "ranks": case.ranks,
            "tables": len(case.model.tables), "batch": case.model.batch_size,
            "types": sorted({ts.sharding_type.value for ts in case.shardings}), **kw}


def _run_case(case: UnseenCase, folder: Path, pool, *, steps: int, warmup: int, calibration,
              timeout_s: float, heap: str, host_probe: bool) -> dict:
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import validate_dlrm
    plan = write_case(case, folder)
    cfg = load_dlrm_config(str(plan), nproc=case.ranks, steps=steps, warmup=warmup,
                           timeout_s=timeout_s, heap=heap, host_probe=host_probe)
    d = validate_dlrm(cfg, result=pool.run(cfg), calibration=calibration)
    return _row(case, predicted_s=d["predicted_step_time_s"],
                measured_s=d["measured_step_time_s"], steps=steps, steps_s=d["steps_s"],
                structure_match=d["structure"]["match"], per_kind=d["per_kind"],
                extrapolated=d["extrapolated"],
                **({k: d[k] for k in ("host_probe_s", "host_speed", "predicted_at_host_s")}
                   if d["host_speed"] is not None else {}))


def format_rows(rows: Sequence[dict], summary: dict) -> str:
    """The table a person reads: one line per plan, then the summary (and, where the runs
    timed the host probe, the errors at the host's speed during each run beside)."""
    probe = "at_host_speed" in summary
    lines = [f"{'set':38s} {'plan':12s} {'ranks':>5s} {'tables':>6s} {'batch':>6s} "
             f"{'predicted':>10s} {'measured':>10s} {'error':>7s}"
             + (f" {'host':>5s} {'at host':>7s}" if probe else "")]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['set'][:38]:38s} {r['plan']:12s} {r['ranks']:5d} {r['tables']:6d} "
                         f"{r['batch']:6d}  FAILED: {r['error'][:120]}")
            continue
        err = r["predicted_s"] / r["measured_s"] - 1.0
        at = (f" {r['host_speed']:5.2f} {r['predicted_at_host_s'] / r['measured_s'] - 1:+7.1%}"
              if probe else "")
        lines.append(f"{r['set'][:38]:38s} {r['plan']:12s} {r['ranks']:5d} {r['tables']:6d} "
                     f"{r['batch']:6d} {r['predicted_s'] * 1e3:8.1f}ms {r['measured_s'] * 1e3:8.1f}ms "
                     f"{err:+7.1%}" + at
                     + ("" if r["structure_match"] else "  STRUCTURE MISMATCH")
                     + ("  extrapolated (*)" if r.get("extrapolated") else ""))
    beyond = sorted({n for r in rows for n in r.get("extrapolated", ())})
    lines += [f"(*) extrapolated: {n}" for n in beyond]
    s = summary
    if s["failed"]:
        lines.append(f"{s['failed']} plan(s) failed to run (left out below)")
    lines += _summary_lines(s, f"{s['plans']} plans of {s['sets']} table sets: ", s["plans"])
    if s.get("extrapolated"):
        lines.append(f"{s['extrapolated']} plan(s) extrapolated (*)")
    if probe:
        lo, mid, hi = s["host_speed"]
        lines.append(f"host speed during the runs (the lookup probe's time over the "
                     f"calibration's; 'host' column): {lo:.2f} / {mid:.2f} / {hi:.2f} "
                     "(lowest / median / highest)")
        lines += _summary_lines(s["at_host_speed"], "predicted at the host's speed during each "
                                "run ('at host' column): ", s["plans"])
        note = stale_note(mid)
        if note:
            lines.append(f"note: (median) {note}")
    return "\n".join(lines)


def _summary_lines(s: dict, head: str, plans: int) -> list[str]:
    """The error line and the goals line of one kind of prediction's summary."""
    tau = s["kendall_tau_within_sets"]
    g = s["goals"]
    return [head + f"MAPE {s['mape']:.1%} (mean {s['mean_error']:+.1%}, worst "
                   f"{s['worst']:+.1%}), {s['within_25pct']} of {plans} within 25%, Kendall "
                   "tau within sets " + ("-" if tau is None else f"{tau:.2f}"),
            "goals: MAPE <= 15% " + ("met" if g["mape_le_15pct"] else "NOT met")
            + "; every plan within 25% " + ("met" if g["every_row_within_25pct"] else "NOT met")
            + "; tau >= 0.8 " + ("met" if g["tau_ge_0.8"] else "NOT met")]
