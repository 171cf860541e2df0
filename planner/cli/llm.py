"""``clusterplan simulate MODEL.yaml`` and ``clusterplan plan MODEL.yaml`` for transformers."""

from __future__ import annotations

import sys
from dataclasses import replace

from simulator.errors import SpecError
from simulator.fileio import atomic_write_text, dumps_json, read_spec_mapping
from simulator.units import format_bytes, format_time
from simulator.validation import whole

from planner.cli.constraints import layout_filter
from planner.cli.output import split_timings
from planner.llm.metrics import simulate_llm
from planner.llm.search import search
from planner.model.llm.spec import (
    LLMSpec,
    ParallelSpec,
    parse_llm_spec,
    parse_parallel,
    spec_document,
)
from planner.model.llm.trainer import TrainerSpec
from planner.model.reliability import (
    link_faults_from_args,
    reliability_report,
    stragglers_from_args,
)

__all__ = ["simulate_model", "plan_model", "load_plan_spec"]


def simulate_model(args, spec: LLMSpec, topo, emit) -> int:
    par = spec.parallel or ParallelSpec()
    if args.parallel:
        par = parse_parallel(args.parallel, spec.parallel)
    elif spec.parallel is None:
        raise SpecError("no parallel layout: the model file has no parallel: section",
                        source=spec.source, field="parallel",
                        fix="pass --parallel tp=8,pp=4,... or add a parallel: section")
    tr = spec.training
    if args.global_batch is not None:
        tr = replace(tr, global_batch_size=whole(args.global_batch, source=None,
                                                 field="--global-batch", minimum=1,
                                                 what="the global batch"))
    if args.micro_batch is not None:
        tr = replace(tr, micro_batch_size=whole(args.micro_batch, source=None,
                                                field="--micro-batch", minimum=1,
                                                what="the micro-batch"))
    spec = replace(spec, training=tr)
    slow = stragglers_from_args(args, topo.num_gpus)
    faults = link_faults_from_args(args, topo)
    res = simulate_llm(spec, par, topo, mode=args.mode, order=args.order,
                       schedule_name=args.schedule, slowdown=slow, link_faults=faults,
                       track_links=getattr(args, "diagnose", False))
    d = res.to_dict()
    extra_lines: list[str] = []
    if slow or faults:
        healthy = simulate_llm(spec, par, topo, mode=args.mode, order=args.order,
                               schedule_name=args.schedule)
        lay = res.plan.layout
        d["stragglers"] = {str(r): {"slowdown": f, "stage": lay.coords(r)["pp"]}
                           for r, f in sorted(slow.items())}
        d["link_faults"] = [{"link": f.label, "links": len(f.links), "factor": f.factor,
                             "at_s": f.at_s} for f in faults]
        d["healthy_step_time_s"] = healthy.step_time_s
        what = [f"rank {r} ×{f:g} (stage {lay.coords(r)['pp']})" for r, f in sorted(slow.items())]
        what += [f"link {f.label}" for f in faults]
        extra_lines.append(
            "  faults: " + ", ".join(what)
            + f": step {format_time(res.step_time_s)} vs {format_time(healthy.step_time_s)} "
              f"healthy ({res.step_time_s / healthy.step_time_s - 1:+.1%})")
    rel_data, rel_lines = reliability_report(args, gpus=res.parallel.world(),
                                             step_time_s=res.step_time_s, sim=res.sim,
                                             topo=topo)
    d.update(rel_data)
    extra_lines += rel_lines
    if args.trace:
        res.sim.write_chrome_trace(args.trace, max_ranks=args.trace_ranks)
        d["trace"] = args.trace
    mem = res.memory
    if not mem.fits:
        print(f"clusterplan: warning: does not fit in memory: stage {mem.stage} needs "
              f"{format_bytes(mem.total_bytes)}, {format_bytes(mem.capacity_bytes)} usable "
              f"(over by {format_bytes(mem.total_bytes - mem.capacity_bytes)}); the step time "
              "assumes it would fit", file=sys.stderr)
    p = d["parallel"]
    bd = d["breakdown"]
    lines = [
        f"{d['model']} on {d['topology']} ({d['gpus']} GPUs), tp={p['tp']} cp={p['cp']} "
        f"pp={p['pp']} dp={p['dp']} vpp={p['vpp']} fsdp={p['fsdp']}"
        + (f" ep={p['ep']}" if p['ep'] > 1 else "") + ", "
        f"{d['microbatches']} micro-batches of {d['micro_batch_size']}",
        "  " + trainer_line(spec.trainer),
        f"  step time {format_time(d['step_time_s'])}   {d['tokens_per_s']:,.0f} tokens/s   "
        f"{d['tflops_per_gpu']:.1f} TFLOP/s per GPU",
        f"  MFU {d['mfu']:.1%} (PaLM 6N+attention)   {d['mfu_megatron']:.1%} (Megatron model "
        f"FLOPs)   HFU {d['hfu']:.1%}   peak {d['mfu_conventions']['peak_flops_per_gpu'] / 1e12:.0f}"
        " TFLOP/s",
        f"  memory per GPU {format_bytes(d['memory_per_gpu_bytes'])} "
        f"({'fits' if mem.fits else 'OUT OF MEMORY'}: weights {format_bytes(mem.weights_bytes)}, "
        f"grads {format_bytes(mem.gradients_bytes)}, optimizer {format_bytes(mem.optimizer_bytes)},"
        f" activations {format_bytes(mem.activations_bytes)})",
        f"  stage {bd['stage']}: compute {format_time(bd['compute_s'])}, TP/CP comm "
        f"{format_time(bd['tp_cp_comm_s'])}, "
        + (f"EP all-to-all {format_time(bd['ep_comm_s'])}, " if d['parallel']['ep'] > 1 else "")
        + f"bubble {format_time(bd['pipeline_bubble_s'])}, "
        f"exposed DP {format_time(bd['dp_comm_exposed_s'])}, optimizer "
        f"{format_time(bd['optimizer_s'])}",
    ] + documents_lines(d.get("documents")) + offload_lines(d.get("offload")) + extra_lines
    emit(args, d, "\n".join(lines))
    return 0


