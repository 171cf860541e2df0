"""``clusterplan validate unseen``: the plans of the unseen family
(:mod:`planner.measure.validate.unseen_family`) run for real under TorchRec on gloo and
predicted beside.

Each plan runs ``warmup`` + ``steps`` steps (more for a plan predicted short, :func:`steps_for`),
in ``rounds`` whole runs of the family, a set's plans side by side in one run whose turns of
about a second of steps alternate between them (``order="interleaved"``, the default;
:mod:`planner.measure.validate.dlrm_interleave`) or in turn (every other round in reverse,
:func:`round_order`); its measured time is the median over the steps of the slowest rank,
pooled over its rounds (:func:`merge_rounds`). The prediction is
:func:`planner.measure.validate.dlrm_report.validate_dlrm`'s with the given calibration;
:func:`repredict_rows` predicts a recorded run's plans again without running them.
:mod:`planner.measure.validate.unseen_report` summarises and prints the rows.
"""

from __future__ import annotations

import math
import statistics
from functools import partial
from pathlib import Path
from typing import Sequence

from simulator.errors import SpecError

from planner.measure.heap import DEFAULT_HEAP
from planner.measure.validate.dlrm_interleave import BLOCK_SECONDS, block_steps
from planner.measure.validate.dlrm_probes import at_host
from planner.measure.validate.unseen_family import (UnseenCase, layout_record, with_layout,
                                                     write_case)

__all__ = ["run_cases", "steps_for", "merge_rounds", "round_order", "repredict_rows",
           "MAX_STEPS", "MEASURED", "ORDERS"]

#: measured steps of a plan at most, however short its predicted step (``min_seconds``)
MAX_STEPS = 100


def run_cases(cases: Sequence[UnseenCase], folder: Path, *, steps: int, warmup: int,
              calibrations: dict, timeout_s: float = 300.0, progress=None,
              heap: str = DEFAULT_HEAP, rounds: int = 1, host_probe: bool = True,
              min_seconds: float = 0.0, measured: str = "steps",
              order: str = "interleaved", block_s: float = BLOCK_SECONDS) -> list[dict]:
    """Run every case for real and predict it with the calibration of its world size; one row
    per case (see :func:`planner.measure.validate.unseen_report.summarise`). With
    ``host_probe`` each run times the calibration's lookup probe before its warm-up and after
    its steps, and its row has the host's speed then against the calibration's and the
    prediction at that speed. Each table set gets fresh processes (a pool that ran big tables
    keeps its memory) with the heap policy ``heap`` (:mod:`planner.measure.heap`); a
    plan whose run fails is a row with its ``error`` and the run goes on. ``rounds`` > 1 runs
    the whole family that many times, one round after the other, and measures each plan over
    all its rounds' steps (or, with ``measured="round"``, its median round;
    :func:`merge_rounds`): a shared host's speed drifts by tens of percent, which one run per
    plan cannot tell from a model error. ``min_seconds`` > 0 gives a plan predicted short more
    measured steps (:func:`steps_for`), the same in every round. ``order`` is the order of a
    set's plans in each round (:func:`round_order`); with ``"interleaved"`` a set's plans
    train side by side in one run, in turns of about ``block_s`` predicted seconds of steps
    each (:func:`~planner.measure.validate.dlrm_interleave.block_steps`; 0: one step a turn),
    so each round pairs every plan's steps with its set's other plans' steps under the same
    host speed. Rows come back in ``cases``' order."""
    if order not in ORDERS:
        raise ValueError(f"order={order!r}: one of {ORDERS}")
    sized = min_seconds > 0 or (order == "interleaved" and block_s > 0)
    step_s = {(c.set_name, c.plan_kind): _predicted_step_s(c, folder, steps, warmup,
                                                          calibrations[c.ranks])
              if sized else 0.0 for c in cases}
    per_case = {k: _steps_at(t, steps, min_seconds) for k, t in step_s.items()}
    blocks = {k: min(block_steps(t, block_s), per_case[k]) if sized else 1
              for k, t in step_s.items()}
    per_round: list[list[dict]] = []
    for k in range(rounds):
        def tell(i, n, row, k=k):
            if progress is not None:
                progress(k * len(cases) + i, rounds * len(cases), row)
        ran = round_order(cases, k, order)
        rows = _run_round(ran, folder, steps=per_case, warmup=warmup,
                          calibrations=calibrations, timeout_s=timeout_s, progress=tell,
                          heap=heap, host_probe=host_probe,
                          blocks=blocks if order == "interleaved" else None)
        back = {id(c): r for c, r in zip(ran, rows)}
        per_round.append([back[id(c)] for c in cases])
    return merge_rounds(per_round, measured)


