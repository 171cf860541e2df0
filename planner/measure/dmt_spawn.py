"""Run a function in spawned gloo processes, bounded in time, and collect each rank's arrays
(used by the DMT semantic check and the TorchRec DMT run)."""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path

import numpy as np

__all__ = ["spawn_gloo"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_gloo(target, world: int, payload, *, timeout_s: float) -> list[dict]:
    """Run ``target(rank, payload, port, outdir, init_timeout_s)`` in ``world`` spawned
    processes; each writes ``outdir/rank{r}.npz`` (or ``.err``). Returns the arrays per rank.

    Raises ``RuntimeError`` naming the failed ranks, or ``TimeoutError`` after ``timeout_s``
    (the processes still running are terminated, then killed, by their own handles).
    """
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [ctx.Process(target=target, args=(r, payload, port, tmp, timeout_s / 2),
                             daemon=True) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in alive:
            procs[r].terminate()
        for r in alive:
            procs[r].join(5)
            if procs[r].is_alive():
                procs[r].kill()
        if alive:
            raise TimeoutError(f"ranks {alive} still running after {timeout_s:.0f} s")
        errs = {r: (Path(tmp) / f"rank{r}.err").read_text()
                for r in range(world) if (Path(tmp) / f"rank{r}.err").exists()}
        bad = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if errs or bad:
            codes = {r: procs[r].exitcode for r in bad}
            raise RuntimeError(f"ranks {sorted(set(bad) | set(errs))} failed: {errs or codes}")
        out = []
        for r in range(world):
            with np.load(Path(tmp) / f"rank{r}.npz") as z:
                out.append({k: z[k] for k in z.files})
    return out