def offload_lines(o: dict | None) -> list[str]:
    """The line of a token-wise activation swap (MEMO): what it moves and what set alpha."""
    if o is None:
        return []
    return [f"  offload: alpha {o['alpha']:.3f} ({o['bound']}), "
            f"{format_bytes(o['swap_bytes_per_layer'])} per block each way at "
            f"{o['copy_Bps'] / 1e9:.1f} GB/s ({format_time(o['swap_s_per_layer'])}), host "
            f"{format_bytes(o['host_bytes'])} of {format_bytes(o['host_bytes_per_gpu'])} per GPU",
            f"  memory layout: planned {o['planned_fragmentation']:.1%} over the live bytes "
            f"(a best-fit caching allocator: {o['caching_allocator_fragmentation']:.1%})"]


def documents_lines(docs: dict | None) -> list[str]:
    """Lines of a packed-documents result: the sampled batches' step times and imbalance."""
    if docs is None:
        return []
    spec = docs["documents"]
    share = {k: f"{v:.0%}" for k, v in docs["token_delay_share"].items() if v >= 0.005}
    cp = ", ".join(f"{k} {v}" for k, v in docs["cp_sharding"].items())
    return [f"  documents {spec['lengths']}, packing {spec['packing']}, CP sharding "
            f"{spec['cp_sharding']} ({cp} micro-batches): {docs['batches']} sampled batches",
            f"    step time mean {format_time(docs['step_time_mean_s'])}, median "
            f"{format_time(docs['step_time_p50_s'])}, p90 {format_time(docs['step_time_p90_s'])},"
            f" max {format_time(docs['step_time_max_s'])} (timeline and breakdown: the slowest)",
            "    imbalance (max/mean per global batch): packing "
            f"{docs['packing_imbalance_mean']:.2f} (attention Σd²), attention on the busiest CP "
            f"rank {docs['attention_imbalance_mean']:.2f}; tokens by iterations of delay: "
            + ", ".join(f"{k}: {v}" for k, v in share.items())]


def trainer_line(t: TrainerSpec) -> str:
    """One line of the trainer settings a result was simulated with."""
    return (f"trainer {t.preset}: {t.attention} attention, sequence parallel "
            f"{'on' if t.sequence_parallel else 'off'}, TP comm overlap "
            f"{'on' if t.tp_comm_overlap else 'off'}, gradients reduced {t.grad_reduce.replace('_', ' ')}"
            f" in {t.grad_reduce_dtype}, pipeline sends "
            f"{'overlapped' if t.pp_comm_overlap else 'blocking'}"
            + (f", {t.trim_first_last_stage} block(s) off the first and last stage"
               if t.trim_first_last_stage else ""))