#: orders of a set's plans in the rounds of :func:`run_cases` (:func:`round_order`)
ORDERS = ("interleaved", "alternate", "fixed")


def round_order(cases: Sequence[UnseenCase], k: int, order: str = "alternate") -> list:
    """The cases in the order round ``k`` (from 0) runs them: set after set as in ``cases``,
    and within a set its plans as listed (``"fixed"``, the protocol before 2026-11-29's seed
    17) or, with ``"alternate"``, reversed in every odd round. A set's plans run one after
    the other in one pool of fresh processes, a minute or two in all: run in one order, the
    same plan is always the first after the pool starts and the others always follow it by
    the same minutes of the host's drift. Alternated, each plan of a pair runs first as often
    as second over an even number of rounds, so a position effect or a drift within the set's
    turn does not favour one plan of it in every round. ``"interleaved"`` orders a set's plans
    as ``"alternate"`` does, here the order of their steps within each cycle of its one run.

    >>> from types import SimpleNamespace as C
    >>> cs = [C(model=C(name=s), plan_kind=p) for s in "ab" for p in ("g", "r", "c")]
    >>> [c.model.name + c.plan_kind for c in round_order(cs, 1)]
    ['ac', 'ar', 'ag', 'bc', 'br', 'bg']
    >>> [c.model.name + c.plan_kind for c in round_order(cs, 2)]
    ['ag', 'ar', 'ac', 'bg', 'br', 'bc']
    """
    if order not in ORDERS:
        raise ValueError(f"order={order!r}: one of {ORDERS}")
    flip = order in ("alternate", "interleaved") and k % 2
    return [c for group in _by_set(cases) for c in (group[::-1] if flip else group)]


def _by_set(cases: Sequence[UnseenCase]) -> list[list[UnseenCase]]:
    """``cases`` grouped by table set, sets and plans in their first order."""
    names = dict.fromkeys(c.model.name for c in cases)
    return [[c for c in cases if c.model.name == name] for name in names]


#: how ``merge_rounds`` measures a plan run in several rounds: the median of every round's
#: steps (the default), or the median round's own median (``"round"``, the statistic before
#: 2026-11-29's calibration series)
MEASURED = ("steps", "round")


def merge_rounds(per_round: Sequence[Sequence[dict]], measured: str = "steps") -> list[dict]:
    """One row per plan from several rounds' rows (same plans, same order), with every round's
    measured step in ``rounds_s`` and all their steps in ``steps_s``. Its measured step is the
    median of all those steps (``measured="steps"``): the calibration's lookup probe is a mean
    over the host's speed states read across minutes
    (:mod:`planner.measure.validate.lookup_probe`), and a plan's steps pooled over its rounds
    are the measurement that spans as many states; one round's few seconds are often in one
    state, 1.2-1.4x away from the other on a shared VM. With
    ``measured="round"`` it is the median round's (the lower middle one of an even count: the
    faster of two). The other fields (per-kind times) are the median round's; with ``"steps"``
    the host's speed is the mean of the rounds' and its probes all of theirs. A plan that
    failed in any round is that round's failed row."""
    if measured not in MEASURED:
        raise ValueError(f"measured={measured!r}: one of {MEASURED}")
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
        steps = [s for r in rows for s in r["steps_s"]]
        row = {**mid, "rounds_s": [r["measured_s"] for r in rows], "steps_s": steps,
               "measured": measured}
        if all("host_speed" in r for r in rows):
            row["rounds_host_speed"] = [r["host_speed"] for r in rows]
        if measured == "steps":
            row["measured_s"] = statistics.median(steps)
            if "rounds_host_speed" in row:
                speed = statistics.fmean(row["rounds_host_speed"])
                row.update(host_speed=speed, predicted_at_host_s=row["predicted_s"] * speed,
                           host_probe_s=[x for r in rows for x in r["host_probe_s"]])
        out.append(row)
    return out


