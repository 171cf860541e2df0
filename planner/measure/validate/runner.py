"""Start the ranks of a validation run, watch them, and end every one of them.

The ranks are spawned processes (:func:`planner.measure.runner.start_processes`; the parent
itself never imports torch). They meet through a file store, one per run
(:func:`planner.measure.runner.rendezvous`: no port is opened for it). The parent reads the ranks' reports from a queue and
their progress from shared memory, and ends the run when

- a rank reports an error: the error that is not a communication error (or else the earliest)
  is the cause; the others' errors are listed as consequences;
- a rank exits without a report (a crash, ``os._exit``, a signal);
- a rank stops making progress: its peers time out in their next call with it (the
  timeout of their process group) and the silent rank is named as the one that hung;
  a watchdog ends the run if nothing at all moves for ``timeout + 15 s``.

On any failure every rank still alive is terminated (SIGTERM, then SIGKILL after 3 s) and
joined (:func:`planner.measure.runner.end_processes`), and :class:`RunFailed` (exit code 1) says
which rank and why. No process outlives :func:`run`.
"""

from __future__ import annotations

import queue as queue_mod
import time
from dataclasses import dataclass, field

from simulator.errors import ClusterplanError

from planner.measure.heap import DEFAULT_HEAP
from planner.measure.runner import (SPAWN, end_processes, release, rendezvous, start_processes,
                                    wait)
from planner.measure.validate.comm import Progress
from planner.measure.validate.config import RunConfig
from planner.measure.validate.worker import worker_main
from planner.progress import Bar

__all__ = ["RunFailed", "RunResult", "Pool", "heap_of", "run", "run_many"]


class RunFailed(ClusterplanError):
    """A rank of a real run failed, hung or crashed (exit code 1)."""

    exit_code = 1

    def __init__(self, message: str, *, rank: int | None = None, pids: tuple = (),
                 details: dict | None = None) -> None:
        super().__init__(message)
        self.rank, self.pids, self.details = rank, pids, details or {}


@dataclass
class RunResult:
    """Per-rank results (see :func:`planner.measure.validate.worker.worker_main`) and the wall time."""

    ranks: list[dict]
    wall_s: float
    pids: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)


class Pool:
    """``size`` spawned rank processes that run jobs one after the other (torch is imported
    once per process), each with the :mod:`planner.measure.heap` policy ``heap``. After a
    failed job the pool is closed: every process is ended."""

    def __init__(self, size: int, heap: str = DEFAULT_HEAP) -> None:
        self.size = size
        self.heap = heap
        self.progress = Progress(SPAWN, size)
        self.out = SPAWN.Queue()
        self.inboxes = [SPAWN.Queue() for _ in range(size)]
        self.procs: list = []
        self.closed = False
        self.started = False
        self.jobs = 0
        self.rendezvous: list[str] = []       # each job's file store, removed at close
        try:
            self.procs = start_processes(
                worker_main, [(r, self.inboxes[r], self.progress, self.out, heap)
                              for r in range(size)],
                name="clusterplan-validate-rank{rank}")
        except BaseException:
            self.close()
            raise
        self.pids = tuple(p.pid for p in self.procs)

    def run(self, cfg: RunConfig, *, start_timeout_s: float | None = None,
            grace_s: float = 1.5) -> RunResult:
        """Run ``cfg`` on ranks ``0 .. cfg.world - 1`` of the pool (or raise RunFailed)."""
        if self.closed:
            raise RunFailed("the process pool is closed (an earlier run failed)")
        if cfg.world > self.size:
            raise RunFailed(f"a run of {cfg.world} ranks on a pool of {self.size}")
        if getattr(cfg, "heap", self.heap) != self.heap:
            raise RunFailed(f"a run with heap {cfg.heap!r} on a pool of heap {self.heap!r}")
        self.jobs += 1
        job, rdzv = self.jobs, rendezvous()
        self.rendezvous.append(rdzv)
        for r in range(cfg.world):
            self.inboxes[r].put((job, cfg, rdzv))
        limit = start_timeout_s if start_timeout_s is not None else \
            cfg.timeout_s + (60.0 + 10.0 * self.size if not self.started else 0.0)
        try:
            res = _watch(cfg, job, self.procs[:cfg.world], self.pids, self.progress, self.out,
                         time.monotonic(), limit, grace_s)
        except BaseException:
            self.close(force=True)
            raise
        self.started = True
        return res

    def close(self, *, force: bool = False) -> None:
        """Stop every process: ask politely (unless ``force``: after a failure ranks may be
        stuck in a call), then SIGTERM, then SIGKILL; join them all."""
        if self.closed:
            return
        self.closed = True
        if not force:
            for q in self.inboxes:
                try:
                    q.put(None)
                except Exception:  # pragma: no cover
                    pass
            wait(self.procs, 2.0)
        end_processes(self.procs)
        for rdzv in self.rendezvous:
            release(rdzv)
        for q in (*self.inboxes, self.out):
            q.close()
            q.cancel_join_thread()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def heap_of(cfg) -> str:
    """The heap policy a run's processes take (:mod:`planner.measure.heap`)."""
    return getattr(cfg, "heap", DEFAULT_HEAP)


