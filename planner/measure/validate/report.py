"""Run a plan for real, simulate the same plan, and put the two side by side.

:func:`validate` returns one dictionary (the ``--json`` output of ``clusterplan validate``):
``structure`` (exact comparison of every rank's communication per step, see
:mod:`planner.measure.validate.compare`), ``predicted_step_time_s``, ``measured_step_time_s`` (median
over the measured steps of the slowest rank's step), ``relative_error`` (predicted / measured
- 1), ``per_kind`` (compute, tp, dp, pp seconds per step on the slowest rank, both sides),
``steps_s``, ``loss``, ``traces`` and the configuration.
"""

from __future__ import annotations

import os
import statistics

from simulator.units import format_time

from planner.measure.validate.compare import compare_structure, describe, events_from_records
from planner.measure.validate.config import RunConfig
from planner.measure.validate.expected import Expected, expected_step, predicted_by_kind
from planner.measure.validate.runner import RunResult, run

__all__ = ["validate", "measure", "format_report"]

COMM_KIND = {"tp": "tp", "dp": "dp", "pp": "pp", "pp-wait": "pp"}


def measure(cfg: RunConfig, res: RunResult) -> dict:
    """Measured step times and per-kind seconds from a run's records."""
    first, last = cfg.warmup, cfg.warmup + cfg.steps       # the traced step is left out
    per_rank: dict[int, list[float]] = {}
    kinds: dict[int, list[dict]] = {}
    for r in res.ranks:
        durs = {step: t1 - t0 for step, t0, t1 in r["steps"] if first <= step < last}
        per_rank[r["rank"]] = [durs[s] for s in sorted(durs)]
        comm: dict[int, dict] = {s: {"tp": 0.0, "dp": 0.0, "pp": 0.0} for s in durs}
        for step, kind, _b, _g, _n, cat, t0, t1 in r["events"]:
            if step in comm and cat in COMM_KIND:
                comm[step][COMM_KIND[cat]] += t1 - t0
        kinds[r["rank"]] = [{"compute": durs[s] - sum(comm[s].values()), **comm[s]}
                            for s in sorted(durs)]
    slowest = [max(per_rank[r][i] for r in per_rank) for i in range(cfg.steps)]
    critical = max(per_rank, key=lambda r: statistics.median(per_rank[r]))
    by_kind = {k: statistics.median(row[k] for row in kinds[critical])
               for k in ("compute", "tp", "dp", "pp")}
    losses = [r["losses"] for r in res.ranks if r["losses"]]
    loss = [statistics.fmean(x[i] for x in losses) for i in range(len(losses[0]))] \
        if losses else []
    return {"steps_s": slowest, "step_time_s": statistics.median(slowest),
            "critical_rank": critical, "per_kind": by_kind, "loss": loss}


def validate(cfg: RunConfig, *, expected: Expected | None = None,
             result: RunResult | None = None, calibration=None) -> dict:
    """Simulate, run (unless ``result`` is given) and compare; see the module docstring.
    ``calibration``: a :class:`simulator.gloo_profile.GlooProfile` to time the prediction
    with (``clusterplan calibrate gloo``)."""
    exp = expected or expected_step(cfg, calibration=calibration)
    res = result or run(cfg)
    measured = {r["rank"]: events_from_records(r["events"]) for r in res.ranks}
    structure = compare_structure(exp.events, measured)
    meas = measure(cfg, res)
    sim = exp.simulate()
    crit = meas["critical_rank"]
    pred_kind = predicted_by_kind(exp, crit)
    predicted, measured_s = sim.step_time_s, meas["step_time_s"]
    cores = os.cpu_count() or 1
    return {
        "config": cfg.to_dict(),
        "structure": structure.to_dict(),
        "predicted_step_time_s": predicted,
        "measured_step_time_s": measured_s,
        "relative_error": predicted / measured_s - 1.0 if measured_s > 0 else None,
        "per_kind": {k: {"predicted_s": pred_kind[k], "measured_s": meas["per_kind"][k]}
                     for k in ("compute", "tp", "dp", "pp")},
        "critical_rank": crit,
        "steps_s": meas["steps_s"],
        "loss": meas["loss"],
        "run_wall_s": res.wall_s,
        "processes": cfg.world, "cores": cores, "oversubscription": cfg.world / cores,
        "calibration": calibration.source if calibration is not None else None,
        "topology": exp.topology.name, "compute_profile": f"traces/efficiency/{exp.profile.gpu.name}.yaml",
        "traces": sorted(r["trace"] for r in res.ranks if r.get("trace")),
        "real": {"tensor_parallel": "manual Megatron-style (autograd functions), gloo",
                 "pipeline": f"hand-written {cfg.schedule} from planner.model.llm.schedule, "
                             "blocking recv + isend",
                 "data_parallel": f"flat fp32 gradient buffer, {cfg.dp_buckets} buckets max, "
                                  "all-reduced after each chunk's last backward (no overlap)"},
    }


