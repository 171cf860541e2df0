"""Fuzz benchmark: seeded CLI cases (tests/fuzzing.py), each in a forked child.

    python tests/bench/bench_fuzz.py [--cases 1000] [--seed 0] [--timeout 10]

Prints the number of cases, how they exited, the slowest case and the most memory one added,
and every traceback, hang or case past 420 MB found (target: 0). The test run does 1,000
cases drawn by hypothesis (tests/test_fuzz.py); this draws with ``random.Random(seed)``, so
other seeds reach other cases.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fuzz_runner import MAX_ADDED_BYTES, run_case  # noqa: E402
from fuzzing import make_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    codes: collections.Counter = collections.Counter()
    failures: list[tuple[list[str], str]] = []
    walls, added = [], []
    t0 = time.perf_counter()
    for _ in range(a.cases):
        with tempfile.TemporaryDirectory() as d:
            argv = make_case(rng.choice, Path(d))
            out = run_case(argv, timeout_s=a.timeout)
        codes[out.code] += 1
        walls.append((out.wall_s, argv))
        added.append((out.added_bytes, argv))
        if out.error or out.added_bytes > MAX_ADDED_BYTES:
            failures.append((argv, out.error or f"added {out.added_bytes / 2**20:.0f} MB"))
    wall = time.perf_counter() - t0
    print(f"fuzz: {a.cases} cases (seed {a.seed}) in {wall:.1f} s; exits "
          + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    slow, heavy = max(walls), max(added)
    print(f"slowest case {slow[0]:.2f} s: clusterplan {' '.join(slow[1])[:150]}")
    print(f"most memory added {heavy[0] / 2**20:.0f} MB: clusterplan {' '.join(heavy[1])[:150]}")
    print(f"tracebacks, hangs or memory bombs: {len(failures)}")
    for argv, err in failures[:20]:
        print("  clusterplan " + " ".join(argv))
        print("    " + err.strip().splitlines()[-1][:200])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
