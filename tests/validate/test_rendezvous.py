"""Real runs meet through a file store: no port picked and released, nothing listening beyond
the loopback interface, and no store file left behind."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import planner.measure.network.spawn as spawn  # noqa: E402
from planner.measure.runner import rendezvous  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

RANK = r"""
import json, os, sys
import torch, torch.distributed as dist
from planner.measure.runner import init_group
rank, rdzv, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
init_group("gloo", rank, 2, rdzv, 60.0)
t = torch.ones(3) * (rank + 1)
dist.all_reduce(t)
inodes = set()
for fd in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:["):
        inodes.add(link[8:-1])
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:          # LISTEN, one of this process's sockets
            listening.append(f[1].split(":")[0])
dist.barrier()
json.dump({"sum": t.tolist(), "listening": listening}, open(out, "w"))
dist.destroy_process_group()
import gc
gc.collect()          # the store's refcount drops when its last Python holder goes, not at exit
"""

LOOPBACK = {"0100007F", "00000000000000000000000001000000"}     # 127.0.0.1, ::1


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_ranks_listen_on_loopback_only(tmp_path):
    rdzv = rendezvous()
    assert rendezvous() != rdzv and not Path(rdzv).exists()
    outs = [tmp_path / f"r{r}.json" for r in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), rdzv, str(outs[r])], cwd=ROOT)
             for r in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    for out in outs:
        doc = json.loads(out.read_text())
        assert doc["sum"] == [3.0, 3.0, 3.0]
        assert doc["listening"] and set(doc["listening"]) <= LOOPBACK, doc["listening"]


def _exit_holding_store(rank: int, world: int) -> None:
    import torch.distributed as dist
    dist.barrier()          # both ranks connected: neither leaves the other mid-handshake
    os._exit(0)             # no destructor runs: torch's store never removes its file


def test_a_run_removes_the_store_its_ranks_left(monkeypatch):
    made = []

    def recorded() -> str:
        made.append(rendezvous())
        return made[-1]

    monkeypatch.setattr(spawn, "rendezvous", recorded)
    with pytest.raises(spawn.ProbeFailed, match="without a result|exited"):
        spawn.run_distributed(_exit_holding_store, 2, timeout_s=60.0)
    assert len(made) == 1 and not Path(made[0]).exists()
