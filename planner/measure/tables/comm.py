"""Collectives timed for real with ``torch.distributed`` (gloo) across N spawned processes.

:class:`GlooGroup` starts ``world`` processes once (each ``torch.set_num_threads(1)``, one gloo
process group over loopback TCP) and then runs any number of *jobs*: a job is a list of
collectives with exact sizes, run ``warmup + repeats`` times in interleaved rounds (a barrier
before each collective, each rank timing its own call), and it returns every rank's median per
collective. Starting the processes costs seconds (each imports torch), so a benchmark keeps one
group per world size.

Collective specs (bytes; fp32 payloads, ids sent as their byte count):

- ``("a2a", name, matrix)``: ``all_to_all_single`` where rank i sends ``matrix[i][j]`` bytes to
  rank j (uneven splits, zeros allowed);
- ``("allreduce" | "reducescatter" | "allgather", name, bytes)``: the full buffer size (the
  reduce-scatter input, the all-gather output).

A rank's time for a collective in one round is measured from the moment the *last* rank entered
it (:func:`align`; every rank stamps start and end on the system-wide monotonic clock), so a
rank that the scheduler let through the barrier early is not charged for waiting on one that
was not yet running — on real hardware, with a core per rank, they would enter together.

On a machine with fewer free cores than processes the processes share the cores, so these times
include scheduling; :func:`oversubscription` says by how much, and the measurement reports it.
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import sys
import threading
import time
from typing import Any, Sequence

from simulator.errors import SpecError

from planner.machine import require_torch
from planner.measure.heap import DEFAULT_HEAP, apply_heap_policy
from planner.measure.runner import PythonRanks, init_group, release, rendezvous, running, wait

__all__ = ["GlooGroup", "oversubscription"]


def oversubscription(world: int) -> float:
    """Processes per core when ``world`` processes run on this machine (≥ 1 means shared)."""
    return world / max(1, os.cpu_count() or 1)


def _worker(rank: int, world: int, rdzv: str, timeout_s: float, heap: str = DEFAULT_HEAP
            ) -> None:
    """Worker main: one JSON job per stdin line, one JSON result per stdout line; ``heap`` is
    the process's C heap policy (:mod:`planner.measure.heap`)."""
    apply_heap_policy(heap)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    out = sys.stdout
    sys.stdout = sys.stderr            # keep stray prints off the result channel

    def send(status, payload):
        out.write(json.dumps({"rank": rank, "status": status, "payload": payload}) + "\n")
        out.flush()

    try:
        init_group("gloo", rank, world, rdzv, timeout_s)
        send("ready", None)
    except Exception as exc:  # pragma: no cover - reported to the parent
        send("error", f"{type(exc).__name__}: {exc}")
        return
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        if job is None:
            break
        try:
            send("ok", _run_job(rank, world, job, torch, dist))
        except Exception as exc:  # pragma: no cover - reported to the parent
            send("error", f"{type(exc).__name__}: {exc}")
    try:
        dist.destroy_process_group()
    except Exception:  # pragma: no cover
        pass


def _elems(nbytes: float) -> int:
    return int(max(0, round(float(nbytes) / 4.0)))


