"""DLRM plans: the simulator's expected step, the exact comparison, predicted vs measured.

:func:`validate_dlrm` returns the ``--json`` dictionary of ``clusterplan validate PLAN.json``
for a sharding plan: ``structure`` (every rank's collectives per step and process group against
:func:`planner.workloads.dlrm.torchrec_comms.torchrec_comm_ops` of the same batch: kind, bytes,
all-to-all send and receive splits in bytes, order), ``predicted_step_time_s`` (the simulated
step on this machine's topology and CPU profile), ``measured_step_time_s`` (median over the
measured steps of the slowest rank), ``relative_error``, ``per_kind`` and the configuration.
A run with ``host_probe`` also has ``host_probe_s`` (the slowest rank's lookup probes before
the warm-up and after the last step), ``host_speed`` (their median over the calibration's probe:
above 1 when the host ran slower than when it was calibrated) and ``predicted_at_host_s``
(the prediction times that: what the calibration would have predicted at the host's speed
during the run; the probe is a microbenchmark of fixed tables, nothing of the plan).
"""

from __future__ import annotations

import os
import statistics

from simulator.engine import simulate
from simulator.units import format_time

from planner.measure.tables.plans import cpu_topology_ref
from planner.measure.validate.compare import Mismatch
from planner.measure.validate.dlrm import DLRMRunConfig
from planner.measure.validate.dlrm_ops import expected_ops
from planner.measure.validate.dlrm_permute import permute_costs
from planner.measure.validate.dlrm_probes import (at_host, host_costs, lookup_scale,
                                                  size_measure, stale_note)
from planner.measure.validate.report import verdict_lines
from planner.measure.validate.runner import RunResult, run
from planner.model.tables.cost_config import CostConfig
from planner.model.tables.dense import dense_op_list
from planner.model.tables.task import ShardingTask, prepare
from planner.workloads.dlrm.torchrec import build_torchrec_step_workload
from planner.workloads.dlrm.torchrec_comms import rank_events

__all__ = ["measured_channels", "compare_dlrm", "validate_dlrm", "format_dlrm_report",
           "per_kind_rows", "predicted"]

FWD_KINDS = {"torchrec_host": "TorchRec host work", "a2a": "embedding all-to-all", "rw_comm": "reduce-scatter/all-gather",
             "dense_allreduce": "dense all-reduce", "dp_allreduce": "data-parallel all-reduce"}


def measured_channels(events, step: int) -> dict[str, list[tuple]]:
    """A worker's records of ``step`` → ``{channel: [(kind, bytes, send, recv, label)]}``."""
    out: dict[str, list[tuple]] = {}
    for step_, kind, nbytes, group, name, ch, _t0, _t1, send, recv, *_ in events:
        if step_ != step:
            continue
        key = "world" if ch == "world" else f"{ch} {list(group)}"
        out.setdefault(key, []).append((kind, int(nbytes), tuple(send), tuple(recv), name))
    return out


class DLRMMismatch(Mismatch):
    """A call that differs: (kind, bytes, send splits, receive splits, name) on each side."""

    item = "call"

    @staticmethod
    def side(x) -> str:
        if x is None:
            return "nothing"
        kind, b, send, recv, name = x
        sp = f" send {list(send)} recv {list(recv)}" if send or recv else ""
        return f"{kind} {b} B{sp} ({name})"


def compare_dlrm(cfg: DLRMRunConfig, ranks: list[dict], steps) -> dict:
    """Exact comparison of every rank's calls per step and channel (labels not compared)."""
    first = None
    counts: dict[str, int] = {}
    mcounts: dict[str, int] = {}
    for s in steps:
        ops = expected_ops(cfg, s)
        for r in ranks:
            rank = r["rank"]
            a, b = rank_events(ops, rank), measured_channels(r["events"], s)
            for ch in sorted(set(a) | set(b)):
                xs, ys = a.get(ch, []), b.get(ch, [])
                if s == steps[0]:
                    for x in xs:
                        k = f"{ch.split()[0]} {x[0]}"
                        counts[k] = counts.get(k, 0) + 1
                    for y in ys:
                        k = f"{ch.split()[0]} {y[0]}"
                        mcounts[k] = mcounts.get(k, 0) + 1
                for i in range(max(len(xs), len(ys))):
                    x = xs[i] if i < len(xs) else None
                    y = ys[i] if i < len(ys) else None
                    if (x and x[:4]) != (y and y[:4]):
                        mm = DLRMMismatch(rank, s, ch, i, x, y)
                        if first is None or (s, rank) < (first.step, first.rank):
                            first = mm
                        break
    f = first
    return {"match": f is None, "steps_checked": len(steps), "ranks": len(ranks),
            "calls_per_step": dict(sorted(counts.items())),
            "measured_calls_per_step": dict(sorted(mcounts.items())),
            "first_mismatch": None if f is None else {
                "rank": f.rank, "step": f.step, "channel": f.channel, "index": f.index,
                "expected": None if f.expected is None else list(map(_plain, f.expected)),
                "measured": None if f.measured is None else list(map(_plain, f.measured)),
                "text": f.text()}}


