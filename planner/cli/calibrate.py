"""``clusterplan calibrate``: fit or measure the simulator's parameters (nccl-tests tables,
kernel timings, this CPU, gloo, eager PyTorch's host time)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import yaml

from simulator.compute import load_compute_profile
from simulator.errors import SpecError
from simulator.units import format_time

from planner.cli.calibrate_steps import add_parser as add_calibrate_steps, run_steps
from planner.cli.options import topology_arguments, topology_from_args
from planner.cli.output import atomic_write, emit
from planner.cli.tables import add_calibrate_embedding, run_calibrate_embedding
from planner.measure.heap import DEFAULT_HEAP, HEAP_HELP, HEAP_POLICIES
from planner.measure.compute.cpu import measure_cpu_profile
from planner.measure.compute.fit import profile_from_measurements, read_measurements
from planner.measure.compute.host import host_overhead_yaml, measure_host_overhead
from planner.measure.network.fit import fit_collective_profile, read_nccl_table
from planner.measure.tables.fit_gpu import (defer_backward, fit_fused_tbe, fit_gpu_embedding,
                                            gpu_embedding_yaml)
from planner.measure.validate.cache import store_calibration
from planner.measure.validate.calibrate import GlooCalibration, measure_gloo
from planner.measure.validate.calibrate_summary import summary_lines
from planner.model.tables.gpu_lookup import gpu_lookup_file

__all__ = ["register", "run"]


def register(p: argparse.ArgumentParser) -> None:
    """Add this command's description and arguments to its parser ``p``."""
    p.description = ("Fit or measure simulator parameters. `clusterplan calibrate "
                     "--backend gloo` is `clusterplan calibrate gloo`.")
    p.add_argument("--backend", choices=["gloo", "nccl"],
                   help="measure this machine's torch.distributed backend (gloo: see "
                        "`calibrate gloo`; nccl: needs CUDA GPUs)")
    p.set_defaults(func=run, out=None, json=False)
    csub = p.add_subparsers(dest="what", metavar="WHAT")
    n = csub.add_parser("nccl", help="fit collective alpha and link efficiency to nccl-tests tables",
                        description="Fit the per-step latency of an algorithm and the protocol "
                                    "efficiency of a link kind to measured nccl-tests tables, by "
                                    "running the simulator in a least-squares loop.")
    n.add_argument("--table", action="append", required=True, metavar="RANKS=FILE",
                   help="an nccl-tests CSV for a group of RANKS GPUs (repeatable)")
    n.add_argument("--kind", default="allreduce")
    n.add_argument("--algo", default="ring")
    n.add_argument("--link", default="nvlink", help="link kind whose efficiency is fitted")
    n.add_argument("--out", metavar="FILE", help="write the fitted values as YAML")
    topology_arguments(n)
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=run)
    c = csub.add_parser("compute", help="efficiency curves from kernel timings, or measure this CPU",
                        description="Fit a compute-efficiency file (traces/efficiency/*.yaml) to "
                                    "measured kernel timings (CSV: kind,dtype,flops,bytes,seconds; "
                                    "see planner/measure/compute/fit.py), or with --measure-cpu time "
                                    "numpy kernels on this machine.")
    c.add_argument("--gpu", help="catalog GPU kind the measurements were taken on")
    c.add_argument("--measurements", metavar="CSV", nargs="+",
                   help="measured kernel timings (one or more CSVs, concatenated)")
    c.add_argument("--source", default="measured kernel timings",
                   help="how the measurements were taken (recorded in the file)")
    c.add_argument("--drop-cache-resident", action="store_true",
                   help="drop memory rows faster than the HBM peak (served by L2) instead of "
                        "refusing the file")
    c.add_argument("--measure-cpu", action="store_true", help="measure this CPU instead")
    c.add_argument("--out", required=True, metavar="FILE", help="efficiency YAML to write")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run)
    add_calibrate_embedding(csub)
    csub.choices["embedding"].set_defaults(func=run)
    add_calibrate_steps(csub).set_defaults(func=run)
    e = csub.add_parser("gpu-embedding", help="fit a GPU's row-gather constants to its measured "
                                              "embedding lookups",
                        description="Fit the lookup model of one GPU kind to DIR/tbe.csv (fused "
                                    "lookups, forward and backward, measured by python -m "
                                    "planner.measure.tables.gpu_dlrm) or else DIR/embedding.csv "
                                    "(nn.EmbeddingBag forwards, python -m "
                                    "planner.measure.compute.gpu --only embedding) and write "
                                    "traces/calibration/embedding-<gpu>.yaml, which plans on that "
                                    "GPU then read (planner/measure/tables/fit_gpu.py).")
    e.add_argument("folder", metavar="DIR", help="a measured folder, e.g. traces/measured/h200")
    e.add_argument("--gpu", required=True, help="catalog GPU kind it was measured on")
    e.add_argument("--out", metavar="FILE",
                   help="YAML to write (default traces/calibration/embedding-<gpu>.yaml)")
    e.add_argument("--backward-from", metavar="KIND",
                   help="take the backward terms from KIND's file (a kind measured with the "
                        "host-free kernel), keeping this fit's own as a record")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=run)
    h = csub.add_parser("host", help="measure eager PyTorch's host time per transformer block",
                        description="Time a Megatron-style block with tiny tensors on this CPU "
                                    "(forward, backward, full recompute): the host floor a GPU "
                                    "step cannot go below (planner/model/llm/host.py). Needs torch.")
    h.add_argument("--out", metavar="FILE", help="YAML to write (traces/calibration/ format)")
    h.add_argument("--repeats", type=int, default=40)
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=run)
    g = csub.add_parser("gloo", help="measure torch.distributed (gloo) on this machine: "
                                     "collectives per size, one core's compute, host time",
                        description="Spawn gloo processes (one thread each, pinned to a core) "
                                    "and measure per-size tables of every collective (all-reduce, "
                                    "all-gather, reduce-scatter, all-to-all, broadcast, send/recv), "
                                    "the extra cost of a call issued after compute, one core's "
                                    "matmul / attention / memory efficiency, per-op dispatch and "
                                    "eager PyTorch's host time per block; each measured in "
                                    "--rounds rounds, the spread recorded as noise. The profile "
                                    "times `clusterplan validate --calibration FILE`. See "
                                    "planner/measure/validate/README.md.")
    g.add_argument("--out", metavar="FILE", default="traces/calibration/gloo-localhost.yaml",
                   help="profile YAML to write (default %(default)s)")
    g.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    g.add_argument("--rounds", type=int, default=2, help="measurement rounds (default 2)")
    g.add_argument("--heap", choices=HEAP_POLICIES, default=DEFAULT_HEAP, help=HEAP_HELP)
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=run)


