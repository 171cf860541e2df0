"""A training step as data: a DAG of compute and communication ops on per-device streams.

Ops are issued in program order. Every op runs on one or more ranks (global GPU indices) and on
one named stream of each (``compute``, ``comm``, ``comm:dp`` ...). As on CUDA streams and NCCL
communicators, ops on the same (rank, stream) run in the order they were issued, and ops on
different streams overlap unless a dependency says otherwise; so overlap follows from the
dependencies, not from a formula. A collective starts when it is at the head of the stream on
every member rank and its dependencies are done.

>>> w = Workload()
>>> f = w.compute(0, "fwd", flops=1e12, bytes_moved=1e9)
>>> ar = w.collective("allreduce", [0, 1], 2**28, deps=[f], stream="comm")
>>> len(w.ops)
2
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from simulator.errors import SpecError

__all__ = ["Op", "Workload"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operation of the DAG.

    Attributes
    ----------
    id : int
        Position in issue order.
    name : str
        Label shown in tables and timelines.
    kind : str
        ``compute``, ``collective``, ``sendrecv`` or ``delay``.
    ranks : tuple of int
        Ranks the op occupies (one for compute and delay; the group for a collective;
        (src, dst) for sendrecv).
    stream : str
        Stream name on each rank.
    deps : tuple of int
        Ids of ops that must finish first (besides stream order).
    flops : float
        Floating-point operations (compute), FLOP.
    bytes_moved : float
        Memory traffic of a compute op (bytes) or the collective size (nccl-tests convention).
    dtype : str
        Precision of a compute op (bf16, fp32 ...).
    duration_s : float or None
        Fixed duration, seconds (delay ops; or a measured compute time replacing the roofline).
    collective : str
        Collective kind for collective ops.
    algo : str
        Collective algorithm or ``auto``.
    category : str
        Free label for breakdowns (``fwd``, ``bwd``, ``dp``, ``tp`` ...).
    """

    id: int
    name: str
    kind: str
    ranks: tuple[int, ...]
    stream: str
    deps: tuple[int, ...] = ()
    flops: float = 0.0
    bytes_moved: float = 0.0
    dtype: str = "bf16"
    duration_s: float | None = None
    collective: str = ""
    algo: str = "auto"
    splits: tuple | None = None
    category: str = ""


@dataclass
class Workload:
    """Builder of an op DAG in issue order; methods return the new op's id."""

    ops: list[Op] = field(default_factory=list)
    name: str = "workload"

    def _deps(self, deps: Iterable[int] | None) -> tuple[int, ...]:
        d = tuple(int(x) for x in (deps or ()))
        for x in d:
            if not 0 <= x < len(self.ops):
                raise SpecError(f"dependency on op {x}, which is not issued yet", field="deps",
                                fix="issue ops before the ops that depend on them")
        return d

    def _add(self, **kw) -> int:
        op = Op(id=len(self.ops), **kw)
        self.ops.append(op)
        return op.id

    def compute(self, rank: int, name: str, *, flops: float = 0.0, bytes_moved: float = 0.0,
                dtype: str = "bf16", stream: str = "compute", deps: Iterable[int] | None = None,
                duration_s: float | None = None, category: str = "compute") -> int:
        """A kernel on one rank, timed by the roofline model unless ``duration_s`` is given."""
        if flops < 0 or bytes_moved < 0 or (duration_s is not None and duration_s < 0):
            raise SpecError(f"op {name!r}: flops, bytes and duration must be non-negative",
                            field=name, fix="pass non-negative numbers")
        return self._add(name=name, kind="compute", ranks=(int(rank),), stream=stream,
                         deps=self._deps(deps), flops=float(flops), bytes_moved=float(bytes_moved),
                         dtype=dtype, duration_s=duration_s, category=category)

    def delay(self, rank: int, name: str, seconds: float, *, stream: str = "compute",
              deps: Iterable[int] | None = None, category: str = "delay") -> int:
        """Busy a stream for a fixed time (host overhead, a measured kernel)."""
        return self.compute(rank, name, stream=stream, deps=deps, duration_s=seconds,
                            category=category)

    def collective(self, kind: str, ranks: Sequence[int], size_bytes: float, *,
                   name: str | None = None, stream: str = "comm", algo: str = "auto",
                   deps: Iterable[int] | None = None, splits=None, category: str = "comm") -> int:
        """A collective over ``ranks`` (global GPU indices, in the group's rank order)."""
        if size_bytes < 0:
            raise SpecError(f"collective size must be non-negative, got {size_bytes}",
                            field=name or kind, fix="pass a byte count")
        return self._add(name=name or kind, kind="collective", ranks=tuple(int(r) for r in ranks),
                         stream=stream, deps=self._deps(deps), bytes_moved=float(size_bytes),
                         collective=kind, algo=algo,
                         splits=None if splits is None else tuple(map(tuple, splits)),
                         category=category)

    def sendrecv(self, src: int, dst: int, size_bytes: float, *, name: str = "p2p",
                 stream: str = "p2p", deps: Iterable[int] | None = None,
                 category: str = "p2p") -> int:
        """A point-to-point message; occupies ``stream`` on both ranks."""
        if src == dst:
            raise SpecError(f"send from rank {src} to itself", field=name,
                            fix="send to a different rank")
        return self._add(name=name, kind="sendrecv", ranks=(int(src), int(dst)), stream=stream,
                         deps=self._deps(deps), bytes_moved=float(size_bytes), category=category)