def _plain(x):
    return list(x) if isinstance(x, tuple) else x


def predicted(cfg: DLRMRunConfig, step: int, calibration=None) -> dict:
    """The simulated step (this machine's topology and CPU profile) of ``step``'s batch;
    with ``calibration`` (:class:`simulator.gloo_profile.GlooProfile`) the MLPs run at one
    core's measured rates, the collectives take their measured per-size times and share the
    ranks' cores with compute, and each step pays TorchRec's measured fixed cost per
    sharding type (:mod:`planner.measure.validate.calibrate`)."""

    problem = _problem(cfg, calibration)
    ops = expected_ops(cfg, step)
    host = None
    if calibration is None:
        w = build_torchrec_step_workload(problem, cfg.shardings, ops)
        res = simulate(problem.topology, w)
    else:
        hc = _host_costs(calibration, cfg.world)
        if hc:
            types = [k for k in sorted({ts.sharding_type.value for ts in cfg.shardings})
                     if k in hc]
            # every probe's intercept holds the step's own fixed cost once (taken as the
            # smallest intercept): a plan of k types pays it once, not k times
            base = min(a for a, _ in hc.values()) if hc else 0.0
            host = [sum(hc[k][0] + hc[k][1] * size_measure(k, cfg, ops, r) for k in types)
                    - base * max(0, len(types) - 1) for r in range(cfg.world)]
        w = build_torchrec_step_workload(problem, cfg.shardings, ops,
                                         compute=calibration.compute, host_s=host,
                                         fresh=calibration.fresh_alloc,
                                         reorder=permute_costs(calibration),
                                         linear=calibration.linear)
        res = simulate(problem.topology, w, compute=calibration.compute,
                       measured_comm=calibration)
    per = res.per_device()
    beyond = (comm_extrapolations(w, calibration) + linear_extrapolations(problem, calibration)
              if calibration is not None else [])
    kinds = {}
    for cat in ("emb_fwd", "emb_bwd", "mlp_fwd", "mlp_bwd", "a2a", "rw_comm",
                "dense_allreduce", "dp_allreduce"):
        sel = per[per.category == cat]
        kinds[cat] = float(sel.groupby("rank").duration_s.sum().max()) if len(sel) else 0.0
    kinds["torchrec_host"] = max(host) if host else 0.0
    return {"step_time_s": res.step_time_s, "per_kind": kinds,
            "topology": problem.topology_ref, "extrapolated": beyond}


def comm_extrapolations(workload, calibration) -> list[str]:
    """One line per (kind, processes) whose calls in ``workload`` exceed the largest size
    ``calibration`` measured for them: those times are extrapolated, not interpolated."""
    worst: dict[tuple[str, int], tuple[float, float]] = {}
    for op in workload.ops:
        if op.kind not in ("collective", "sendrecv"):
            continue
        kind = op.collective if op.kind == "collective" else "sendrecv"
        top = calibration.beyond_measured(kind, len(op.ranks), op.bytes_moved,
                                         splits=op.splits)
        if top is not None:
            key = (kind, len(op.ranks))
            worst[key] = (max(op.bytes_moved, worst.get(key, (0.0, top))[0]), top)
    return [f"{kind} of up to {nbytes / 1e6:.1f} MB on {n} processes: above the calibration's "
            f"largest measured size ({top / 1e6:.1f} MB), timed at its last interval's rate"
            for (kind, n), (nbytes, top) in sorted(worst.items())]


def linear_extrapolations(problem, calibration) -> list[str]:
    """One line per dense-part layer shape (batch, in, out) outside the grid the calibration's
    linear-layer probe measured: its GEMMs take the grid's edge rate."""
    table, d = getattr(calibration, "linear", None), problem.model.dense
    if table is None or d is None:
        return []
    dims = [t.embedding_dim for t in problem.model.tables]
    shapes = sorted({op.gemm[1:] for op in dense_op_list(d, dims, problem.cost.local_batch)
                     if op.gemm is not None and not table.covers(*op.gemm[1:])})
    r = table.ranges()
    return [f"linear layer {i} -> {o} on {b:,.0f} rows: outside the calibration's measured "
            f"batches {r['batch'][0]}-{r['batch'][1]} and widths {r['in'][0]}-{r['in'][1]}, "
            "timed at the grid's edge rate" for b, i, o in shapes]


_HOST_COSTS: dict = {}
_LOOKUP_SCALE: dict = {}


