"""Start, wait for and end the processes of a real run: the one place where the measurement
layer picks a rendezvous, joins a process group, starts ranks and makes sure none outlives its run.

A rank is either a spawned ``multiprocessing`` process (:func:`start_processes`, the ``spawn``
start method that ``torch.multiprocessing.spawn`` uses: no inherited threads or CUDA state, and
the parent need not import torch) or a ``python`` subprocess (:class:`PythonRanks`, which a
calling script may start without an ``if __name__ == "__main__":`` guard). Each rank joins its
group with :func:`init_group`, whose timeout bounds every collective, so a rank whose peer died
fails instead of waiting torch's default 30 minutes. :func:`end_processes` ends what is left
(SIGTERM, a grace period, SIGKILL), by the handles of the processes the run started.

This module imports no torch: only :func:`init_group`, called in a rank, does.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

__all__ = ["SPAWN", "rendezvous", "release", "init_group", "start_processes", "PythonRanks",
           "wait", "running", "failed", "end_processes"]

SPAWN = multiprocessing.get_context("spawn")
"""The context of every spawned rank and of the queues it shares with the parent."""

ROOT = Path(__file__).resolve().parents[2]
"""The repository root: a :class:`PythonRanks` subprocess runs there, with it on its path."""


def rendezvous() -> str:
    """A fresh rendezvous for one run's process group: the path of a file store in a private
    folder of the temporary directory. Nothing listens on a port for it (a TCP store listens on
    every interface), no port is picked and released (a race), and runs side by side never
    join each other's group. The store removes its file when the last rank leaves; the parent
    calls :func:`release` once its ranks are gone, for the ranks that did not."""
    folder = Path(tempfile.gettempdir()) / f"clusterplan-rendezvous-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return str(folder / uuid.uuid4().hex)


def release(rdzv: str) -> None:
    """Remove the file store at ``rdzv`` if it is still there. Call it after every rank of the
    run has exited: a rank killed, or one whose interpreter ended while something still held
    its store, leaves the file behind (torch removes it only when the last holder is freed)."""
    Path(rdzv).unlink(missing_ok=True)


def init_group(backend: str, rank: int, world: int, rdzv: str, timeout_s: float) -> None:
    """Join the default process group of ``world`` ranks, in a rank, through the file store at
    ``rdzv`` (:func:`rendezvous`); gloo's own connections on the loopback interface;
    ``timeout_s`` seconds bound the join and every collective after it."""
    import torch.distributed as dist
    if backend == "gloo" and Path("/sys/class/net/lo").exists():
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"file://{rdzv}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))


def start_processes(target: Callable, args: Sequence[tuple], *, name: str | None = None
                    ) -> list:
    """Start one spawned daemon process ``target(*args[r])`` per rank ``r`` (``name``: a format
    with ``{rank}``); multiprocessing ends daemons still running when the parent exits. If one
    fails to start, those started are ended before the error is raised."""
    procs: list = []
    try:
        for r, a in enumerate(args):
            procs.append(SPAWN.Process(target=target, args=a, daemon=True,
                                       name=name.format(rank=r) if name else None))
            procs[-1].start()
    except BaseException:
        end_processes(procs)
        raise
    return procs


class PythonRanks:
    """One ``python ARGV`` subprocess per rank; ``ARGV`` is a script path or ``-m MODULE``, then
    its arguments. They run in the repository root with it on ``PYTHONPATH`` and with
    ``OMP_NUM_THREADS=1`` (a rank is timed on one thread). Each one's stderr goes to a temporary
    file, so a full pipe never blocks a rank and a failure can quote its last line
    (:meth:`tails`). ``pipes``: stdin and stdout are text pipes (a line protocol); otherwise
    stdin is inherited and stdout discarded. :meth:`close` ends them all.
    """

    def __init__(self, argvs: Sequence[Sequence[object]], *, pipes: bool = False) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), env.get("PYTHONPATH"))))
        self.procs: list[subprocess.Popen] = []
        self.logs: list = []
        try:
            for argv in argvs:
                self.logs.append(tempfile.TemporaryFile(mode="w+", errors="replace"))
                self.procs.append(subprocess.Popen(
                    [sys.executable, *map(str, argv)], env=env, cwd=ROOT, text=True,
                    stdin=subprocess.PIPE if pipes else None,
                    stdout=subprocess.PIPE if pipes else subprocess.DEVNULL,
                    stderr=self.logs[-1]))
        except BaseException:
            self.close()
            raise

    def tails(self) -> list[str]:
        """Per rank, the last line it wrote to stderr ("" if none)."""
        out = []
        for log in self.logs:
            log.seek(0)
            out.append((log.read().strip().splitlines() or [""])[-1])
        return out

    def close(self) -> None:
        """End every rank still running (:func:`end_processes`) and drop the stderr files."""
        end_processes(self.procs)
        for log in self.logs:
            log.close()


def wait(procs: Sequence, timeout_s: float) -> list[int]:
    """Wait up to ``timeout_s`` seconds in all for ``procs`` (spawned processes or subprocesses)
    to exit; return the ranks (indices) still running."""
    deadline = time.monotonic() + timeout_s
    for p in procs:
        _join(p, max(0.0, deadline - time.monotonic()))
    return running(procs)


def running(procs: Sequence) -> list[int]:
    """The ranks (indices) of ``procs`` started and not yet exited."""
    return [r for r, p in enumerate(procs) if _exit_code(p) is None and p.pid is not None]


def failed(procs: Sequence) -> dict[int, int | None]:
    """Rank -> exit code of every started process that has not exited with 0 (None: running;
    negative: the signal that ended it)."""
    return {r: _exit_code(p) for r, p in enumerate(procs)
            if p.pid is not None and _exit_code(p) != 0}


def end_processes(procs: Sequence, *, grace_s: float = 3.0) -> None:
    """End every process of ``procs`` still running: SIGTERM, up to ``grace_s`` seconds in all
    to exit, then SIGKILL and up to 5 s each to be reaped, so none outlives its run."""
    live = [procs[r] for r in running(procs)]
    for p in live:
        p.terminate()
    wait(live, grace_s)
    for p in live:
        if _exit_code(p) is None:
            p.kill()
            _join(p, 5.0)


def _exit_code(p) -> int | None:
    return p.poll() if isinstance(p, subprocess.Popen) else p.exitcode


def _join(p, timeout_s: float) -> None:
    if isinstance(p, subprocess.Popen):
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout_s)
    elif p.pid is not None:
        p.join(timeout_s)