def run(args) -> int:
    """Run the calibration ``args.what`` names (none: ``--backend``'s measurement)."""
    actions = {"nccl": _calibrate_nccl, "compute": _calibrate_compute,
               "embedding": run_calibrate_embedding, "host": _calibrate_host, "steps": run_steps,
               "gloo": _calibrate_gloo, "gpu-embedding": _calibrate_gpu_embedding}
    return actions.get(args.what, _calibrate_backend)(args)


def _calibrate_gpu_embedding(args) -> int:
    fused = (Path(args.folder) / "tbe.csv").is_file()
    doc = (fit_fused_tbe if fused else fit_gpu_embedding)(args.folder, args.gpu)
    if args.backward_from:
        doc = defer_backward(doc, args.backward_from)
    out = args.out or f"traces/calibration/{gpu_lookup_file(args.gpu)}"
    atomic_write(out, gpu_embedding_yaml(doc))
    f = doc["fit"]
    back = doc.get("fit_backward")
    back = (f"; backward MAPE {100 * back['mape']:.1f}% (worst {100 * back['worst']:+.1f}%)"
            if back else "")
    emit(args, doc, f"{args.gpu}: HBM efficiency {doc['hbm_efficiency']:.3f}, "
                    f"{doc['lookup_overhead_bytes']:.1f} B per lookup; {f['rows']} rows, MAPE "
                    f"{100 * f['mape']:.1f}% (worst {100 * f['worst']:+.1f}%){back}; wrote {out}")
    return 0


def _calibrate_nccl(args) -> int:
    topo = topology_from_args(args)
    parts = []
    for item in args.table:
        ranks, eq, path = item.partition("=")
        if not eq or not ranks.isdigit():
            raise SpecError(f"--table {item!r} is not RANKS=FILE", field="--table",
                            fix="write e.g. --table 8=a100_allreduce_8gpu_lut.txt")
        df = read_nccl_table(path)
        parts.append(df.assign(ranks=int(ranks)))
    pts = pd.concat(parts, ignore_index=True)
    fit = fit_collective_profile(topo, pts, kind=args.kind, algo=args.algo, link_kind=args.link)
    per = {int(n): {"mape_all": fit.mape(ranks=int(n)),
                    "mape_ge_64MiB": fit.mape(ranks=int(n), min_bytes=64 * 2**20)}
           for n in sorted(pts.ranks.unique())}
    data = {"topology": topo.name, "kind": args.kind, "algorithm": args.algo,
            "alpha_s": fit.alpha_s, "link_kind": args.link, "efficiency": fit.efficiency,
            "local_Bps": fit.local_Bps, "mape_by_ranks": per}
    if args.out:
        atomic_write(args.out, yaml.safe_dump(
            {"fitted_to": [str(t) for t in args.table], "topology": topo.name,
             "kind": args.kind, "algorithm": args.algo, "alpha_s": fit.alpha_s,
             "efficiency": {args.link: fit.efficiency}, "local_bandwidth_Bps": fit.local_Bps,
             "mape_by_ranks": per}, sort_keys=False))
    lines = [f"fitted {args.kind}/{args.algo} on {topo.name}: alpha = {fit.alpha_s * 1e6:.2f} µs per "
             f"step, {args.link} efficiency = {fit.efficiency:.4f}, local pass "
             f"{fit.local_Bps / 1e9:.1f} GB/s",
             f"  {'ranks':>5}{'MAPE all':>10}{'MAPE ≥64MiB':>13}"]
    for nr, m in per.items():
        lines.append(f"  {nr:>5}{m['mape_all'] * 100:>9.2f}%{m['mape_ge_64MiB'] * 100:>12.2f}%")
    emit(args, data, "\n".join(lines))
    return 0


