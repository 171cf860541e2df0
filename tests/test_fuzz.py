"""Fuzz: whatever the arguments or spec files, the CLI exits 0, 1 or 2 with a message; never a
traceback, never a hang. Cases in tests/fuzzing.py; tests/bench/bench_fuzz.py runs ≥ 1,000."""

import tempfile
from pathlib import Path

from fuzzing import make_case, run_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_cli_never_crashes(data):
    def choice(seq):
        return data.draw(st.sampled_from(list(seq)))
    with tempfile.TemporaryDirectory() as d:
        argv = make_case(choice, Path(d))
        code, error = run_case(argv, timeout_s=60)
    assert error is None, f"clusterplan {' '.join(argv)}\n{error}"


def test_the_fuzzer_catches_a_crash(monkeypatch):
    """The harness reports an uncaught exception (so a green fuzz run means something)."""
    import fuzzing

    def boom(argv):
        raise ZeroDivisionError("planted")
    monkeypatch.setattr(fuzzing, "main", boom)
    code, error = fuzzing.run_case(["gpus"])
    assert code == -1 and "ZeroDivisionError" in error
