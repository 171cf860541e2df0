"""Subcommands of ``clusterplan``: each registers its parser and implements ``run(args)``."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.errors import SpecError
from simulator.units import format_bandwidth, format_bytes, format_time, parse_bytes

__all__ = ["register"]


def register(sub) -> None:
    from planner.cli.calibrate import add_calibrate_command
    for fn in (_topology, _gpus, _collective, _simulate, _plan, _measure, _export, _fidelity):
        fn(sub)
    add_calibrate_command(sub)
    _diagnose(sub)
    from planner.cli.reorder import add_probe_command, add_reorder_command
    add_reorder_command(sub)
    add_probe_command(sub)
    from planner.cli.costmodel import add_costmodel_command
    add_costmodel_command(sub)


def _common_topology(p: argparse.ArgumentParser, *, default: str | None = None) -> None:
    p.add_argument("--topology", default=default, required=default is None, metavar="NAME|FILE",
                   help="built-in name or YAML file; NAME:key=value,... overrides fields "
                        "(e.g. selene-a100:nodes=192)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="resize a generated topology to at least N GPUs (sets nodes)")


def _load_topology(args):
    from simulator.topology import load_topology
    return load_topology(args.topology, gpus=args.gpus)


def _emit(args, data, human):
    from planner.cli.main import emit
    emit(args, data, human)


# -- topology -------------------------------------------------------------------------------
def _topology(sub) -> None:
    p = sub.add_parser("topology", help="show or list topologies",
                       description="Show a topology's GPUs, nodes, tiers and bisection bandwidth.")
    tsub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    s = tsub.add_parser("show", help="summarise a topology")
    s.add_argument("topology", metavar="NAME|FILE",
                   help="built-in name or YAML file, with optional :key=value overrides")
    s.add_argument("--gpus", type=int, default=None, metavar="N", help="resize to N GPUs")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=_topology_show)
    ls = tsub.add_parser("list", help="list built-in topologies")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=_topology_list)


def _topology_show(args) -> int:
    from planner.cli.summary import format_topology_summary, topology_summary
    s = topology_summary(_load_topology(args))
    _emit(args, s, format_topology_summary(s))
    return 0


def _topology_list(args) -> int:
    from simulator.topology import builtin_topology_names, load_topology
    rows = []
    for name in builtin_topology_names():
        t = load_topology(name)
        rows.append({"name": name, "gpu": t.gpu.name, "gpus": t.num_gpus, "nodes": t.num_nodes})
    human = "\n".join(f"{r['name']:<22}{r['gpus']:>7} × {r['gpu']:<10} {r['nodes']:>5} nodes"
                      for r in rows)
    _emit(args, {"topologies": rows}, human)
    return 0


# -- gpus -------------------------------------------------------------------------------------
def _gpus(sub) -> None:
    p = sub.add_parser("gpus", help="list the GPU catalog with sources")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_gpus_run)


def _gpus_run(args) -> int:
    from simulator.hardware import gpu_names, gpu_spec
    rows = []
    for n in gpu_names():
        g = gpu_spec(n)
        rows.append({"name": n, "vendor_name": g.vendor_name, "peak_flops": dict(g.peak_flops),
                     "hbm_bytes": g.hbm_bytes, "hbm_bandwidth_Bps": g.hbm_bandwidth_Bps,
                     "nvlink_bandwidth_Bps": g.nvlink_bandwidth_Bps, "sources": dict(g.sources)})
    lines = [f"{'kind':<11}{'bf16 TFLOP/s':>13}{'fp32 TFLOP/s':>13}{'memory':>12}{'HBM GB/s':>10}"
             f"{'NVLink GB/s':>12}"]
    for r in rows:
        pf = r["peak_flops"]
        lines.append(f"{r['name']:<11}{pf.get('bf16', float('nan')) / 1e12:>13.1f}"
                     f"{pf.get('fp32', float('nan')) / 1e12:>13.2f}{format_bytes(r['hbm_bytes']):>12}"
                     f"{r['hbm_bandwidth_Bps'] / 1e9:>10.0f}{r['nvlink_bandwidth_Bps'] / 1e9:>12.0f}")
    _emit(args, {"gpus": rows}, "\n".join(lines))
    return 0


# -- collective -------------------------------------------------------------------------------
def _collective(sub) -> None:
    p = sub.add_parser("collective", help="time one collective on a topology",
                       description="Simulate one collective alone on an idle network and print "
                                   "time, algorithm bandwidth and bus bandwidth (nccl-tests "
                                   "conventions).")
    p.add_argument("kind", choices=("allreduce", "allgather", "reducescatter", "alltoall",
                                    "broadcast"))
    p.add_argument("--size", required=True, metavar="BYTES",
                   help="message size with unit, e.g. 1GiB, 64MB, 4096")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="group size: ranks 0..N-1 (default: all GPUs)")
    p.add_argument("--algo", default="auto",
                   help="auto (NCCL-like choice), ring, tree, hierarchical, halving_doubling, "
                        "nvls, direct, pairwise")
    p.add_argument("--mode", default="explicit", choices=("explicit", "symmetric"),
                   help="flow simulation mode (symmetric: identical flows aggregated)")
    _common_topology(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_collective_run)


def _collective_run(args) -> int:
    from simulator.collectives import simulate_collective
    size = parse_bytes(args.size, field="--size")
    topo = _load_topology(args)
    n = args.ranks if args.ranks is not None else topo.num_gpus
    if not 1 <= n <= topo.num_gpus:
        raise SpecError(f"--ranks {n} but {topo.name} has {topo.num_gpus} GPUs", field="--ranks",
                        fix=f"use 1..{topo.num_gpus} or a bigger topology (--gpus)")
    r = simulate_collective(topo, args.kind, range(n), size, algo=args.algo, mode=args.mode)
    data = r.to_dict() | {"topology": topo.name}
    human = (f"{args.kind} of {format_bytes(size)} over {n} ranks on {topo.name} "
             f"({r.algorithm}, {r.channels} channel{'s' if r.channels != 1 else ''}, {r.mode}):\n"
             f"  time {format_time(r.time_s)}   algbw {format_bandwidth(r.algbw_Bps)}   "
             f"busbw {format_bandwidth(r.busbw_Bps)}")
    _emit(args, data, human)
    return 0


# -- simulate ---------------------------------------------------------------------------------
def _simulate(sub) -> None:
    p = sub.add_parser("simulate", help="simulate a training step (model or op DAG) on a topology",
                       description="Simulate one training step: a transformer spec (model:, "
                                   "training:, parallel:; see planner/model/llm/spec.py) or a workload "
                                   "YAML (an op DAG; see simulator/workload_spec.py), by path or "
                                   "built-in name (llama3-405b, gpt3-175b, dp-step ...).")
    p.add_argument("workload", metavar="MODEL|WORKLOAD", help="YAML file or built-in name")
    _common_topology(p)
    p.add_argument("--parallel", metavar="SPEC", help="e.g. tp=8,cp=1,pp=16,dp=128,vpp=1")
    p.add_argument("--global-batch", type=int, metavar="N", help="sequences per step")
    p.add_argument("--micro-batch", type=int, metavar="N", help="sequences per micro-batch")
    p.add_argument("--order", default="tp-cp-dp-pp",
                   help="placement of parallel axes, innermost first (default tp-cp-dp-pp)")
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe", "interleaved"))
    p.add_argument("--mode", default="auto", choices=("auto", "explicit", "symmetric"))
    p.add_argument("--trace", metavar="FILE", help="write a Chrome/Perfetto trace JSON")
    p.add_argument("--trace-ranks", type=int, default=64, metavar="N",
                   help="ranks to include in the trace (default 64)")
    p.add_argument("--json", action="store_true", help="print JSON")
    from planner.model.reliability import add_arguments as _reliability_arguments
    _reliability_arguments(p)
    p.set_defaults(func=_simulate_run)


def _is_model(ref: str) -> bool:
    import yaml
    from planner.model.llm.spec import builtin_model_names
    if ref in builtin_model_names():
        return True
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") and p.exists():
        try:
            doc = yaml.safe_load(p.read_text())
        except yaml.YAMLError:
            return False
        return isinstance(doc, dict) and "model" in doc
    return False


def _simulate_run(args) -> int:
    from simulator.engine import simulate
    from simulator.workload_spec import load_workload
    if args.trace and not Path(args.trace).resolve().parent.is_dir():
        raise SpecError(f"directory of {args.trace} does not exist", field="--trace",
                        fix="create the directory or write the trace elsewhere")
    topo = _load_topology(args)
    if _is_model(args.workload):
        from planner.cli.llm import simulate_model
        from planner.model.llm.spec import load_llm_spec
        from planner.cli.main import emit
        return simulate_model(args, load_llm_spec(args.workload), topo, emit)
    from planner.model.reliability import link_faults_from_args, reliability_report, stragglers_from_args
    w = load_workload(args.workload, num_gpus=topo.num_gpus)
    res = simulate(topo, w, mode="explicit" if args.mode == "auto" else args.mode,
                   slowdown=stragglers_from_args(args, topo.num_gpus),
                   link_faults=link_faults_from_args(args, topo), track_links=args.diagnose)
    df = res.ops
    by_cat = df.groupby("category").duration_s.sum()
    compute_ops = df[df.kind == "compute"]
    # exposed communication: step time on rank 0 not covered by its compute
    r0 = compute_ops[compute_ops.first_rank == 0]
    exposed = res.step_time_s - float(r0.duration_s.sum())
    data = {"workload": w.name, "topology": topo.name, "mode": res.mode,
            "step_time_s": res.step_time_s, "ops": len(df),
            "compute_time_rank0_s": float(r0.duration_s.sum()),
            "exposed_comm_rank0_s": exposed,
            "busy_time_by_category_s": {k: float(v) for k, v in by_cat.items()},
            "events": res.events, "wall_s": res.wall_s}
    if args.trace:
        res.write_chrome_trace(args.trace, max_ranks=args.trace_ranks)
        data["trace"] = args.trace
    lines = [f"{w.name} on {topo.name} ({topo.num_gpus} GPUs, {res.mode}): step time "
             f"{format_time(res.step_time_s)}",
             f"  rank 0: compute {format_time(data['compute_time_rank0_s'])}, exposed communication "
             f"{format_time(exposed)}"]
    comm = df[df.kind != "compute"]
    if len(comm):
        lines.append("  collectives (first instance):")
        for name, g in comm.groupby("name", sort=False):
            row = g.iloc[0]
            lines.append(f"    {name:<14}{row.algorithm:<16}{format_bytes(row.bytes):>12}"
                         f"  {format_time(row.duration_s):>12}  ({len(g)} groups of {row.ranks})")
    if res.link_faults:
        data["link_faults"] = [{"link": f.label, "links": len(f.links), "factor": f.factor,
                                "at_s": f.at_s} for f in res.link_faults]
        lines.append("  link faults: " + ", ".join(f.label for f in res.link_faults))
    if res.slowdown:
        data["stragglers"] = {str(r): f for r, f in sorted(res.slowdown.items())}
        lines.append("  stragglers: " + ", ".join(f"rank {r} ×{f:g}"
                                                   for r, f in sorted(res.slowdown.items())))
    rel_data, rel_lines = reliability_report(args, gpus=topo.num_gpus,
                                             step_time_s=res.step_time_s,
                                             busy_s=res.compute_busy_s(), sim=res, topo=topo)
    data.update(rel_data)
    lines += rel_lines
    lines.append(f"  {res.events} events in {res.wall_s:.3f} s wall")
    if args.trace:
        lines.append(f"  trace: {args.trace} (open in https://ui.perfetto.dev)")
    _emit(args, data, "\n".join(lines))
    return 0


# -- plan ---------------------------------------------------------------------------------------
def _plan(sub) -> None:
    from planner.cli.tables import add_arguments
    p = sub.add_parser("plan", help="plan LLM parallelism or embedding-table sharding",
                       description="With a model spec (llama3-70b, MODEL.yaml): search TP/CP/PP/"
                                   "DP/vpp/micro-batch/FSDP layouts on --topology and print the "
                                   "best by simulated step time. With a table spec (YAML or CSV; "
                                   "built-in criteo-dlrm, mlperf-dcnv2): shard the tables over "
                                   "--devices N so the slowest device is as fast as possible.")
    add_arguments(p)
    for action in p._actions:      # --devices is for tables; a model plan takes the topology
        if action.dest == "devices":
            action.required = False
    p.add_argument("--top", type=int, default=5, metavar="K", help="model plans: layouts to show")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="model plans: resize the topology to N GPUs")
    p.set_defaults(func=_plan_run)


# per-rank all-to-all matrices grow with N² (4,096 devices: ~30 s, ~7 GB): a bound, not a hang
MAX_SHARDING_DEVICES = 4_096


def _plan_run(args) -> int:
    if _is_model(args.tables):
        from planner.cli.llm import plan_model
        from planner.model.llm.spec import load_llm_spec
        from simulator.topology import load_topology
        from planner.cli.main import emit
        if not args.topology:
            raise SpecError("a model plan needs --topology", field="--topology",
                            fix="pass e.g. --topology h100-ib --gpus 1024")
        topo = load_topology(args.topology, gpus=args.gpus)
        return plan_model(args, load_llm_spec(args.tables), topo, emit)
    if args.devices is None:
        raise SpecError("a sharding plan needs --devices", field="--devices",
                        fix="pass --devices N")
    if args.devices > MAX_SHARDING_DEVICES:
        raise SpecError(f"--devices {args.devices} is more than the {MAX_SHARDING_DEVICES:,} "
                        "this planner handles", field="--devices",
                        fix=f"plan for at most {MAX_SHARDING_DEVICES:,} devices (shard per "
                            "embedding-parallel group and replicate)")
    from planner.cli.tables import run
    return run(args)


# -- measure (embedding sharding plans, run for real) -------------------------------------------
def _measure(sub) -> None:
    from planner.cli.tables import add_measure_command
    add_measure_command(sub)


# -- export -------------------------------------------------------------------------------------
def _export(sub) -> None:
    from planner.cli.export import add_arguments
    p = sub.add_parser("export", help="write a plan as trainer launch settings",
                       description="Turn an LLM plan JSON (clusterplan plan MODEL --out plan.json) "
                                   "into torchtitan, Megatron-LM or DeepSpeed settings, or a "
                                   "host/rank file that places every rank where the plan put it.")
    add_arguments(p)
    p.set_defaults(func=lambda a: __import__("planner.cli.export", fromlist=["run"]).run(a))


# -- fidelity ---------------------------------------------------------------------------------
def _fidelity(sub) -> None:
    p = sub.add_parser("fidelity", help="iteration-time error against published LLM runs",
                       description="Simulate the published configurations of Narayanan 2021 "
                                   "Table 1, Korthikanti 2022 and the vTrain multi-node runs and "
                                   "print the error per row and the MAPE per set (assumptions in "
                                   "planner/llm/fidelity.py).")
    p.add_argument("--set", action="append",
                   choices=("narayanan", "korthikanti", "vtrain", "vtrain-single"),
                   help="default: narayanan, korthikanti, vtrain (vtrain-single: vTrain's 1,440 "
                        "one-node runs)")
    p.add_argument("--vtrain-dir", default=str(Path(__file__).resolve().parents[2] / "shared"
                                               / "data" / "vtrain"),
                   help="folder with ground_truth_multi.csv (default ../shared/data/vtrain)")
    p.add_argument("--limit", type=int, default=None, help="first N rows of each set")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: __import__("planner.cli.llm", fromlist=["fidelity"]).fidelity(
        a, _emit))


# -- diagnose ---------------------------------------------------------------------------------
def _diagnose(sub) -> None:
    p = sub.add_parser("diagnose", help="name straggling ranks from traces of a run",
                       description="Read Chrome/Perfetto traces (clusterplan simulate --trace, or "
                                   "torch.profiler traces of a real run, one file per rank), sum "
                                   "each rank's compute time and name the ranks that stand out.")
    p.add_argument("traces", nargs="+", metavar="TRACE.json")
    p.add_argument("--min-excess", type=float, default=0.02,
                   help="flag ranks at least this much above the median (default 0.02 = 2%%)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_diagnose_run)


def _diagnose_run(args) -> int:
    from simulator.faults import find_stragglers
    from simulator.trace_read import busy_by_rank
    if not 0 <= args.min_excess < 10:
        raise SpecError(f"--min-excess {args.min_excess} is not a fraction", field="--min-excess",
                        fix="pass e.g. 0.05 for 5%")
    busy = busy_by_rank(args.traces)
    if not busy:
        raise SpecError("no compute events in the traces", source=", ".join(args.traces),
                        fix="trace compute (torch.profiler with CPU/CUDA activities)")
    found = find_stragglers(busy, min_excess=args.min_excess)
    med = sorted(busy.values())[len(busy) // 2]
    lines = [f"{len(busy)} ranks, median compute {format_time(med)} per trace"]
    lines += [f"  straggler: rank {f['rank']} {format_time(f['busy_s'])} (×{f['slowdown']:.3f})"
              for f in found] or ["  no rank stands out"]
    _emit(args, {"busy_s_by_rank": {str(r): v for r, v in busy.items()}, "stragglers": found},
          "\n".join(lines))
    return 0


def _atomic_write(path: str, text: str) -> None:
    from simulator.fileio import atomic_write_text
    atomic_write_text(path, text)