def format_report(d: dict) -> str:
    c = d["config"]
    m, p, s = c["model"], c["parallel"], d["structure"]
    lines = [
        f"validate {m['name']} ({m['layers']} blocks, hidden {m['hidden_size']}, "
        f"{m['num_heads']} heads, seq {m['seq_len']}, vocab {m['vocab_size']}) with tp={p['tp']} "
        f"pp={p['pp']} dp={p['dp']} vpp={p['vpp']}, {c['schedule']}, {c['microbatches']} "
        f"micro-batches, recompute {c['training']['activation_recompute']}: {c['backend']}, "
        f"{d['processes']} processes on {d['cores']} cores"]
    lines += verdict_lines(d, describe(s["events_per_step"]) + " per step",
                           describe(s["events_per_step"]),
                           ("real run step 0:   ", describe(s["measured_events_per_step"])))
    pk = d["per_kind"]
    lines.append(f"  per step on rank {d['critical_rank']} (predicted / measured): " + ", ".join(
        f"{k} {format_time(v['predicted_s'])} / {format_time(v['measured_s'])}"
        for k, v in pk.items()))
    if d["loss"]:
        lines.append(f"  loss {d['loss'][0]:.4f} -> {d['loss'][-1]:.4f} (warm-up included)")
    if d["oversubscription"] > 1:
        lines.append(f"  note: {d['processes']} processes share {d['cores']} cores "
                     f"({d['oversubscription']:.1f}× oversubscribed): measured times include "
                     "waiting for a core, which the prediction does not model")
    if d.get("calibration"):
        lines.append(f"  timed with the measured gloo profile {d['calibration']}")
    else:
        lines.append(f"  note: timed with the {d['topology']} priors and the all-core CPU "
                     "profile; pass --calibration FILE (clusterplan calibrate gloo) for this "
                     "machine's measured times")
    if d["traces"]:
        lines.append(f"  traces: {os.path.dirname(d['traces'][0])}/rank*.trace.json")
    return "\n".join(lines)


def verdict_lines(d: dict, matched: str, expected: str, measured: tuple[str, str]) -> list[str]:
    """The structure verdict and the step-time line of a validation report (LLM and DLRM):
    ``matched`` describes the calls when they match, ``expected`` the simulator's per step and
    ``measured`` (label, description) the real run's when they do not."""
    s = d["structure"]
    if s["match"]:
        lines = [f"  structure: MATCH on every rank and step ({s['steps_checked']} steps, "
                 f"{s['ranks']} ranks): {matched}, as in the simulator's op graph"]
    else:
        lines = [f"  structure: MISMATCH, first at {s['first_mismatch']['text']}",
                 f"    simulator per step: {expected}",
                 f"    {measured[0]} {measured[1]}"]
    err = d["relative_error"]
    lines.append(f"  step time: predicted {format_time(d['predicted_step_time_s'])}, measured "
                 f"{format_time(d['measured_step_time_s'])} (median of {len(d['steps_s'])} "
                 f"steps, slowest rank), error {err:+.0%}" if err is not None else
                 "  step time: not measured")
    return lines
