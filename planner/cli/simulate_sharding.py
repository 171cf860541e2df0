"""``clusterplan simulate PLAN.json`` for a sharding plan: its training step again, on the plan's
topology or ``--topology``, with the spec's trainer or ``--trainer-set`` overrides."""

from __future__ import annotations

from dataclasses import replace

from simulator.errors import SpecError
from simulator.fileio import read_json_file
from simulator.units import format_time

from planner.model.tables.plan import plan_model, read_plan_json
from planner.model.tables.task import ShardingTask, prepare
from planner.model.tables.trainer import dlrm_trainer_from_args
from planner.workloads.dlrm.step import simulate_step

__all__ = ["simulate_sharding_plan"]


def simulate_sharding_plan(args, emit) -> int:
    """Simulate the plan's step and print it (``--json``: one object)."""
    doc = read_json_file(args.workload, field="PLAN", missing_fix="give a plan from "
                         "clusterplan plan TABLES --out plan.json", json_fix="re-plan")
    model = plan_model(doc, args.workload)
    model = replace(model, trainer=dlrm_trainer_from_args(
        model.trainer, getattr(args, "trainer", None), getattr(args, "trainer_set", None)))
    devices = int(doc.get("devices") or 0)
    if devices < 1:
        raise SpecError("the plan has no device count", source=args.workload, field="devices",
                        fix="re-plan with clusterplan plan")
    topo = args.topology or str(doc.get("topology") or "")
    problem = prepare(ShardingTask(model=model, topology=topo), devices)
    sim = simulate_step(problem, read_plan_json(doc, problem))
    rate = model.batch_size / sim.step_time_s
    data = {"plan": args.workload, "model": model.name, "topology": problem.topology_ref,
            "devices": devices, "batch_size": model.batch_size,
            "trainer": model.trainer.to_dict(), "step_time_s": sim.step_time_s,
            "samples_per_s": rate, "breakdown_s": sim.breakdown_s, "a2a_bytes": sim.a2a_bytes,
            "extrapolated": problem.cost.extrapolated()}
    if args.trace:
        sim.result.write_chrome_trace(args.trace, max_ranks=args.trace_ranks)
        data["trace"] = args.trace
    lines = [f"{model.name} on {devices} × {problem.topology.gpu.name} "
             f"({problem.topology_ref}), batch {model.batch_size:,}: step "
             f"{format_time(sim.step_time_s)}, {rate:,.0f} samples/s",
             "  " + ", ".join(f"{k} {format_time(v)}" for k, v in sim.breakdown_s.items() if v),
             f"  trainer: {model.trainer.describe()}"]
    lines += [f"  extrapolated: {x}" for x in data["extrapolated"]]
    if args.trace:
        lines.append(f"  trace: {args.trace} (open in https://ui.perfetto.dev)")
    emit(args, data, "\n".join(lines))
    return 0
