"""Simulator cost at scale, the cases of issue 23 side by side: wall time, peak memory, events.

    python tests/bench/bench_scale.py [--rings 512,4096,8192] [--repeats 3] [--llm] [--json]
                                      [--against DIR]

Cases (each run in a fresh process, so its peak resident memory is its own):

- ``ring N``: a 1 GiB ring all-reduce over a ring of N devices written as an explicit YAML
  topology (devices that forward, one full-duplex link to each neighbour: the shape of
  ASTRA-sim's ``Ring`` network), parsed from the file as a user's topology is, through
  ``clusterplan collective allreduce --algo ring``. Figures for ASTRA-sim 2.x's analytical
  backend on the same machine class (issue 23): 0.79 s at 512, 131 s at 4,096.
- ``--llm``: Llama 3 405B steps on ``llama3-h100-24k`` (16,384 GPUs): the 8K-sequence step
  (TP8/PP16/DP128, 2,048 sequences) and the long-context row (TP8/CP16/PP16/DP8, sequence
  131,072, 128 sequences: 16M tokens), each in the symmetric mode (what ``auto`` picks above
  8,192 GPUs) and the explicit one, run alternately; prints symmetric's time over explicit's.
- ``--scaling``: the 8K step (TP8/PP16, 16 sequences per DP replica) on 1,024, 4,096 and
  16,384 GPUs of the same fabric, both modes: the engine's µs per event at each size and the
  ratio 16,384 : 1,024 (issue 23 asks for at most 2).

Prints per case the median wall time of ``--repeats`` runs (the whole command, start-up and
parsing included), the peak RSS, the simulator's event count, the median seconds of the
simulation call alone (``sim``: building the step and running it, no imports or file parsing)
and the engine's µs per event, and the simulated time (identical across runs: the answer must
not change with speed work). ``--against DIR`` runs every case on a second checkout too (e.g.
``git worktree add /tmp/base HEAD~1``), alternating the two, and prints the ratios and whether
the answers agree to 0.1%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RUNNER = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from simulator.topology import load_topology
from simulator.collectives import simulate_collective
kind = sys.argv[1]
if kind == "ring":
    topo = load_topology(sys.argv[2])
    t1 = time.perf_counter()
    res = simulate_collective(topo, "allreduce", list(range(topo.num_gpus)), 2**30, algo="ring")
    t2 = time.perf_counter()
    out = {"time_s": res.time_s, "events": res.events, "parse_s": t1 - t0, "sim_s": t2 - t1,
           "engine_s": t2 - t1}
else:
    from planner.llm.metrics import simulate_llm
    from planner.model.llm.spec import load_llm_spec, ParallelSpec
    from dataclasses import replace
    spec = load_llm_spec("llama3-405b")
    gpus = int(sys.argv[3]) if len(sys.argv) > 3 else 16384
    topo = load_topology("llama3-h100-24k", gpus=gpus)
    if kind == "llm-8k":
        dp = gpus // 128
        spec = replace(spec, training=replace(spec.training, global_batch_size=16 * dp))
        par = ParallelSpec(tp=8, pp=16, dp=dp)
    else:
        m = replace(spec.model, seq_len=131072)
        spec = replace(spec, model=m, training=replace(spec.training, global_batch_size=128))
        par = ParallelSpec(tp=8, cp=16, pp=16, dp=8)
    t1 = time.perf_counter()
    res = simulate_llm(spec, par, topo, mode=sys.argv[2])
    out = {"time_s": res.step_time_s, "events": res.sim.events, "parse_s": t1 - t0,
           "sim_s": time.perf_counter() - t1, "engine_s": res.sim.wall_s}
out["wall_s"] = time.perf_counter() - t0
out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(out))
"""


def ring_yaml(n: int) -> str:
    """An explicit ring of ``n`` forwarding devices (50 GB/s, 0.5 µs per link)."""
    lines = [f"name: ring-{n}", "gpu: h100-sxm", "devices:"]
    lines += [f"  - {{id: n{i}, kind: gpu, transit: true}}" for i in range(n)]
    lines.append("links:")
    lines += [f"  - {{a: n{i}, b: n{(i + 1) % n}, bandwidth: 50 GB/s, latency: 0.5 us, "
              f"kind: nvlink}}" for i in range(n)]
    return "\n".join(lines) + "\n"


def run_case(args: list[str], root: Path = ROOT) -> dict:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", _RUNNER, *args], cwd=root, capture_output=True,
                       text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"case {args} failed:\n{p.stderr[-2000:]}")
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def _row(name: str, runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)   # noqa: E731
    return {"case": name, "wall_s": med("process_s"),
            "peak_rss_mb": max(r["peak_rss_bytes"] for r in runs) / 1e6,
            "events": runs[0]["events"], "sim_s": med("sim_s"),
            "us_per_event": med("engine_s") / max(1, runs[0]["events"]) * 1e6,
            "parse_s": med("parse_s"), "simulated_s": runs[0]["time_s"],
            "same_answer": len({r["time_s"] for r in runs}) == 1}


