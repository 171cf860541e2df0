"""A logging wrapper around the ``torch.distributed`` calls a validation worker makes.

Every collective and point-to-point message goes through :class:`Recorder`, which

- records it (step, kind, bytes, group ranks, name, category, start and end wall time), bytes in
  the simulator's convention (nccl-tests: the full buffer of an all-gather or reduce-scatter);
- labels it for the profiler (``record_function``), because gloo's trace events carry no
  process group: ``tp:allreduce tp attn F mb0 c0 l2 ranks=[0, 1]`` encloses ``gloo:all_reduce``;
- publishes progress to the parent (op count, current op, last time), so a rank that hangs can
  be named;
- treats a group as unusable once a call on it raised: later calls fail at once instead of
  waiting on peers that may have moved on (after a failed collective, gloo ranks can disagree on
  the next one and hang).
"""

from __future__ import annotations

import time

__all__ = ["Recorder", "CommError", "GroupBroken", "Progress"]

NAME_BYTES = 160


class CommError(RuntimeError):
    """A communication call raised; names the rank, the call and the group."""


class GroupBroken(RuntimeError):
    """A call on a group that an earlier error made unusable."""


class Progress:
    """Shared-memory progress of every rank (created by the parent, written by the workers)."""

    def __init__(self, ctx, world: int) -> None:
        self.world = world
        self.counts = ctx.Array("d", 4 * world, lock=False)   # started, finished, time, step
        self.names = ctx.Array("c", NAME_BYTES * world, lock=False)

    def begin(self, rank: int, name: str, step: int) -> None:
        b = name.encode()[: NAME_BYTES - 1].ljust(NAME_BYTES, b"\0")
        self.names[rank * NAME_BYTES:(rank + 1) * NAME_BYTES] = b
        self.counts[4 * rank] += 1
        self.counts[4 * rank + 2] = time.monotonic()
        self.counts[4 * rank + 3] = step

    def end(self, rank: int) -> None:
        self.counts[4 * rank + 1] += 1
        self.counts[4 * rank + 2] = time.monotonic()

    def snapshot(self, rank: int) -> dict:
        raw = bytes(self.names[rank * NAME_BYTES:(rank + 1) * NAME_BYTES]).split(b"\0")[0]
        c = self.counts
        return {"started": int(c[4 * rank]), "finished": int(c[4 * rank + 1]),
                "last_s": float(c[4 * rank + 2]), "step": int(c[4 * rank + 3]),
                "op": raw.decode(errors="replace")}


class Recorder:
    """Wraps the calls of one rank; ``events`` holds one tuple per call:
    ``(step, kind, bytes, group, name, category, start_s, end_s)`` (monotonic seconds)."""

    def __init__(self, rank: int, progress: Progress | None = None) -> None:
        import torch.distributed as dist
        from torch.profiler import record_function
        self.dist, self._label = dist, record_function
        self.rank = rank
        self.progress = progress
        self.step = -1
        self.events: list[tuple] = []
        self.broken: dict[tuple, str] = {}
        self.pass_kind = "F"
        self.tag = ""
        self.pending: list = []

    # -- context ---------------------------------------------------------------------------
    def begin_pass(self, kind: str, mb: int, chunk: int) -> None:
        """Mark the start of a forward or backward pass (a zero-length ``pass`` event)."""
        self.pass_kind, self.tag = kind, f"mb{mb} c{chunk}"
        t = time.perf_counter()
        self.events.append((self.step, "pass", 0, (self.rank,), f"{kind} {self.tag}", "pass",
                            t, t))

    def fwd_label(self) -> str:
        """``F`` in a forward pass, ``R`` for a forward recomputed inside a backward pass."""
        return "F" if self.pass_kind == "F" else "R"

    def note(self, name: str) -> None:
        """Publish a non-communication step of progress (shown if this rank fails)."""
        if self.progress is not None:
            self.progress.begin(self.rank, name, self.step)
            self.progress.end(self.rank)

    # -- the wrapper -----------------------------------------------------------------------
    def _call(self, kind: str, nbytes: int, group: tuple, name: str, category: str, fn):
        if group in self.broken:
            raise GroupBroken(f"rank {self.rank}: group {list(group)} is unusable after an "
                              f"earlier error in {self.broken[group]!r}; not issuing {name!r}")
        if self.progress is not None:
            self.progress.begin(self.rank, f"{kind} {name} on {list(group)}", self.step)
        t0 = time.perf_counter()
        try:
            with self._label(f"{category}:{kind} {name} ranks={list(group)}"):
                out = fn()
        except Exception as exc:
            self.broken[group] = name
            raise CommError(f"rank {self.rank}: {kind} {name!r} on ranks {list(group)} failed: "
                            f"{type(exc).__name__}: {_first_line(exc)}") from exc
        t1 = time.perf_counter()
        self.events.append((self.step, kind, int(nbytes), group, name, category, t0, t1))
        if self.progress is not None:
            self.progress.end(self.rank)
        return out

    def all_reduce(self, t, pg, group: tuple, name: str, category: str, op: str = "sum"):
        d = self.dist
        rop = d.ReduceOp.MAX if op == "max" else d.ReduceOp.SUM
        if len(group) < 2:
            return t
        self._call("allreduce", t.numel() * t.element_size(), group, name, category,
                   lambda: d.all_reduce(t, op=rop, group=pg))
        return t

    def all_gather(self, out, inp, pg, group: tuple, name: str, category: str):
        """``out`` (the full buffer, its size is the recorded bytes) from every rank's ``inp``."""
        self._call("allgather", out.numel() * out.element_size(), group, name, category,
                   lambda: self.dist.all_gather_into_tensor(out, inp, group=pg))
        return out

    def send(self, t, dst: int, name: str, tag: int) -> None:
        """Non-blocking send (gloo ``isend``); completed by :meth:`wait_sends`."""
        group = (self.rank, dst)
        work = self._call("send", t.numel() * t.element_size(), group, name, "pp",
                          lambda: self.dist.isend(t, dst, tag=tag))
        self.pending.append((work, t, name, group))

    def recv(self, t, src: int, name: str, tag: int):
        group = (src, self.rank)
        self._call("recv", t.numel() * t.element_size(), group, name, "pp",
                   lambda: self.dist.recv(t, src, tag=tag))
        return t

    def wait_sends(self) -> None:
        while self.pending:
            work, _t, name, group = self.pending.pop(0)
            self._call("wait", 0, group, f"wait {name}", "pp-wait", work.wait)

    def barrier(self, pg=None) -> None:
        """A barrier between steps (not part of any step's record)."""
        if ("world",) in self.broken:
            raise GroupBroken(f"rank {self.rank}: the world group is unusable")
        try:
            self.dist.barrier(group=pg)
        except Exception as exc:
            self.broken[("world",)] = "barrier"
            raise CommError(f"rank {self.rank}: barrier failed: {type(exc).__name__}: "
                            f"{_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
