"""``clusterplan calibrate gloo`` (issue 10): a real 2-process measurement writes a profile the
simulator loads, with separate reduce-scatter and all-gather tables and the noise beside the
numbers; bad arguments exit 2 before any process starts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from planner.validate.calibrate import GlooCalibration, measure_gloo
from simulator.gloo_profile import gloo_profile_from_dict


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "planner.cli", "calibrate", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args,field", [(("gloo", "--nproc", "1"), "--nproc"),
                                        (("gloo", "--rounds", "0"), "--rounds"),
                                        ((), "WHAT"),
                                        (("--backend", "nccl"), "--backend")])
def test_bad_arguments_exit_2(args, field):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    assert field in p.stderr and "Traceback" not in p.stderr


def test_quick_real_calibration_loads_and_is_plausible():
    cfg = GlooCalibration(rounds=1, repeats=3, quick=True, sizes=(4, 4096, 262144, 1048576))
    doc = measure_gloo(cfg)
    prof = gloo_profile_from_dict(doc, source="quick")
    for kind in ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv"):
        table = prof.comm[(kind, 2)]
        assert len(table.sizes) == 4
        # loopback gloo: tens of µs to tens of ms per call, never faster for more bytes
        assert all(1e-6 < t < 1.0 for t in table.seconds)
        assert list(table.seconds) == sorted(table.seconds)
    assert prof.comm[("reducescatter", 2)] != prof.comm[("allgather", 2)]
    gf = prof.compute.gpu.peak_flops["fp32"]
    assert 1e9 < gf < 1e12                                     # one core's fp32 matmul
    assert 0 < prof.host_block_s["forward"] < 0.1
    assert doc["noise"]["comm"]["allreduce"]["median"] >= 0
    assert doc["measured"]["processes"] == 2 and "other_cores" in doc["measured"]
    assert [g for g, _ in prof.wake_penalty_s] == sorted(g for g, _ in prof.wake_penalty_s)