def _problem(cfg: DLRMRunConfig, calibration):
    """The plan's problem on this machine's topology; with a calibration, its lookups scaled
    by the co-running lookup probe (:func:`planner.measure.validate.dlrm_probes.lookup_scale`)."""
    scale = 1.0
    if calibration is not None:
        key = id(calibration)
        if key not in _LOOKUP_SCALE:
            _LOOKUP_SCALE[key] = (calibration, lookup_scale(calibration))
        scale = _LOOKUP_SCALE[key][1]
    return prepare(ShardingTask(model=cfg.model, topology=cpu_topology_ref(cfg.world),
                                cost=CostConfig(lookup_time_scale=scale)), cfg.world)


def _host_costs(calibration, world: int) -> dict:
    """TorchRec's host costs from the calibration's probe plans (cached per profile)."""
    key = (id(calibration), world)
    if key not in _HOST_COSTS:

        def sim(cfg, host) -> float:        # a probe simulated with host work per rank

            problem = _problem(cfg, calibration)
            w = build_torchrec_step_workload(problem, cfg.shardings,
                                             expected_ops(cfg, cfg.warmup),
                                             compute=calibration.compute, host_s=host,
                                             fresh=calibration.fresh_alloc,
                                             reorder=permute_costs(calibration),
                                             linear=calibration.linear)
            return simulate(problem.topology, w, compute=calibration.compute,
                            measured_comm=calibration).step_time_s
        _HOST_COSTS[key] = (calibration, host_costs(calibration, world, sim))
    return _HOST_COSTS[key][1]


def measure(cfg: DLRMRunConfig, res: RunResult) -> dict:
    first, last = cfg.warmup, cfg.warmup + cfg.steps
    per_rank = {}
    for r in res.ranks:
        durs = {s: t1 - t0 for s, t0, t1 in r["steps"] if first <= s < last}
        per_rank[r["rank"]] = [durs[s] for s in sorted(durs)]
    slowest = [max(v[i] for v in per_rank.values()) for i in range(cfg.steps)]
    critical = max(per_rank, key=lambda r: statistics.median(per_rank[r]))
    # per kind on the critical rank: issue + wait time of its calls, the rest is compute
    kinds = []
    for r in res.ranks:
        if r["rank"] != critical:
            continue
        for s in range(first, last):
            row = dict.fromkeys(("a2a", "rw_comm", "dense_allreduce", "dp_allreduce"), 0.0)
            for ev in r["events"]:
                if ev[0] != s:
                    continue
                kind, name, t0, t1 = ev[1], ev[4], ev[6], ev[7]
                wait = ev[10] if len(ev) > 10 else 0.0
                k = ("a2a" if kind == "alltoall" else
                     "rw_comm" if kind in ("reducescatter", "allgather") else
                     "dense_allreduce" if name.endswith("dense") else "dp_allreduce")
                row[k] += (t1 - t0) + wait
            # TorchRec's all-to-alls, reduce-scatters and all-gathers are asynchronous: their
            # issue time is not their duration, so only the (blocking) DDP all-reduces count
            row["a2a"] = row["rw_comm"] = None
            kinds.append(row)
    per_kind = {k: (None if kinds[0][k] is None else statistics.median(x[k] for x in kinds))
                for k in kinds[0]} if kinds else {}
    losses = [r["losses"] for r in res.ranks if r["losses"]]
    loss = [statistics.fmean(x[i] for x in losses) for i in range(len(losses[0]))] \
        if losses else []
    probes = [r.get("host_probe_s") or [] for r in res.ranks]
    slowest_probe = [max(p[i] for p in probes) for i in range(min(map(len, probes)))] \
        if probes else []
    return {"steps_s": slowest, "step_time_s": statistics.median(slowest),
            "critical_rank": critical, "loss": loss, "per_kind": per_kind,
            "host_probe_s": slowest_probe}


def per_kind_rows(pred: dict, meas: dict) -> dict:
    """``{kind: {predicted_s, measured_s}}``: compute (lookups and MLPs) and each kind of
    communication, per step; measured on the slowest rank where it can be (the DDP all-reduces,
    blocking in their hooks; None for compute and TorchRec's asynchronous calls)."""
    p = {"compute": sum(pred.get(k, 0.0) for k in ("emb_fwd", "emb_bwd", "mlp_fwd", "mlp_bwd")),
         "torchrec_host": pred.get("torchrec_host", 0.0),
         **{k: pred.get(k, 0.0) for k in ("a2a", "rw_comm", "dense_allreduce", "dp_allreduce")}}
    return {k: {"predicted_s": p[k], "measured_s": meas.get(k)} for k in p}