def steps_for(case: UnseenCase, folder: Path, steps: int, warmup: int, calibration,
              min_seconds: float) -> int:
    """Measured steps of ``case``: ``steps``, or more for a plan whose predicted steps would
    not fill ``min_seconds`` (up to :data:`MAX_STEPS`). A 100 ms plan's ten steps span one
    second, which one slow spell of a shared host covers whole; thirty span three."""
    if min_seconds <= 0:
        return steps
    return _steps_at(_predicted_step_s(case, folder, steps, warmup, calibration), steps,
                     min_seconds)


def _steps_at(step_s: float, steps: int, min_seconds: float) -> int:
    if min_seconds <= 0:
        return steps
    return int(max(steps, min(MAX_STEPS, math.ceil(min_seconds / max(step_s, 1e-6)))))


def _predicted_step_s(case: UnseenCase, folder: Path, steps: int, warmup: int,
                      calibration) -> float:
    from planner.measure.validate.dlrm import load_dlrm_config
    from planner.measure.validate.dlrm_report import predicted
    cfg = load_dlrm_config(str(write_case(case, folder)), nproc=case.ranks, steps=steps,
                           warmup=warmup)
    return predicted(cfg, warmup, calibration)["step_time_s"]


def _run_round(cases: Sequence[UnseenCase], folder: Path, *, steps: dict, warmup: int,
               calibrations: dict, timeout_s: float, progress, heap: str,
               host_probe: bool, blocks: dict | None = None) -> list[dict]:
    """One round: each set's plans in turn (``blocks`` None) or interleaved, ``blocks[key]``
    steps a turn."""
    run_set = _run_set_in_turn if blocks is None else partial(_run_set_interleaved,
                                                              blocks=blocks)
    rows: list[dict] = []
    for group in _by_set(cases):
        for row in run_set(group, folder, steps=steps, warmup=warmup, calibrations=calibrations,
                           timeout_s=timeout_s, heap=heap, host_probe=host_probe):
            rows.append(row)
            progress(len(rows), len(cases), row)
    return rows


def _run_set_in_turn(group: Sequence[UnseenCase], folder: Path, *, steps: dict, warmup: int,
                     calibrations: dict, timeout_s: float, heap: str, host_probe: bool):
    """One table set's plans one after the other in a pool of fresh processes (a new pool
    after a plan that failed); yields a row per plan, in ``group``'s order."""
    from planner.measure.validate.runner import Pool, RunFailed
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
            yield row
    finally:
        pool.close()


def repredict_rows(cases: Sequence[UnseenCase], recorded: Sequence[dict], folder: Path, *,
                   steps: int, warmup: int, calibrations: dict,
                   source: str = "--repredict") -> list[dict]:
    """``recorded``'s rows (a run of the same family) with their measured times kept and each
    plan predicted again by the current model with ``calibrations``: how a model change moves
    the predictions of runs already made, without running them again.

    Each row's plan is the one it recorded (``layout``, runs since 2026-11-29), so a greedy
    plan the current CPU profile would make differently is still the plan measured; rows of
    older runs take the plan the seed makes now, and say so (``plan_layout``: ``"rebuilt"``,
    else ``"recorded"``). A recorded row whose set and plan kind are not among ``cases``, or
    whose layout is not a plan of its tables, raises :class:`SpecError` naming ``source``;
    failed rows stay failed."""
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
        if r.get("layout") is not None:
            case = with_layout(case, r["layout"], source=source,
                               field=f"rows[{len(rows)}].layout")
        cfg = load_dlrm_config(str(write_case(case, folder)), nproc=case.ranks, steps=steps,
                               warmup=warmup)
        pred = predicted(cfg, warmup, calibrations[case.ranks])
        measured = {k: v.get("measured_s") for k, v in r.get("per_kind", {}).items()}
        per_kind = per_kind_rows(pred["per_kind"], measured)
        rows.append({**r, "predicted_s": pred["step_time_s"], "per_kind": per_kind,
                     "predicted_parts": pred["per_kind"], "predicted_before_s": r["predicted_s"],
                     "plan_layout": "recorded" if r.get("layout") is not None else "rebuilt",
                     "extrapolated": pred["extrapolated"],
                     **at_host(pred["step_time_s"], r.get("host_probe_s") or (),
                               calibrations[case.ranks])})
    return rows


