"""Run one CLI fuzz case (``tests/fuzzing.py`` makes them) in a child forked from a clean fork
server: ``run_case(argv)`` returns an :class:`Outcome`, its exit code, a traceback or hang
when it ended other than with a clean exit (0, 1, 2), its wall time and the memory it added.
``planted_*`` are commands that fail on purpose, for the harness's own test.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from planner.cli.main import main

__all__ = ["Outcome", "run_case", "MAX_ADDED_BYTES"]


#: the memory a case may add: the issue's 500 MB per case less the CLI's own import peak
#: (measured ~80 MB)
MAX_ADDED_BYTES = 420 * 2**20


@dataclass
class Outcome:
    """How one case ended: ``error`` is set for a traceback, a hang (past the timeout), an exit
    code other than 0, 1 or 2, or an exit 2 without a message; ``added_bytes`` is the peak
    resident memory it added to the process it ran in."""

    code: int
    error: str | None
    wall_s: float
    added_bytes: int


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _child(argv: list[str], folder: str, command) -> int:
    """Run one case in the child: streams to files, the traceback to ``tb``."""
    os.setpgid(0, 0)                        # a hang is killed with everything it started
    for fd, name in ((1, "out"), (2, "err")):
        f = os.open(os.path.join(folder, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    # pytest's capture replaces the stream objects too: point them back at the descriptors
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False)
    with contextlib.suppress(OSError):      # peak RSS counted from here (Linux ≥ 4.0)
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    start = _rss_bytes("VmRSS")
    try:
        code = (command or main)(argv)
    except SystemExit as e:                 # argparse: usage errors exit 2
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:                   # noqa: BLE001 — this is what we hunt
        with open(os.path.join(folder, "tb"), "w") as fh:
            fh.write(traceback.format_exc())
        code = 70
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with open(os.path.join(folder, "mem"), "w") as fh:
        fh.write(str(max(0, _rss_bytes("VmHWM") - start)))
    return code


_SERVER: list = []


_LAZY_LIBRARIES = ["pandas", "scipy.cluster.vq", "sklearn.ensemble", "scipy.optimize",
                   "scipy.stats", "pulp", "networkx"]


def _context():
    """A fork server started fresh (no torch, no OpenMP threads of the test process, which a
    plain fork would copy half-initialised) with every CLI command imported (none imports
    torch), and the libraries commands import only when a case needs them (k-means for DMT
    towers, pandas, the MIP solver): each case is a fork of it, as quick to start as an
    in-process call. Without them the first case of a kind pays their import from a cold disk
    (12 s once on a fresh CI clone), which is not a hang of ours."""
    if not _SERVER:
        import pkgutil

        import planner.cli
        commands = [f"planner.cli.{m.name}" for m in pkgutil.iter_modules(planner.cli.__path__)
                    if m.name != "__main__"]
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["planner.cli.main", *commands, *_LAZY_LIBRARIES, "fuzz_runner"])
        from multiprocessing import forkserver
        forkserver.ensure_running()            # started here, not inside a case's time
        _SERVER.append(ctx)
    return _SERVER[0]


def _entry(argv: list[str], folder: str, command) -> None:      # pragma: no cover - child
    code = 70
    try:
        code = _child(argv, folder, command)
    finally:
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 70)


def run_case(argv: list[str], *, timeout_s: float = 10.0, command=None,
             confirm: float = 3.0) -> Outcome:
    """Run one case in a child forked from a clean fork server (Linux): a crash, hang or
    memory blow-up of the case cannot take the caller with it, and each case's memory is its
    own. ``command`` (a module-level function, default the CLI's ``main``) runs instead.

    A case still running after ``timeout_s`` (seconds) runs once more with ``confirm`` times
    that limit before it is reported as a hang: on a shared host a busy neighbour can stretch a
    3 s case past 10 s, while a real hang outlasts both."""
    out = _run_once(argv, timeout_s, command)
    if out.error and out.error.startswith("still running") and confirm > 1.0:
        out = _run_once(argv, timeout_s * confirm, command)
    return out


def _run_once(argv: list[str], timeout_s: float, command) -> Outcome:
    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        proc = _context().Process(target=_entry, args=(argv, folder, command))
        proc.start()
        proc.join(timeout_s)
        hung = proc.is_alive()
        if hung:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()
            proc.join()
        wall = time.perf_counter() - t0
        code = proc.exitcode
        with contextlib.suppress(ProcessLookupError, PermissionError):   # what it started
            os.killpg(proc.pid, signal.SIGKILL)
        read = lambda n: (Path(folder) / n).read_text(errors="replace") \
            if (Path(folder) / n).exists() else ""                    # noqa: E731
        added = int(read("mem") or 0)
        err = read("err")
        if hung:
            return Outcome(code, f"still running after {timeout_s:g} s", wall, added)
        if read("tb"):
            return Outcome(-1, read("tb"), wall, added)
        if code not in (0, 1, 2):
            return Outcome(code, f"exit code {code}\n{err[-2000:]}", wall, added)
        if code == 2 and not err.strip():
            return Outcome(code, "exit 2 without a message on stderr", wall, added)
        return Outcome(code, None, wall, added)


# -- cases that must fail, for the harness's own test --------------------------------------
def planted_crash(argv: list[str]) -> int:
    raise ZeroDivisionError("planted")


def planted_hang(argv: list[str]) -> int:
    time.sleep(30)
    return 0


def planted_hog(argv: list[str]) -> int:
    block = bytearray(600 * 2**20)
    block[::4096] = b"x" * len(block[::4096])
    return 0
