"""Fuzz benchmark: ≥ 1,000 seeded CLI cases (arguments and mutated spec files).

    python tests/bench/bench_fuzz.py [--cases 1000] [--seed 0] [--timeout 60]

Prints the number of cases, how they exited, and every traceback or hang found (target: 0).
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

from fuzzing import make_case, run_case  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per case")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    codes: collections.Counter = collections.Counter()
    failures: list[tuple[list[str], str]] = []
    t0 = time.perf_counter()
    for _ in range(a.cases):
        with tempfile.TemporaryDirectory() as d:
            argv = make_case(rng.choice, Path(d))
            code, err = run_case(argv, timeout_s=a.timeout)
        codes[code] += 1
        if err:
            failures.append((argv, err))
    wall = time.perf_counter() - t0
    print(f"fuzz: {a.cases} cases (seed {a.seed}) in {wall:.1f} s; exits "
          + ", ".join(f"{k}: {v}" for k, v in sorted(codes.items())))
    print(f"tracebacks or hangs: {len(failures)}")
    for argv, err in failures[:20]:
        print("  clusterplan " + " ".join(argv))
        print("    " + err.strip().splitlines()[-1][:200])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