def _run_job(rank: int, world: int, job: dict, torch, dist) -> dict:
    ops = []
    for spec in job["ops"]:
        kind, name, arg = spec
        if kind == "a2a":
            send = [_elems(arg[rank][j]) for j in range(world)]
            recv = [_elems(arg[i][rank]) for i in range(world)]
            inp = torch.ones(sum(send))
            out = torch.empty(sum(recv))

            def call(inp=inp, out=out, send=send, recv=recv):
                dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
        elif kind == "allreduce":
            buf = torch.ones(max(1, _elems(arg)))

            def call(buf=buf):
                dist.all_reduce(buf)
        elif kind in ("reducescatter", "allgather"):
            per = max(1, -(-_elems(arg) // world))
            big = torch.ones(per * world)
            small = torch.ones(per)
            if kind == "reducescatter":
                def call(big=big, small=small):
                    dist.reduce_scatter_tensor(small, big)
            else:
                def call(big=big, small=small):
                    dist.all_gather_into_tensor(big, small)
        else:
            raise ValueError(f"unknown collective {kind!r}")
        ops.append((name, call))
    warmup, repeats = int(job["warmup"]), int(job["repeats"])
    starts: dict[str, list[float]] = {name: [] for name, _ in ops}
    ends: dict[str, list[float]] = {name: [] for name, _ in ops}
    for it in range(warmup + repeats):
        for name, call in ops:
            dist.barrier()
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            call()
            t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
            if it >= warmup:
                starts[name].append(t0)
                ends[name].append(t1)
    return {name: {"start_s": starts[name], "end_s": ends[name]} for name in starts}


def align(raw: list[dict]) -> list[dict]:
    """Per-rank collective times from every rank's (start, end) stamps (one system-wide
    monotonic clock): a rank's time in one round is its end minus the *latest* start of that
    round, so the time a rank spent waiting for another to be scheduled into the collective
    (after the barrier, on oversubscribed cores) is not counted as communication; the median
    over rounds is ``median_s``. ``raw_median_s`` is the plain median of end − own start.
    """
    world = len(raw)
    out = [dict() for _ in range(world)]
    for name in raw[0]:
        starts = [raw[r][name]["start_s"] for r in range(world)]
        ends = [raw[r][name]["end_s"] for r in range(world)]
        rounds = len(starts[0])
        last = [max(starts[r][i] for r in range(world)) for i in range(rounds)]
        for r in range(world):
            aligned = [max(0.0, ends[r][i] - last[i]) for i in range(rounds)]
            own = [ends[r][i] - starts[r][i] for i in range(rounds)]
            out[r][name] = {"median_s": statistics.median(aligned) if aligned else 0.0,
                            "raw_median_s": statistics.median(own) if own else 0.0,
                            "samples_s": aligned}
    return out


class GlooGroup:
    """``world`` gloo processes kept alive to time collectives (see the module docstring).

    The workers are ``python comm.py RANK WORLD PORT TIMEOUT HEAP`` subprocesses
    (:class:`planner.measure.runner.PythonRanks`: a calling script needs no
    ``if __name__ == "__main__"`` guard); jobs and results travel as JSON lines over their
    stdin/stdout. ``heap``: the workers' C heap policy (:mod:`planner.measure.heap`; ``retain``
    by default, as the validation ranks: buffers above glibc's mmap threshold are not
    page-faulted in anew every round). Use as a context manager; :meth:`run` returns, per rank,
    ``{name: {"median_s", "samples_s"}}``.
    """

    def __init__(self, world: int, *, timeout_s: float = 300.0, start_timeout_s: float = 180.0,
                 heap: str = DEFAULT_HEAP) -> None:
        if world < 1:
            raise SpecError(f"world size must be ≥ 1, got {world}", source="--devices",
                            fix="pass the number of devices")
        require_torch("timing collectives")
        self.world = world
        self.timeout_s = timeout_s
        self._closed = False
        self._out: queue.Queue = queue.Queue()
        self._rdzv = None
        if world == 1:                   # one rank communicates with no one: no process
            self._ranks = PythonRanks([])
            return
        rdzv = self._rdzv = rendezvous()
        self._ranks = PythonRanks([(__file__, r, world, rdzv, timeout_s, heap)
                                   for r in range(world)], pipes=True)
        for p in self._ranks.procs:
            threading.Thread(target=self._reader, args=(p,), daemon=True).start()
        self._collect("ready", start_timeout_s)

    def _reader(self, proc) -> None:
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            self._out.put((msg["rank"], msg["status"], msg["payload"]))
        self._out.put((None, "eof", None))

    def _stderr_tail(self) -> str:
        """The last stderr line of the first three ranks that wrote one."""
        tails = [f"rank {r}: {t}" for r, t in enumerate(self._ranks.tails()) if t]
        return "; ".join(tails[:3])

    def _collect(self, expect: str, timeout_s: float) -> list:
        got: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        while len(got) < self.world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(self.world)) - set(got))
                tail = self._stderr_tail()
                self.close()
                raise RuntimeError(f"gloo group of {self.world}: no answer from ranks {missing} "
                                   f"in {timeout_s:.0f} s" + (f" ({tail})" if tail else ""))
            try:
                rank, status, payload = self._out.get(timeout=min(left, 2.0))
            except queue.Empty:
                if len(running(self._ranks.procs)) < self.world:
                    tail = self._stderr_tail()
                    self.close()
                    raise RuntimeError(f"gloo group of {self.world}: a worker exited"
                                       + (f" ({tail})" if tail else "")) from None
                continue
            if status == "eof":
                continue
            if status == "error":
                self.close()
                raise RuntimeError(f"gloo rank {rank}: {payload}")
            got[rank] = payload
        return [got[r] for r in range(self.world)]

    def run(self, ops: Sequence[tuple], *, repeats: int = 7, warmup: int = 2) -> list[dict]:
        """Time ``ops`` on every rank; per rank ``{name: {"median_s", "raw_median_s",
        "samples_s"}}`` (seconds, see :func:`align`)."""
        if self._closed:
            raise RuntimeError("the gloo group is closed")
        if self.world == 1 or not ops:
            return [{spec[1]: {"median_s": 0.0, "samples_s": []} for spec in ops}
                    for _ in range(self.world)]
        job = {"ops": [list(o) for o in ops], "repeats": int(repeats), "warmup": int(warmup)}
        line = json.dumps(job) + "\n"
        for p in self._ranks.procs:
            p.stdin.write(line)
            p.stdin.flush()
        return align(self._collect("ok", self.timeout_s))

    def close(self) -> None:
        """Ask every worker to leave (a ``null`` job), give them 10 s in all, then end the rest
        (:meth:`planner.measure.runner.PythonRanks.close`)."""
        if self._closed:
            return
        self._closed = True
        for p in self._ranks.procs:
            try:
                if p.poll() is None:
                    p.stdin.write("null\n")
                    p.stdin.flush()
                p.stdin.close()
            except Exception:
                pass
        wait(self._ranks.procs, 10.0)
        self._ranks.close()
        if self._rdzv is not None:
            release(self._rdzv)

    def __enter__(self) -> "GlooGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


if __name__ == "__main__":  # worker entry point (see GlooGroup)
    import sys as _sys
    _worker(int(_sys.argv[1]), int(_sys.argv[2]), _sys.argv[3], float(_sys.argv[4]),
            *_sys.argv[5:6])
