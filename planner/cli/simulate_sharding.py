"""``clusterplan simulate`` for embedding models: a sharding plan (``plan.json``) on the plan's
topology or ``--topology``, or a table spec planned by greedy first; the spec's trainer or
``--trainer``/``--trainer-set``."""

from __future__ import annotations

from simulator.errors import SpecError
from simulator.fileio import read_json_file
from simulator.topology import load_topology, sized_topology_ref
from simulator.units import format_time

from planner.cli.options import with_dlrm_trainer
from planner.cli.planner_choice import planner_from_args
from planner.model.tables.plan import plan_model, read_plan_json
from planner.model.tables.spec_file import load_model_spec
from planner.model.tables.task import ShardingTask, prepare
from planner.workloads.dlrm.step import simulate_step

__all__ = ["simulate_sharding_plan", "simulate_table_spec"]

#: the planner ``simulate TABLES`` shards with unless ``--planner`` names another
TABLE_SPEC_PLANNER = "greedy"


def simulate_sharding_plan(args, emit) -> int:
    """Simulate the plan's step and print it (``--json``: one object)."""
    doc = read_json_file(args.workload, field="PLAN", missing_fix="give a plan from "
                         "clusterplan plan TABLES --out plan.json", json_fix="re-plan")
    model = with_dlrm_trainer(plan_model(doc, args.workload), args)
    devices = int(doc.get("devices") or 0)
    if devices < 1:
        raise SpecError("the plan has no device count", source=args.workload, field="devices",
                        fix="re-plan with clusterplan plan")
    topo = args.topology or str(doc.get("topology") or "")
    problem = prepare(ShardingTask(model=model, topology=topo), devices)
    sim = simulate_step(problem, read_plan_json(doc, problem))
    return _report(args, emit, {"plan": args.workload}, problem, sim)


def simulate_table_spec(args, emit) -> int:
    """Shard a table spec (built-in name, YAML or CSV) with ``--planner`` (default greedy) over
    ``--gpus`` ranks of ``--topology`` (default: all of its GPUs; a generated topology grows to
    hold them), then simulate that plan's step and print it. ``--global-batch`` sets the batch
    (samples)."""
    for flag in ("parallel", "micro_batch"):
        if getattr(args, flag, None) is not None:
            raise SpecError(f"--{flag.replace('_', '-')} applies to model specs, not table specs",
                            source=args.workload, field=f"--{flag.replace('_', '-')}",
                            fix="drop the flag (a table spec's plan comes from the planner)")
    if args.global_batch is not None and args.global_batch < 1:
        raise SpecError(f"--global-batch must be ≥ 1, got {args.global_batch}",
                        source="--global-batch", fix="pass samples per step, e.g. 65536")
    model = load_model_spec(args.workload).with_overrides(batch_size=args.global_batch)
    model = with_dlrm_trainer(model, args)
    devices = args.gpus or load_topology(args.topology).num_gpus
    task = ShardingTask(model=model, topology=sized_topology_ref(args.topology, devices))
    plan = planner_from_args(args).plan(task, devices, seed=0)
    if not plan.valid:
        raise SpecError(f"no valid {args.planner} plan on {devices} devices: "
                        + "; ".join(plan.problems[:3]), source=args.workload, field="--gpus",
                        fix="simulate on more GPUs, or plan with clusterplan plan TABLES "
                            "--planner mip --out plan.json and simulate plan.json")
    problem = prepare(task, devices)
    sim = simulate_step(problem, plan.shardings)
    return _report(args, emit, {"tables": args.workload, "planner": args.planner},
                   problem, sim)


def _report(args, emit, head: dict, problem, sim) -> int:
    """Print one simulated DLRM step (``--json``: one object starting with ``head``)."""
    model, devices = problem.model, problem.devices
    rate = model.batch_size / sim.step_time_s
    data = {**head, "model": model.name, "topology": problem.topology_ref,
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
    if "planner" in head:
        lines.append(f"  plan: {head['planner']}, seed 0 (clusterplan plan {head['tables']} "
                     "--planner NAME --out plan.json, then simulate plan.json, for another)")
    lines += [f"  extrapolated: {x}" for x in data["extrapolated"]]
    if args.trace:
        lines.append(f"  trace: {args.trace} (open in https://ui.perfetto.dev)")
    emit(args, data, "\n".join(lines))
    return 0
