"""Run a function in spawned gloo processes, bounded in time, and collect each rank's arrays
(used by the DMT semantic check and the TorchRec DMT run)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from planner.measure.runner import (end_processes, failed, release, rendezvous, start_processes,
                                    wait)

__all__ = ["spawn_gloo"]


def spawn_gloo(target, world: int, payload, *, timeout_s: float) -> list[dict]:
    """Run ``target(rank, payload, rdzv, outdir, init_timeout_s)`` in ``world`` spawned
    processes; each writes ``outdir/rank{r}.npz`` (or ``.err``). Returns the arrays per rank.

    Raises ``RuntimeError`` naming the failed ranks, or ``TimeoutError`` after ``timeout_s``
    (the processes still running are terminated, then killed, by their own handles).
    """
    rdzv = rendezvous()
    with tempfile.TemporaryDirectory() as tmp:
        procs = start_processes(target, [(r, payload, rdzv, tmp, timeout_s / 2)
                                         for r in range(world)])
        alive = wait(procs, timeout_s)
        end_processes(procs)
        release(rdzv)
        if alive:
            raise TimeoutError(f"ranks {alive} still running after {timeout_s:.0f} s")
        errs = {r: (Path(tmp) / f"rank{r}.err").read_text()
                for r in range(world) if (Path(tmp) / f"rank{r}.err").exists()}
        codes = failed(procs)
        if errs or codes:
            raise RuntimeError(f"ranks {sorted(set(codes) | set(errs))} failed: {errs or codes}")
        out = []
        for r in range(world):
            with np.load(Path(tmp) / f"rank{r}.npz") as z:
                out.append({k: z[k] for k in z.files})
    return out