def plan_model(args, spec: LLMSpec, topo, emit) -> int:
    """``clusterplan plan MODEL.yaml --topology NAME``: the top layouts and a plan JSON."""


    if args.top < 1:
        raise SpecError(f"--top {args.top} shows no plan", field="--top",
                        fix="pass --top 1 or more")
    allow = layout_filter(getattr(args, "constrain", None), getattr(args, "target", None))
    results, stats = search(spec, topo, top=args.top, allow=allow)
    best = results[0]
    doc = plan_document(best, topo)
    doc["alternatives"] = [r.to_dict() for r in results[1:]]
    doc["search"] = stats
    doc, timings = split_timings(doc)
    if args.out:
        atomic_write_text(args.out, dumps_json(doc, indent=1))
    lines = [f"{spec.model.name} on {topo.name} ({topo.num_gpus} × {topo.gpu.name}): "
             f"{stats['enumerated']} layouts, "
             + (f"{stats['excluded']} excluded by --constrain/--for, " if allow else "")
             + f"{stats['out_of_memory']} out of memory, "
             f"{stats['estimated']} estimated, {stats['simulated']} simulated",
             "  " + trainer_line(spec.trainer),
             f"  {'#':>2} {'tp':>3}{'cp':>3}{'pp':>4}{'dp':>5}{'ep':>4}{'vpp':>4}{'mbs':>4} {'fsdp':<6}"
             f"{'step':>11}{'MFU':>7}{'memory':>12}{'bubble':>12}{'exposed DP':>12}"
             f"  {'activations':<14}order"]
    for i, r in enumerate(results, 1):
        d = r.to_dict()
        p, bd = d["parallel"], d["breakdown"]
        acts = (f"swap α={d['offload']['alpha']:.2f}" if "offload" in d
                else r.spec.training.activation_recompute)
        lines.append(f"  {i:>2} {p['tp']:>3}{p['cp']:>3}{p['pp']:>4}{p['dp']:>5}{p['ep']:>4}"
                     f"{p['vpp']:>4}{d['micro_batch_size']:>4} {p['fsdp']:<6}"
                     f"{format_time(d['step_time_s']):>11}"
                     f"{d['mfu']:>7.1%}{format_bytes(d['memory_per_gpu_bytes']):>12}"
                     f"{format_time(bd['pipeline_bubble_s']):>12}"
                     f"{format_time(bd['dp_comm_exposed_s']):>12}  {acts:<14}"
                     f"{r.plan.layout.order}")
    sa = stats.get("scale_across")
    if sa:
        lines.append(f"  across {sa['buildings']} buildings: "
                     f"{'+'.join(sa['crossing_axes']).upper() or 'nothing'} crosses ({sa['placement']}"
                     f"; pipeline stages per building {sa['stages_per_building']}); "
                     f"{sa['gain']:+.1%} over the baseline ({sa['baseline']}: "
                     f"{format_time(sa['baseline_step_time_s'])})")
    if args.out:
        lines.append(f"  plan: {args.out}")
    emit(args, doc, "\n".join(lines), timings)
    return 0


def load_plan_spec(path: str) -> tuple[LLMSpec, dict]:
    """The model spec a plan from ``clusterplan plan MODEL`` carries (its chosen layout and
    micro-batch in it), and the plan document."""
    doc, source = read_spec_mapping(path, package="planner.models", what="plan",
                                    fix="pass a plan written by `clusterplan plan MODEL --out`")
    if not isinstance(doc.get("spec"), dict):
        raise SpecError("this plan carries no model spec (written before plans did)",
                        source=source, field="spec",
                        fix="re-run `clusterplan plan MODEL ... --out FILE` and simulate that")
    return parse_llm_spec(doc["spec"], source=f"{source} (spec)"), doc


def plan_document(res, topo) -> dict:
    """Versioned plan JSON: layout, rank order and rank → (building, host, GPU)."""
    d = res.to_dict()
    lay = res.plan.layout
    ranks = []
    for r in range(lay.world):
        dev = topo.devices[topo.gpus[r]]
        ranks.append({"rank": r, **lay.coords(r), "building": int(dev.get("building", 0)),
                      "host": int(dev.get("node", r)), "gpu": int(dev.get("local", 0)),
                      "device": topo.gpus[r]})
    m, t = res.spec.model, res.spec.training
    return {"format_version": 1, "kind": "llm-plan", "order": lay.order,
            "model": m.name, "topology": topo.name, **d,
            "spec": spec_document(res.spec, res.parallel),
            "num_layers": m.layers, "seq_len": m.seq_len, "precision": t.precision,
            **({"num_experts": m.num_experts, "moe_top_k": m.top_k} if m.is_moe else {}),
            "activation_recompute": t.activation_recompute, "ranks": ranks}


