"""The validation pool's processes: each one runs jobs as one rank until told to stop.

The processes form a pool that runs several jobs one after the other (a fresh process group
each), so torch is imported once per process. A job brings its rank's run (``rank_main``: a
DLRM run, :mod:`planner.measure.validate.dlrm_worker`, a calibration) or is an LLM plan's
training run (:func:`planner.measure.validate.llm_worker.run_rank`). Reports travel to the
parent on a queue: ``("ready", job, rank, None)`` once the job's groups are up,
``("done", job, rank, result)`` or ``("error", job, rank, info)``. A rank that fails reports
and exits at once (``os._exit``) without touching its groups again.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
import traceback

from planner.measure.heap import DEFAULT_HEAP, apply_heap_policy
from planner.measure.validate.comm import CommError, GroupBroken, Progress
from planner.measure.validate.llm_worker import run_rank

__all__ = ["worker_main"]


def worker_main(slot: int, inbox, progress: Progress, outbox, heap: str = DEFAULT_HEAP) -> None:
    """Entry point of a spawned pool process (importable by name, as spawn needs).

    Runs jobs ``(job, cfg, rdzv)`` from ``inbox`` as rank ``slot`` until ``None`` arrives;
    the parent sends a job only to the slots below its world size. After a failure the
    process reports and ends at once (``os._exit``), leaving its groups alone. ``heap``: the
    process's :mod:`planner.measure.heap` policy, set before torch allocates anything."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    apply_heap_policy(heap)
    _die_with_parent()
    while True:
        msg = inbox.get()
        if msg is None:
            break
        job, cfg, rdzv = msg
        state: dict = {"step": -1}
        try:
            send = (lambda kind, payload, job=job: outbox.put((kind, job, slot, payload)))
            rank_main = getattr(cfg, "rank_main", None)      # DLRM runs bring their own
            result = (rank_main(slot, rdzv, progress, send, state) if rank_main is not None
                      else run_rank(slot, cfg, rdzv, progress, send, state))
        except BaseException as exc:  # every failure goes to the parent, then the rank ends
            text = str(exc).strip()
            info = {"type": type(exc).__name__,
                    "message": text.splitlines()[0][:400] if text else type(exc).__name__,
                    "comm": isinstance(exc, (CommError, GroupBroken)) or _is_comm(exc),
                    "step": state["step"], "op": progress.snapshot(slot)["op"],
                    "traceback": "".join(traceback.format_exception(exc))[-3000:],
                    "time": time.monotonic()}
            try:
                outbox.put(("error", job, slot, info))
                outbox.close()
                outbox.join_thread()
            finally:
                os._exit(1)
        outbox.put(("done", job, slot, result))
    outbox.close()
    outbox.join_thread()


def _die_with_parent() -> None:
    """Linux: have the kernel kill this process if the parent dies (no orphans left)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _is_comm(exc: BaseException) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(w in text for w in ("gloo", "timed out", "timeout", "connection", "peer",
                                   "socket", "distbackenderror"))