def run(cfg: RunConfig, **kw) -> RunResult:
    """Run ``cfg`` on ``cfg.world`` fresh processes; all of them have ended on return."""
    with Pool(cfg.world, heap_of(cfg)) as pool:
        return pool.run(cfg, **kw)


def run_many(cfgs: list[RunConfig], **kw) -> list:
    """Run several configurations on one pool (a new one after a failure or for another heap
    policy); per config its :class:`RunResult` or the :class:`RunFailed` it raised."""
    out: list = []
    pool = None
    try:
        for cfg in cfgs:
            if pool is not None and not pool.closed and pool.heap != heap_of(cfg):
                pool.close()
            if pool is None or pool.closed:
                pool = Pool(max(c.world for c in cfgs), heap_of(cfg))
            try:
                out.append(pool.run(cfg, **kw))
            except RunFailed as exc:
                out.append(exc)
    finally:
        if pool is not None:
            pool.close()
    return out


def _watch(cfg, job, procs, pids, progress, q, t0, start_limit, grace_s) -> RunResult:
    """Wait for the run, with a progress bar over its steps (slowest rank) on a terminal."""
    bar = Bar(cfg.warmup + cfg.steps, f"validating on {cfg.world} processes (steps)")
    try:
        return _watch_run(cfg, job, procs, pids, progress, q, t0, start_limit, grace_s, bar)
    finally:
        bar.close()