def _row(case: UnseenCase, **kw) -> dict:
    return {"set": case.set_name, "plan": case.plan_kind, "ranks": case.ranks,
            "tables": len(case.model.tables), "batch": case.model.batch_size,
            "types": sorted({ts.sharding_type.value for ts in case.shardings}),
            "layout": layout_record(case.shardings), **kw}


def _case_config(case: UnseenCase, folder: Path, *, steps: int, warmup: int, timeout_s: float,
                 heap: str, host_probe: bool):
    from planner.measure.validate.dlrm import load_dlrm_config
    return load_dlrm_config(str(write_case(case, folder)), nproc=case.ranks, steps=steps,
                            warmup=warmup, timeout_s=timeout_s, heap=heap, host_probe=host_probe)


def _case_row(case: UnseenCase, cfg, result, calibration) -> dict:
    from planner.measure.validate.dlrm_report import validate_dlrm
    d = validate_dlrm(cfg, result=result, calibration=calibration)
    return _row(case, predicted_s=d["predicted_step_time_s"],
                measured_s=d["measured_step_time_s"], steps=cfg.steps, steps_s=d["steps_s"],
                structure_match=d["structure"]["match"], per_kind=d["per_kind"],
                extrapolated=d["extrapolated"],
                **({k: d[k] for k in ("host_probe_s", "host_speed", "predicted_at_host_s")}
                   if d["host_speed"] is not None else {}))


def _run_case(case: UnseenCase, folder: Path, pool, *, steps: int, warmup: int, calibration,
              timeout_s: float, heap: str, host_probe: bool) -> dict:
    cfg = _case_config(case, folder, steps=steps, warmup=warmup, timeout_s=timeout_s,
                       heap=heap, host_probe=host_probe)
    return _case_row(case, cfg, pool.run(cfg), calibration)


def _run_set_interleaved(group: Sequence[UnseenCase], folder: Path, *, steps: dict,
                         warmup: int, calibrations: dict, timeout_s: float, heap: str,
                         host_probe: bool, blocks: dict):
    """One table set's plans trained side by side in one run of fresh processes, in turns of
    ``blocks`` steps (:mod:`planner.measure.validate.dlrm_interleave`); yields a row per plan,
    in ``group``'s order (each the run's error if it failed)."""
    from planner.measure.validate.dlrm_interleave import InterleavedRunConfig, split_result
    from planner.measure.validate.runner import Pool, RunFailed
    cfgs = [_case_config(c, folder, steps=steps[(c.set_name, c.plan_kind)], warmup=warmup,
                         timeout_s=timeout_s, heap=heap, host_probe=host_probe) for c in group]
    run_cfg = InterleavedRunConfig(plans=tuple(cfgs), blocks=tuple(
        blocks[(c.set_name, c.plan_kind)] for c in group))
    try:
        with Pool(group[0].ranks, heap) as pool:
            results = split_result(run_cfg, pool.run(run_cfg))
    except RunFailed as e:
        yield from (_row(case, error=str(e)) for case in group)
        return
    for c, cfg, res in zip(group, cfgs, results):
        yield _case_row(c, cfg, res, calibrations[c.ranks])