def validate_dlrm(cfg: DLRMRunConfig, *, result: RunResult | None = None,
                  calibration=None) -> dict:
    """Run (unless ``result`` is given), compare exactly, predict (timed with
    ``calibration`` when given); see the module docstring."""
    res = result or run(cfg)
    steps = list(range(cfg.warmup, cfg.warmup + cfg.steps))
    structure = compare_dlrm(cfg, res.ranks, steps)
    meas = measure(cfg, res)
    pred = predicted(cfg, steps[0], calibration)
    p, m = pred["step_time_s"], meas["step_time_s"]
    cores = os.cpu_count() or 1
    return {"config": cfg.to_dict(), "structure": structure,
            "predicted_step_time_s": p, "measured_step_time_s": m,
            "relative_error": p / m - 1.0 if m > 0 else None,
            "host_probe_s": meas["host_probe_s"], "host_speed": None,
            "predicted_at_host_s": None, **at_host(p, meas["host_probe_s"], calibration),
            "per_kind": per_kind_rows(pred["per_kind"], meas["per_kind"]),
            "critical_rank": meas["critical_rank"], "steps_s": meas["steps_s"],
            "loss": meas["loss"], "run_wall_s": res.wall_s, "processes": cfg.world,
            "cores": cores, "oversubscription": cfg.world / cores,
            "topology": pred["topology"],
            "calibration": getattr(calibration, "source", None) if calibration is not None
            else None,
            "heap": heap_notes(cfg.heap, calibration),
            "extrapolated": pred["extrapolated"],
            "traces": sorted(r["trace"] for r in res.ranks if r.get("trace")),
            "real": {"model": "TorchRec DistributedModelParallel (EmbeddingBagCollection + "
                              "dense MLPs), gloo, fused exact SGD"}}


def heap_notes(heap: str, calibration) -> list[str]:
    """What a reader must know of the run's heap policy (:mod:`planner.measure.heap`): the
    faults ``system`` adds to every step, and a calibration measured under the other policy."""
    notes = []
    if heap == "system":
        notes.append("--heap system: each step page-faults back the heap glibc trimmed at the "
                     "end of the one before, which the prediction does not model (20-45% of a "
                     "step measured on a 2-core EPYC VM)")
    other = getattr(calibration, "heap", heap) if calibration is not None else heap
    if other != heap:
        notes.append(f"the calibration was measured with --heap {other}, this run with --heap "
                     f"{heap}: its probes saw other page faults (calibrate gloo --heap {heap})")
    return notes


def format_dlrm_report(d: dict) -> str:
    c, s = d["config"], d["structure"]
    lines = [f"validate {c['model']} ({c['tables']} tables, {', '.join(c['sharding_types'])}; "
             f"batch {c['batch_size']}, {c['local_batch']} per rank) from {c['plan']}: "
             f"TorchRec DMP, {c['backend']}, {d['processes']} processes on {d['cores']} cores"]

    def desc(counts):
        return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no communication"
    lines += verdict_lines(d, desc(s["calls_per_step"]) + " per step (all ranks)",
                           desc(s["calls_per_step"]),
                           ("real run per step: ", desc(s["measured_calls_per_step"])))
    pk = d["per_kind"]
    lines.append(f"  per step (predicted / measured on rank {d['critical_rank']}): " + ", ".join(
        f"{FWD_KINDS.get(k, k)} {format_time(v['predicted_s'])} / "
        + (format_time(v['measured_s']) if v['measured_s'] is not None else "-")
        for k, v in pk.items() if v["predicted_s"] > 0 or (v["measured_s"] or 0) > 0))
    if d["loss"]:
        lines.append(f"  loss {d['loss'][0]:.4f} -> {d['loss'][-1]:.4f} (warm-up included)")
    if d["oversubscription"] > 1:
        lines.append(f"  note: {d['processes']} processes share {d['cores']} cores: measured "
                     "times include waiting for a core")
    lines += [f"  note: {n}" for n in d.get("heap", [])]
    if d.get("host_speed") is not None:
        lines.append(f"  host speed: the lookup probe took {d['host_speed']:.2f}x its calibrated "
                     f"time during this run; at that speed the prediction is "
                     f"{format_time(d['predicted_at_host_s'])} "
                     f"({d['predicted_at_host_s'] / d['measured_step_time_s'] - 1:+.1%})")
        note = stale_note(d["host_speed"])
        if note:
            lines.append(f"  note: {note}")
    lines += [f"  extrapolated: {n}" for n in d.get("extrapolated", [])]
    if d.get("calibration"):
        lines.append(f"  timed with {d['calibration']} (collective tables, one core's curves, "
                     "TorchRec probe plans); the benchmark: tests/bench/bench_validate.py")
    else:
        lines.append(f"  note: timed with the {d['topology']} priors and the CPU profile; pass "
                     "--calibration FILE (clusterplan calibrate gloo) for this machine's times")
    if d["traces"]:
        lines.append(f"  traces: {os.path.dirname(d['traces'][0])}/rank*.trace.json")
    return "\n".join(lines)
