"""How well ``clusterplan validate unseen`` predicted its plans: per-row errors, the MAPE,
rows within 25%, Kendall tau between plans of the same table set (also over the pairs measured
apart alone, :func:`measured_apart`), the issue's goals, how well the measurement repeats its
own order (:func:`tau_between_rounds`), and the table a person reads (:func:`format_rows`).
Rows are those of :func:`planner.measure.validate.unseen.run_cases`; times are seconds.
"""

from __future__ import annotations

import statistics
from typing import Sequence

import numpy as np

from planner.measure.validate.dlrm_probes import stale_note

__all__ = ["kendall_tau_within", "measured_apart", "tau_between_rounds", "summarise",
           "format_rows"]


def kendall_tau_within(rows: Sequence[dict], key: str = "predicted_s", *,
                       apart_only: bool = False) -> float | None:
    """Kendall tau between predicted (``key``) and measured step times over every pair of
    plans of the same table set (ties count half; failed runs left out); None without such a
    pair. ``apart_only``: only the pairs measured apart (:func:`measured_apart`)."""
    conc = disc = 0.0
    for a, b in _pairs(rows):
        if apart_only and not measured_apart(a, b):
            continue
        s = np.sign(a[key] - b[key]) * np.sign(a["measured_s"] - b["measured_s"])
        conc += (s > 0) + 0.5 * (s == 0)
        disc += (s < 0) + 0.5 * (s == 0)
    return None if conc + disc == 0 else float((conc - disc) / (conc + disc))


def tau_between_rounds(rows: Sequence[dict]) -> float | None:
    """The measurement's own repeatability: Kendall tau between two rounds' measured step
    times (``rounds_s``) over every pair of plans of the same table set, averaged over every
    pair of rounds; None with fewer than two rounds. A prediction cannot be shown to order
    the plans better than the measurement orders itself: where one round's order of a set's
    plans disagrees with the next round's on a quarter of the pairs, a tau of 0.8 against
    either is out of reach, however right the model.

    >>> rows = [{"set": "a", "measured_s": 1, "rounds_s": [1.0, 1.1, 1.0]},
    ...         {"set": "a", "measured_s": 2, "rounds_s": [2.0, 1.0, 2.1]}]
    >>> round(tau_between_rounds(rows), 3)      # rounds 0-1 and 1-2 disagree, 0-2 agree
    -0.333
    """
    pairs = [(a, b) for a, b in _pairs(rows) if a.get("rounds_s") and b.get("rounds_s")]
    n = min((len(r["rounds_s"]) for ab in pairs for r in ab), default=0)
    if n < 2:
        return None
    taus = []
    for i in range(n):
        for j in range(i + 1, n):
            s = [np.sign(a["rounds_s"][i] - b["rounds_s"][i])
                 * np.sign(a["rounds_s"][j] - b["rounds_s"][j]) for a, b in pairs]
            taus.append(float(np.mean(s)))
    return statistics.fmean(taus)


def _pairs(rows: Sequence[dict]) -> list[tuple[dict, dict]]:
    """Every pair of plans of the same table set that ran."""
    by_set: dict = {}
    for r in _ok(rows):
        by_set.setdefault(r["set"], []).append(r)
    return [(g[i], g[j]) for g in by_set.values() for i in range(len(g))
            for j in range(i + 1, len(g))]


def _range(row: dict) -> tuple[float, float]:
    """Where a plan's step time was measured: its rounds' lowest and highest (several
    rounds), else its steps' quartiles."""
    rounds = row.get("rounds_s") or []
    if len(rounds) >= 2:
        return min(rounds), max(rounds)
    steps = row.get("steps_s") or []
    if len(steps) < 2:
        return row["measured_s"], row["measured_s"]
    q1, _, q3 = statistics.quantiles(steps, n=4)
    return q1, q3


def measured_apart(a: dict, b: dict) -> bool:
    """True when two plans' measurements do not overlap (:func:`_range`): their order is the
    host's and not its noise. On a shared VM the same plan's rounds differ by up to half, so a
    pair measured 3% apart says nothing about which plan is faster."""
    (alo, ahi), (blo, bhi) = _range(a), _range(b)
    return ahi < blo or bhi < alo


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
            "pairs": len(_pairs(rows)),
            "pairs_apart": sum(measured_apart(a, b) for a, b in _pairs(rows)),
            "kendall_tau_apart": kendall_tau_within(rows, key, apart_only=True),
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
           "extrapolated": sum(bool(r.get("extrapolated")) for r in rows),
           "measured_tau_between_rounds": tau_between_rounds(rows)}
    speeds = [r.get("host_speed") for r in rows]
    if rows and all(x is not None for x in speeds):
        out["host_speed"] = [min(speeds), statistics.median(speeds), max(speeds)]
        out["at_host_speed"] = _errors(rows, "predicted_at_host_s", failed)
    return out


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
    if s.get("measured_tau_between_rounds") is not None:
        lines.append("the measurement against itself: Kendall tau between its rounds' orders of "
                     f"each set's plans {s['measured_tau_between_rounds']:.2f} (mean over pairs "
                     "of rounds)")
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
    tau, apart = s["kendall_tau_within_sets"], s.get("kendall_tau_apart")
    g = s["goals"]
    return [head + f"MAPE {s['mape']:.1%} (mean {s['mean_error']:+.1%}, worst "
                   f"{s['worst']:+.1%}), {s['within_25pct']} of {plans} within 25%, Kendall "
                   "tau within sets " + ("-" if tau is None else f"{tau:.2f}")
            + ("" if "pairs" not in s else
               f" ({'-' if apart is None else f'{apart:.2f}'} over the {s['pairs_apart']} of "
               f"{s['pairs']} pairs measured apart)"),
            "goals: MAPE <= 15% " + ("met" if g["mape_le_15pct"] else "NOT met")
            + "; every plan within 25% " + ("met" if g["every_row_within_25pct"] else "NOT met")
            + "; tau >= 0.8 " + ("met" if g["tau_ge_0.8"] else "NOT met")]
