"""CBC as a child process on an MPS file: node and time limits, a watchdog, no orphans.

PuLP's own CBC call cannot be interrupted, so the model is written as MPS (with the warm start
as a MIP start) into a temporary folder and PuLP's bundled CBC binary is run on it directly:

- ``-maxNodes`` is the deterministic stop (CBC serial, as it runs without ``-threads``, and
  seeded explores the same tree on any machine); ``-sec`` with ``-timeMode elapsed`` is the safety stop, and a watchdog
  kills CBC at ``hard_deadline`` (CBC checks its clock only between cut passes);
- on Linux CBC gets ``PR_SET_PDEATHSIG``: when the planner's process dies, even by SIGKILL,
  the kernel kills CBC; the folder is removed on every exit Python sees (return, exception,
  Ctrl-C, the CLI's SIGTERM).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from simulator.errors import SpecError

from planner.lp import cbc

__all__ = ["run_cbc", "parse_cbc_log", "TEMP_PREFIX"]

#: prefix of the temporary folders (a test looks for leftovers by it)
TEMP_PREFIX = "clusterplan-mip-"
_NUM = r"([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)"
_PR_SET_PDEATHSIG = 1


def parse_cbc_log(text: str) -> dict:
    """``result`` (CBC's "Result - …" line), ``objective``, ``bound`` and ``nodes``."""
    info: dict = {}
    m = re.search(r"Result - (.+)", text)
    info["result"] = m.group(1).strip() if m else ""
    m = re.search(r"Objective value:\s+" + _NUM, text)
    if m:
        info["objective"] = float(m.group(1))
    m = re.search(r"Lower bound:\s+" + _NUM, text)
    if m:
        info["bound"] = float(m.group(1))
    possible = re.findall(r"best possible " + _NUM, text)
    if possible:
        info["best_possible"] = float(possible[-1])
    m = re.search(r"Enumerated nodes:\s+(\d+)", text)
    if m:
        info["nodes"] = int(m.group(1))
    return info


def _die_with_parent() -> None:          # pragma: no cover - runs in the child before exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass


def run_cbc(lp, *, start: bool, seconds: float, max_nodes: int, hard_deadline: float,
            seed: int) -> tuple[dict | None, dict]:
    """Solve PuLP problem ``lp`` with CBC; ``(values by variable name or None, log info)``.

    ``start``: the variables' initial values are a MIP start. ``info["killed"]`` says the
    watchdog stopped CBC at ``hard_deadline`` (``time.perf_counter()`` seconds).
    """
    solver = cbc()
    path = solver.path
    if not path or not solver.available():
        raise SpecError("no CBC solver found (PuLP's bundled CBC or cbc on PATH)",
                        source="--planner mip", fix="pip install 'pulp[cbc]' or install coinor-cbc")
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
        mps, sol, mst, logf = (os.path.join(tmp, f) for f in
                               ("model.mps", "model.sol", "start.mst", "cbc.log"))
        vs, vnames, cnames, _ = lp.writeMPS(mps, rename=1)
        args = [path, mps]
        if start:          # primal heuristics off: the start is the incumbent to beat, and
            solver.writesol(mst, lp, vs, vnames, cnames)     # they make the root's time erratic
            args += ["-mips", mst]
        args += ["-sec", f"{max(seconds, 0.05):.3f}", "-timeMode", "elapsed",
                 "-randomCbcSeed", str(int(seed) % 2_000_000_000 + 1), "-ratio", "1e-7",
                 "-allow", "1e-9", "-maxNodes", str(max(0, int(max_nodes))),
                 "-solve", "-solution", sol]
        killed = _run(args, logf, hard_deadline)
        with open(logf) as f:
            info = parse_cbc_log(f.read())
        info["killed"] = killed
        if killed or not os.path.exists(sol):
            return None, info
        _, values, *_ = solver.readsol_MPS(sol, lp, vs, vnames, cnames)
        with open(sol) as f:
            header = f.readline().strip().lower()
        if "infeasible" in header or "no feasible" in info["result"].lower():
            return None, info
        return values, info


def _run(args: list[str], logf: str, hard_deadline: float) -> bool:
    """Run CBC to its end or ``hard_deadline``; True when the watchdog killed it."""
    linux = sys.platform.startswith("linux")
    with open(logf, "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent if linux else None)
        try:
            proc.wait(timeout=max(0.05, hard_deadline - time.perf_counter()))
            return False
        except subprocess.TimeoutExpired:
            return True
        finally:
            if proc.poll() is None:          # the watchdog, or an exception (Ctrl-C, SIGTERM)
                proc.kill()
                proc.wait()
