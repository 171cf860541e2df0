"""The ordered communication events each rank issues in one simulated step: what
``planner/measure/validate`` compares with the collectives a real run records."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import SpecError
from simulator.workload import Workload

from planner.model.llm.layout import Layout

__all__ = ["CommEvent", "comm_events"]


@dataclass(frozen=True, slots=True)
class CommEvent:
    """One communication event as one rank issues it, or a pass marker.

    ``kind``: ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``, ``broadcast``,
    ``send``, ``recv`` or ``pass``; ``bytes``: the collective's size (nccl-tests convention:
    the full buffer), the message of a send/recv, 0 for a pass; ``group``: global ranks in
    group order, ``(src, dst)`` for a send/recv, ``(rank,)`` for a pass."""

    kind: str
    bytes: int
    group: tuple[int, ...]
    name: str
    category: str


def comm_events(workload: Workload, layout: Layout, rank: int, *,
                explicit_categories: tuple[str, ...] = ("dp",)) -> list[CommEvent]:
    """The communication events global ``rank`` issues in one step of ``workload``, in order.

    A step workload (see :func:`build_step`) issues compute, pipeline sends and TP/CP
    collectives for one representative per stage (``tp = cp = dp = 0``); ops of categories
    ``explicit_categories`` (DP traffic) are issued for every rank. A representative's op is
    moved to ``rank`` by shifting each member's coordinates along the axes the op's group does
    not span by ``rank``'s offset from its stage representative. A send is issued right after
    the op it depends on (the sender's pass), a receive right before the first op of the
    receiver that waits for it (the receiver's pass). Pass markers (compute ops of category
    ``pass``) are included.

    >>> from simulator.workload import Workload
    >>> w = Workload()
    >>> f = w.compute(0, "F mb0 c0", duration_s=0.0, category="pass")
    >>> x = w.sendrecv(0, 2, 64, deps=[f], category="pp", name="act mb0")
    >>> [(e.kind, e.group) for e in comm_events(w, Layout(tp=2, cp=1, dp=1, pp=2), 1)]
    [('pass', (1,)), ('send', (1, 3))]
    """
    if not 0 <= rank < layout.world:
        raise SpecError(f"rank {rank} is outside 0..{layout.world - 1}", field="rank",
                        fix=f"pass a rank below {layout.world}")
    coords = [layout.coords(r) for r in range(layout.world)]
    mine = coords[rank]
    rep = coords[layout.rank(pp=mine["pp"])]
    offset = {a: mine[a] - rep[a] for a in mine}

    def shifted(ranks: tuple[int, ...]) -> tuple[int, ...] | None:
        cs = [coords[r] for r in ranks]
        spans = {a for a in offset if len({c[a] for c in cs}) > 1}
        out = []
        for c in cs:
            new = {a: c[a] if a in spans else c[a] + offset[a] for a in c}
            if any(not 0 <= new[a] < getattr(layout, a) for a in new):
                return None
            out.append(layout.rank(**new))
        return tuple(out)

    consumer = _receivers(workload)
    keyed: list[tuple[tuple[int, int, int], CommEvent]] = []
    for op in workload.ops:
        if op.kind == "compute" and op.category != "pass":
            continue
        if any(r >= layout.world for r in op.ranks):
            raise SpecError(f"op {op.id} ({op.name}) uses rank {max(op.ranks)} outside the "
                            f"layout's {layout.world} ranks", field="layout",
                            fix="pass the layout the workload was built with")
        ranks = op.ranks if op.category in explicit_categories else shifted(op.ranks)
        if ranks is None or rank not in ranks:
            continue
        key = (op.id, 0, 0)
        if op.kind == "collective":
            ev = CommEvent(op.collective, round(op.bytes_moved), ranks, op.name, op.category)
        elif op.kind == "sendrecv":
            sending = rank == ranks[0]
            ev = CommEvent("send" if sending else "recv", round(op.bytes_moved), ranks,
                           op.name, op.category)
            if sending and op.deps:
                key = (max(op.deps), 1, op.id)
            elif not sending:
                key = (consumer.get(op.id, op.id), -1, op.id)
        else:
            ev = CommEvent("pass", 0, ranks, op.name, op.category)
        keyed.append((key, ev))
    keyed.sort(key=lambda kv: kv[0])
    return [ev for _, ev in keyed]


def _receivers(workload: Workload) -> dict[int, int]:
    """Send/recv op id -> id of the first op on its receiving rank that depends on it."""
    dst = {op.id: op.ranks[1] for op in workload.ops if op.kind == "sendrecv"}
    first: dict[int, int] = {}
    for op in workload.ops:
        for d in op.deps:
            if d in dst and dst[d] in op.ranks and op.id < first.get(d, op.id + 1):
                first[d] = op.id
    return first
