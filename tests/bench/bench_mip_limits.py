"""MIP time limits and determinism, whole command as a user runs it (not part of the test run).

Run:  python tests/bench/bench_mip_limits.py [--devices 16 64 256] [--tables 300] [--limit 10]
                                              [--repeats 2] [--seed 0]

Writes a CSV of ``--tables`` synthetic tables (dlrm_datasets-shaped, dims 4..128), then runs
``clusterplan plan tables.csv --devices N --planner mip --time-limit L --json`` ``--repeats``
times per device count, each in a fresh process. Prints the whole command's wall time (process
start to exit) against the issue's bound 1.1·L + 1 s, the MIP's status, gap and timings, and
whether the repeats printed the same bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from planner.model.tables.generate import NEUROSHARD_DIMS, synthesize_tables  # noqa: E402


def write_tables(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = ["name,num_embeddings,embedding_dim,pooling_factor"]
    for t in synthesize_tables(n, seed=seed):
        rows.append(f"{t.name},{t.num_embeddings},{int(rng.choice(NEUROSHARD_DIMS))},"
                    f"{t.pooling_factor}")
    path.write_text("\n".join(rows) + "\n")


def run_once(csv: Path, devices: int, limit: float, seed: int, timings: Path) -> dict:
    argv = [sys.executable, "-m", "planner.cli.main", "plan", str(csv), "--devices", str(devices),
            "--planner", "mip", "--time-limit", f"{limit:g}", "--seed", str(seed), "--json",
            "--timings", str(timings)]
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = {"wall_s": wall, "rc": p.returncode, "sha": hashlib.sha256(p.stdout.encode()).hexdigest()}
    try:
        d = json.loads(p.stdout)
        st = d.get("planner_stats", {})
        out |= {"status": st.get("status"), "gap": st.get("gap"), "notes": st.get("notes", []),
                "stdout": p.stdout,
                "timings": json.loads(timings.read_text()) if timings.exists() else {}}
    except json.JSONDecodeError:
        out["error"] = p.stderr.strip().splitlines()[-1:] if p.stderr else ["(no output)"]
    return out


def _first_difference(a: str, b: str) -> None:
    for i, (x, y) in enumerate(zip(a.splitlines(), b.splitlines())):
        if x != y:
            print(f"      first differing line {i + 1}: {x.strip()[:90]!r} vs {y.strip()[:90]!r}")
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[16, 64, 256])
    ap.add_argument("--tables", type=int, default=300)
    ap.add_argument("--limit", type=float, default=10.0, help="--time-limit, seconds")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory() as d:
        csv = Path(d) / "tables.csv"
        write_tables(csv, a.tables, a.seed)
        bound = 1.1 * a.limit + 1.0
        print(f"{a.tables} tables, --time-limit {a.limit:g} s: bound {bound:.2f} s whole command")
        for n in a.devices:
            runs = [run_once(csv, n, a.limit, a.seed, Path(d) / f"t{n}-{i}.json")
                    for i in range(a.repeats)]
            walls = [r["wall_s"] for r in runs]
            same = len({r["sha"] for r in runs}) == 1
            worst = max(walls)
            ok = worst <= bound and same and all(r["rc"] == 0 for r in runs)
            bad += not ok
            print(f"  {n:4d} devices: wall median {statistics.median(walls):6.2f} s, max "
                  f"{worst:6.2f} s ({worst / a.limit:4.2f}x limit)  rc {[r['rc'] for r in runs]}"
                  f"  status {[r.get('status') for r in runs]}  same bytes: {same}"
                  f"  {'ok' if ok else 'FAIL'}")
            for r in runs:
                if "error" in r:
                    print(f"      error: {r['error']}")
                else:
                    t = r["timings"]
                    st = t.get("planner_stats.timings_s", {})
                    print("      gap " + (f"{r['gap']:.4f}" if r["gap"] is not None else "-")
                          + f"  call {t.get('planner_stats.wall_s', 0):.2f} s: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in st.items()))
                    for note in r["notes"]:
                        print(f"        {note}")
            if not same:
                _first_difference(runs[0]["stdout"], runs[1]["stdout"])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
