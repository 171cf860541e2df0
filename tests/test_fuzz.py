"""Fuzz: whatever the arguments or input files (every spec kind, whole-file faults, resource
bombs, numeric extremes, outputs pointed at folders), the CLI exits 0, 1 (a valid run whose
plan breaks a memory cap) or 2 (bad input, with a message), within 10 s and adding under
420 MB to the ~80 MB its imports take: never a traceback, a hang or a memory blow-up. Cases in
tests/fuzzing.py, each run in a forked child (tests/fuzz_runner.py); tests/bench/bench_fuzz.py
runs more."""

import sys
import tempfile
from pathlib import Path

import pytest
from fuzz_runner import MAX_ADDED_BYTES, run_case
from fuzzing import make_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks, reads /proc")

CODES: dict[int, int] = {}


@settings(max_examples=1000, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_cli_never_crashes(data):
    def choice(seq):
        return data.draw(st.sampled_from(list(seq)))
    with tempfile.TemporaryDirectory() as d:
        argv = make_case(choice, Path(d))
        out = run_case(argv, timeout_s=10.0)
    CODES[out.code] = CODES.get(out.code, 0) + 1
    assert out.error is None, f"clusterplan {' '.join(argv)}\n{out.error}"
    assert out.added_bytes <= MAX_ADDED_BYTES, \
        f"clusterplan {' '.join(argv)} added {out.added_bytes / 2**20:.0f} MB"


def test_the_fuzzer_catches_a_crash_a_hang_and_a_bomb():
    """The harness reports each failure it hunts (so a green fuzz run means something)."""
    import time

    import fuzz_runner
    out = fuzz_runner.run_case(["gpus"], command=fuzz_runner.planted_crash)
    assert out.code == -1 and "ZeroDivisionError" in out.error
    t0 = time.perf_counter()
    out = fuzz_runner.run_case(["gpus"], timeout_s=0.5, command=fuzz_runner.planted_hang)
    assert "still running after 1.5 s" in out.error and time.perf_counter() - t0 < 6
    out = fuzz_runner.run_case(["gpus"], command=fuzz_runner.planted_hog)
    assert out.error is None and out.added_bytes > MAX_ADDED_BYTES
