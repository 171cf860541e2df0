"""Real runs listen on loopback only: gloo ranks rendezvous through a file and bind ``lo``; a
local Ray's GCS, raylet and workers bind loopback. Sampled from /proc while each run goes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from listeners import Listener, ListenerWatch

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner.cli.main", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_the_watch_sees_a_wildcard_listener():
    """A socket bound to every interface is reported (so an empty report means something)."""
    import socket
    with ListenerWatch(period_s=0.01) as w:
        s = socket.socket()
        s.bind(("0.0.0.0", 0))
        s.listen()
        import time
        time.sleep(0.1)
        s.close()
    assert [x.address for x in w.exposed()] == ["0.0.0.0"]
    assert Listener("::ffff:127.0.0.1", 1, "").loopback and not Listener("::", 1, "").loopback


def test_probe_and_validate_listen_on_loopback_only(tmp_path):
    with ListenerWatch() as w:
        probe = _cli("probe", "--backend", "gloo", "--nproc", "2", "--repeats", "1",
                     "--large", "64KiB", "--out", str(tmp_path / "m.json"))
        run = _cli("validate", "llama3-8b", "--parallel", "tp=2", "--nproc", "2", "--steps", "1",
                   "--warmup", "0", "--layers", "2", "--hidden", "64", "--heads", "4",
                   "--kv-heads", "4", "--ffn", "128", "--vocab", "256", "--seq", "32",
                   "--micro-batch", "1", "--microbatches", "1", "--no-trace")
    assert probe.returncode == 0, probe.stderr
    assert run.returncode in (0, 1), run.stderr        # 1: a step-time disagreement, still ran
    assert w.seen, "gloo's own loopback listeners were not seen: the watch is blind"
    assert w.exposed() == []


def test_a_local_ray_sweep_listens_on_loopback_only(tmp_path):
    pytest.importorskip("ray")
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"command": ["collective", "allreduce"],
                                    "args": {"--topology": "dgx-a100"},
                                    "grid": {"--size": ["1MiB", "1GiB"], "--ranks": [2, 8]},
                                    "keep": ["time_s"]}))
    with ListenerWatch() as w:
        run = _cli("sweep", str(grid), "--ray", "local", "--workers", "2",
                   "--out", str(tmp_path / "r.csv"))
    assert run.returncode == 0, run.stderr
    assert any("gcs_server" in x.command for x in w.seen), sorted(w.seen)
    assert w.exposed() == [], w.exposed()