def _calibrate_compute(args) -> int:
    if args.measure_cpu == bool(args.measurements):
        raise SpecError("give either --measurements CSV (with --gpu) or --measure-cpu",
                        field="--measurements", fix="pass exactly one of them")
    if args.measure_cpu:
        prof = measure_cpu_profile()
    else:
        if not args.gpu:
            raise SpecError("--measurements needs --gpu", field="--gpu",
                            fix="name the catalog kind, e.g. --gpu h100-sxm")
        frames = [read_measurements(path) for path in args.measurements]
        prof = profile_from_measurements(args.gpu, pd.concat(frames, ignore_index=True),
                                         source=args.source,
                                         drop_cache_resident=args.drop_cache_resident)
    text = yaml.safe_dump(prof, sort_keys=False)
    atomic_write(args.out, text)
    check = load_compute_profile(prof["gpu"], args.out)      # the file loads as written
    data = {"out": args.out, "gpu": prof["gpu"], "launch_overhead_s": check.launch_overhead_s,
            "matmul_dtypes": sorted(check.matmul)}
    emit(args, data, f"wrote {args.out} for {prof['gpu']}: matmul curves for "
                      f"{', '.join(sorted(check.matmul))}, launch {format_time(check.launch_overhead_s)}")
    return 0


def _calibrate_backend(args) -> int:
    if args.what is None and args.backend == "gloo":
        args.out = "traces/calibration/gloo-localhost.yaml"
        args.nproc, args.rounds = 2, 2
        return _calibrate_gloo(args)
    if args.what is None and args.backend == "nccl":
        raise SpecError("measuring NCCL needs CUDA GPUs and is not built yet; fit NCCL from "
                        "nccl-tests tables instead", field="--backend",
                        fix="use `clusterplan calibrate nccl --table RANKS=FILE`, or --backend gloo")
    raise SpecError("say what to calibrate", field="WHAT",
                    fix="use one of: nccl, compute, embedding, host, gloo (or --backend gloo)")


def _calibrate_gloo(args) -> int:
    if not 2 <= args.nproc <= 8:
        raise SpecError(f"--nproc {args.nproc} is outside 2..8", field="--nproc",
                        fix="use --nproc 2 (one process per core of this machine)")
    if not 1 <= args.rounds <= 10:
        raise SpecError(f"--rounds {args.rounds} is outside 1..10", field="--rounds",
                        fix="use --rounds 2 or 3")
    doc = measure_gloo(GlooCalibration(world=args.nproc, rounds=args.rounds,
                                       heap=getattr(args, "heap", DEFAULT_HEAP)))
    atomic_write(args.out, "# clusterplan calibrate gloo: see planner/measure/validate/calibrate.py\n"
                  + yaml.safe_dump(doc, sort_keys=False, width=100))
    cached = store_calibration(doc, args.nproc)      # what `validate unseen` reads on this host
    emit(args, doc, "\n".join(summary_lines(doc) + [f"wrote {args.out} and {cached}"]))
    return 0


def _calibrate_host(args) -> int:
    if args.repeats < 5:
        raise SpecError(f"--repeats {args.repeats} is too few for a median", field="--repeats",
                        fix="use --repeats 5 or more")
    doc = measure_host_overhead(repeats=args.repeats)
    if args.out:
        atomic_write(args.out, host_overhead_yaml(doc))
    per, noise = doc["per_block_s"], doc["noise_iqr_over_median"]
    emit(args, doc, f"host time per block (torch {doc['torch']}, 1 thread): forward "
                     f"{format_time(per['forward'])}, backward {format_time(per['backward'])}, "
                     f"full-recompute extra {format_time(per['recompute_extra'])} "
                     f"(IQR/median {noise['forward_backward']:.0%})"
                     + (f"; wrote {args.out}" if args.out else ""))
    return 0