def _print(row: dict) -> None:
    print(f"{row['case']:<60} {row['wall_s']:6.2f} s {row['peak_rss_mb']:6.0f} MB "
          f"{row['events']:>8} events  sim {row['sim_s']:.2f} s {row['us_per_event']:6.1f} "
          f"µs/event  (start+parse {row['parse_s']:.2f} s)  simulated {row['simulated_s']:.6g} s",
          flush=True)


def _cases(a, tmp: str) -> list[list[tuple[str, list[str]]]]:
    """Groups of cases; the cases of a group (and the checkouts) run alternately."""
    groups = []
    for n in [int(x) for x in a.rings.split(",") if x]:
        path = Path(tmp) / f"ring-{n}.yaml"
        path.write_text(ring_yaml(n))
        groups.append([(f"ring all-reduce 1 GiB, {n} devices (YAML)", ["ring", str(path)])])
    if a.llm:
        for kind, label in (("llm-8k", "Llama 3 405B 8K, TP8/PP16/DP128, 16,384 GPUs"),
                            ("llm-long", "Llama 3 405B CP16 seq 131,072, 16,384 GPUs")):
            groups.append([(f"{label}, {mode}", [kind, mode]) for mode in MODES])
    if a.scaling:
        for gpus in (1024, 4096, 16384):
            groups.append([(f"405B 8K step, {gpus:,} GPUs, {mode}", ["llm-8k", mode, str(gpus)])
                           for mode in MODES])
    return groups


MODES = ("symmetric", "explicit")


def _compare(name: str, new: dict, old: dict) -> dict:
    agree = abs(new["simulated_s"] / old["simulated_s"] - 1) <= 1e-3
    return {"case": name, "speedup": old["wall_s"] / new["wall_s"],
            "sim_speedup": old["sim_s"] / new["sim_s"],
            "memory_ratio": new["peak_rss_mb"] / old["peak_rss_mb"],
            "answers_agree_0.1%": agree}


def _summaries(rows: list[dict]) -> list[str]:
    """Symmetric over explicit per case, and the µs/event growth from 1,024 to 16,384 GPUs."""
    by = {r["case"]: r for r in rows if "wall_s" in r}
    lines = []
    for name, r in by.items():
        if name.endswith(", symmetric"):
            e = by.get(name[:-len("symmetric")] + "explicit")
            if e:
                lines.append(f"{name[:-len(', symmetric')]}: symmetric/explicit sim time "
                             f"{r['sim_s'] / e['sim_s']:.2f}, whole command "
                             f"{r['wall_s'] / e['wall_s']:.2f}")
    for mode in MODES:
        lo, hi = by.get(f"405B 8K step, 1,024 GPUs, {mode}"), by.get(
            f"405B 8K step, 16,384 GPUs, {mode}")
        if lo and hi:
            lines.append(f"µs per event, {mode}: {lo['us_per_event']:.1f} at 1,024 GPUs, "
                         f"{hi['us_per_event']:.1f} at 16,384 "
                         f"(x{hi['us_per_event'] / lo['us_per_event']:.2f})")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rings", default="512,4096,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llm", action="store_true", help="also the two Llama 3 405B steps")
    ap.add_argument("--scaling", action="store_true",
                    help="also the 8K step at 1,024, 4,096 and 16,384 GPUs (µs per event)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="DIR", help="a second checkout to run side by side")
    a = ap.parse_args()
    rows = []
    roots = [("", ROOT)] + ([("base", Path(a.against))] if a.against else [])
    with tempfile.TemporaryDirectory() as tmp:
        for group in _cases(a, tmp):
            runs = {(name, label): [] for name, _ in group for label, _ in roots}
            for _ in range(a.repeats):                 # alternate: drift hits all alike
                for name, argv in group:
                    for label, root in roots:
                        runs[name, label].append(run_case(argv, root))
            for name, _ in group:
                got = {label: _row(f"{name}{' [' + label + ']' if label else ''}",
                                   runs[name, label]) for label, _ in roots}
                rows += got.values()
                if not a.json:
                    for row in got.values():
                        _print(row)
                if a.against:
                    cmp = _compare(name, got[""], got["base"])
                    rows.append(cmp)
                    if not a.json:
                        print(f"  -> {cmp['speedup']:.2f}x faster (simulation alone "
                              f"{cmp['sim_speedup']:.2f}x), memory x{cmp['memory_ratio']:.2f}, "
                              f"answers agree to 0.1%: {cmp['answers_agree_0.1%']}", flush=True)
    lines = _summaries([r for r in rows if not r["case"].endswith("[base]")])
    if a.json:
        print(json.dumps({"rows": rows, "summary": lines}, indent=2))
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