def _watch_run(cfg, job, procs, pids, progress, q, t0, start_limit, grace_s, bar
               ) -> RunResult:
    world = cfg.world
    ready: set[int] = set()
    done: dict[int, dict] = {}
    errors: dict[int, dict] = {}
    exited_at: dict[int, float] = {}
    failing_since = None
    last_move, last_sig = time.monotonic(), None
    while len(done) < world:
        try:
            kind, msg_job, rank, payload = q.get(timeout=0.2)
            if msg_job != job:
                continue
            if kind == "ready":
                ready.add(rank)
            elif kind == "done":
                done[rank] = payload
            else:
                errors[rank] = payload
                failing_since = failing_since or time.monotonic()
            continue                      # drain the queue before judging exits
        except queue_mod.Empty:
            pass
        now = time.monotonic()
        for r, p in enumerate(procs):
            if p.exitcode is not None and r not in done and r not in errors:
                exited_at.setdefault(r, now)
        crashed = {r: procs[r].exitcode for r, at in exited_at.items()
                   if r not in done and r not in errors and now - at > 1.0}
        if crashed:
            failing_since = failing_since or now
        if failing_since is not None and now - failing_since >= grace_s:
            raise _failure(cfg, errors, crashed, done, procs, progress, pids, ready)
        if len(ready) < world:
            if now - t0 > start_limit:
                missing = sorted(set(range(world)) - ready)
                raise RunFailed(f"validation run failed: rank{'s' if len(missing) > 1 else ''} "
                                f"{_ranks(missing)} did not start in {start_limit:.0f} s "
                                "(importing torch and joining the gloo group)",
                                rank=missing[0], pids=pids)
            continue
        sig = tuple(progress.snapshot(r)["finished"] + progress.snapshot(r)["started"]
                    for r in range(world))
        if sig != last_sig:
            last_sig, last_move = sig, now
            bar.update(min(progress.snapshot(r)["step"] for r in range(world)))
        elif now - last_move > cfg.timeout_s + 15.0 and failing_since is None:
            snaps = {r: progress.snapshot(r) for r in range(world) if r not in done}
            stuck = min(snaps, key=lambda r: snaps[r]["last_s"])
            raise RunFailed(
                f"validation run failed: no rank made progress for {now - last_move:.0f} s; "
                f"rank {stuck} moved last {now - snaps[stuck]['last_s']:.0f} s ago (at step "
                f"{snaps[stuck]['step']}, {snaps[stuck]['op'] or 'no call yet'})",
                rank=stuck, pids=pids, details={"progress": snaps})
    return RunResult(ranks=[done[r] for r in range(world)], wall_s=time.monotonic() - t0,
                     pids=pids)


def _ranks(rs) -> str:
    return ", ".join(str(r) for r in rs)


def _failure(cfg, errors, crashed, done, procs, progress, pids, ready) -> RunFailed:
    """Name the rank that caused the failure and say what happened to the others."""
    snaps = {r: progress.snapshot(r) for r in range(cfg.world)}
    silent = [r for r in range(cfg.world)
              if r not in errors and r not in crashed and r not in done
              and procs[r].exitcode is None]
    causes = sorted((e["time"], r) for r, e in errors.items() if not e["comm"])
    parts: list[str] = []
    if causes:
        r = causes[0][1]
        e = errors[r]
        head = (f"rank {r} raised {e['type']}: {e['message']} (step {e['step']}, last "
                f"progress: {e['op'] or 'none'})")
    elif crashed:
        r = min(crashed)
        head = (f"rank {r} exited with code {crashed[r]} without a report (a crash or a kill; "
                f"step {snaps[r]['step']}, last progress: {snaps[r]['op'] or 'none'})")
        if r not in ready:
            head += (" before joining the group (a script that starts a validation run must "
                     "guard its main code with `if __name__ == '__main__':`, as spawn needs)")
    elif silent and errors:
        # a rank blocked in a call has started more calls than it finished; the hung one not
        r = min(silent, key=lambda x: (snaps[x]["started"] > snaps[x]["finished"],
                                       snaps[x]["last_s"]))
        idle = time.monotonic() - snaps[r]["last_s"]
        head = (f"rank {r} hung: no progress for {idle:.1f} s (step {snaps[r]['step']}, "
                f"last progress: {snaps[r]['op'] or 'none'}) while its peers timed out after "
                f"{cfg.timeout_s:g} s waiting for it")
    else:
        r = min(errors, key=lambda x: errors[x]["time"])
        e = errors[r]
        head = f"rank {r} failed first: {e['type']}: {e['message']} (step {e['step']})"
    for x in sorted(errors):
        if x != r:
            m = errors[x]["message"]
            parts.append(m if m.startswith(f"rank {x}:") else f"rank {x}: {m}")
    for x in sorted(crashed):
        if x != r:
            parts.append(f"rank {x} exited with code {crashed[x]}")
    msg = "validation run failed: " + head
    if parts:
        msg += "; then " + "; ".join(parts)
    msg += f"; all {cfg.world} processes ended"
    return RunFailed(msg, rank=r, pids=pids,
                     details={"errors": errors, "crashed": crashed, "progress": snaps})
