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
  8,192 GPUs) and the explicit one.

Prints per case the median wall time of ``--repeats`` runs (the whole command, start-up and
parsing included), the peak RSS, the simulator's event count and µs per event, and the
simulated time (identical across runs: the answer must not change with speed work).
``--against DIR`` runs every case on a second checkout too (e.g. ``git worktree add /tmp/base
HEAD~1``), alternating the two, and prints the ratios and whether the answers agree to 0.1%.
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
    out = {"time_s": res.time_s, "events": res.events, "parse_s": t1 - t0}
else:
    from planner.llm.metrics import simulate_llm
    from planner.model.llm.spec import load_llm_spec, ParallelSpec
    from dataclasses import replace
    spec = load_llm_spec("llama3-405b")
    topo = load_topology("llama3-h100-24k", gpus=16384)
    if kind == "llm-8k":
        par = ParallelSpec(tp=8, pp=16, dp=128)
    else:
        m = replace(spec.model, seq_len=131072)
        spec = replace(spec, model=m, training=replace(spec.training, global_batch_size=128))
        par = ParallelSpec(tp=8, cp=16, pp=16, dp=8)
    t1 = time.perf_counter()
    res = simulate_llm(spec, par, topo, mode=sys.argv[2])
    out = {"time_s": res.step_time_s, "events": res.sim.events, "parse_s": t1 - t0}
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
    return {"case": name, "wall_s": statistics.median(r["process_s"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_bytes"] for r in runs) / 1e6,
            "events": runs[0]["events"],
            "us_per_event": statistics.median(r["wall_s"] - r["parse_s"] for r in runs)
            / max(1, runs[0]["events"]) * 1e6,
            "parse_s": statistics.median(r["parse_s"] for r in runs),
            "simulated_s": runs[0]["time_s"],
            "same_answer": len({r["time_s"] for r in runs}) == 1}


def _print(row: dict) -> None:
    print(f"{row['case']:<56} {row['wall_s']:8.2f} s  {row['peak_rss_mb']:8.0f} MB  "
          f"{row['events']:>9} events  {row['us_per_event']:8.1f} µs/event  "
          f"(start+parse {row['parse_s']:.2f} s)  simulated {row['simulated_s']:.6g} s",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rings", default="512,4096,8192")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--llm", action="store_true", help="also the two Llama 3 405B steps")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--against", metavar="DIR", help="a second checkout to run side by side")
    a = ap.parse_args()
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in [int(x) for x in a.rings.split(",") if x]:
            path = Path(tmp) / f"ring-{n}.yaml"
            path.write_text(ring_yaml(n))
            cases.append((f"ring all-reduce 1 GiB, {n} devices (YAML)", ["ring", str(path)]))
        if a.llm:
            for mode in ("symmetric", "explicit"):
                cases += [(f"Llama 3 405B 8K, TP8/PP16/DP128, 16,384 GPUs, {mode}",
                           ["llm-8k", mode]),
                          (f"Llama 3 405B CP16 seq 131,072, 16,384 GPUs, {mode}",
                           ["llm-long", mode])]
        rows = []
        for name, argv in cases:
            roots = [("", ROOT)] + ([("base", Path(a.against))] if a.against else [])
            runs: dict[str, list] = {label: [] for label, _ in roots}
            for _ in range(a.repeats):                 # alternate: drift hits both alike
                for label, root in roots:
                    runs[label].append(run_case(argv, root))
            for label, _ in roots:
                row = _row(f"{name}{' [' + label + ']' if label else ''}", runs[label])
                rows.append(row)
                if not a.json:
                    _print(row)
            if a.against:
                new, old = rows[-2], rows[-1]
                agree = abs(new["simulated_s"] / old["simulated_s"] - 1) <= 1e-3
                ratio = {"case": name, "speedup": old["wall_s"] / new["wall_s"],
                         "memory_ratio": new["peak_rss_mb"] / old["peak_rss_mb"],
                         "answers_agree_0.1%": agree}
                rows.append(ratio)
                if not a.json:
                    print(f"  -> {ratio['speedup']:.2f}x faster, memory x{ratio['memory_ratio']:.2f}, "
                          f"answers agree to 0.1%: {agree}", flush=True)
    if a.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
