"""Compare the communication a real run issued with the simulator's op graph, exactly.

Per rank and per step, both sides are lists of :class:`~planner.workloads.llm.comm_events.CommEvent`. They are
compared on channels, in order:

- ``pipeline``: the pass markers, sends and receives of the rank in issue order (the pipeline
  schedule and where each message sits in it: kind, bytes, (src, dst), name);
- one channel per process group (TP, DP ...): the collectives on that group in issue order
  (kind, bytes, name). Collectives on one group must be issued in the same order by every
  member, so this order is what a run depends on; the interleaving of different groups (when
  a DP bucket starts relative to TP traffic) is a timing matter and is not compared.

The first difference (rank, step, channel, position, both sides) is reported. Pure Python; no
torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from planner.workloads.llm.comm_events import CommEvent

__all__ = ["Mismatch", "StructureReport", "channels", "compare_rank", "compare_structure",
           "events_from_records", "describe"]

PIPELINE = ("pass", "send", "recv")
SKIPPED = ("wait",)


@dataclass(frozen=True, slots=True)
class Mismatch:
    rank: int
    step: int
    channel: str
    index: int
    expected: tuple | None
    measured: tuple | None

    #: what one entry of the channel is called in the message
    item = "event"

    @staticmethod
    def side(x) -> str:
        return "nothing" if x is None else " ".join(str(v) for v in x)

    def text(self) -> str:
        return (f"rank {self.rank}, step {self.step}, {self.channel} {self.item} {self.index}: "
                f"simulator {self.side(self.expected)}; real run {self.side(self.measured)}")


@dataclass
class StructureReport:
    match: bool
    first: Mismatch | None
    steps: int
    ranks: int
    counts: dict = field(default_factory=dict)          # per step over all ranks: expected
    measured_counts: dict = field(default_factory=dict)  # per step over all ranks: real (step 0)

    def to_dict(self) -> dict:
        f = self.first
        return {"match": self.match, "steps_checked": self.steps, "ranks": self.ranks,
                "events_per_step": self.counts, "measured_events_per_step": self.measured_counts,
                "first_mismatch": None if f is None else {
                    "rank": f.rank, "step": f.step, "channel": f.channel, "index": f.index,
                    "expected": list(f.expected) if f.expected else None,
                    "measured": list(f.measured) if f.measured else None, "text": f.text()}}


def events_from_records(records: list[tuple]) -> dict[int, list[CommEvent]]:
    """A worker's recorder tuples ``(step, kind, bytes, group, name, category, t0, t1)`` →
    events per step (waits on sends left out)."""
    out: dict[int, list[CommEvent]] = {}
    for step, kind, nbytes, group, name, cat, *_ in records:
        if kind in SKIPPED:
            continue
        out.setdefault(step, []).append(CommEvent(kind, int(nbytes), tuple(group), name, cat))
    return out


def channels(events: list[CommEvent]) -> dict[str, list[tuple]]:
    """Split one rank's events into the pipeline channel and one channel per group."""
    out: dict[str, list[tuple]] = {"pipeline": []}
    for e in events:
        if e.kind in PIPELINE:
            peers = "" if e.kind == "pass" else f"{e.group[0]}->{e.group[1]}"
            out["pipeline"].append((e.kind, e.bytes, peers, e.name))
        else:
            out.setdefault(f"{e.category} group {list(e.group)}", []).append(
                (e.kind, e.bytes, e.name))
    return out


def compare_rank(rank: int, step: int, expected: list[CommEvent],
                 measured: list[CommEvent]) -> Mismatch | None:
    """The first difference between one rank's expected and measured events of a step."""
    a, b = channels(expected), channels(measured)
    for ch in ["pipeline"] + sorted((set(a) | set(b)) - {"pipeline"}):
        xs, ys = a.get(ch, []), b.get(ch, [])
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            if x != y:
                return Mismatch(rank, step, ch, i, x, y)
    return None


def _count(events_by_rank) -> dict[str, int]:
    c: Counter = Counter()
    for evs in events_by_rank:
        for e in evs:
            if e.kind != "pass":
                c[f"{e.category} {e.kind}"] += 1
    return dict(sorted(c.items()))


def compare_structure(expected: dict[int, list[CommEvent]],
                      measured: dict[int, dict[int, list[CommEvent]]]) -> StructureReport:
    """Every measured step of every rank against the simulator's one step."""
    first = None
    steps = sorted({s for per in measured.values() for s in per})
    for r in sorted(set(expected) | set(measured)):
        for s in steps:
            mm = compare_rank(r, s, expected.get(r, []), measured.get(r, {}).get(s, []))
            if mm is not None and (first is None or (mm.step, mm.rank) < (first.step, first.rank)):
                first = mm
    s0 = steps[0] if steps else 0
    return StructureReport(match=first is None, first=first, steps=len(steps),
                           ranks=len(set(expected) | set(measured)),
                           counts=_count(expected.values()),
                           measured_counts=_count(per.get(s0, []) for per in measured.values()))


def describe(counts: dict[str, int]) -> str:
    """``{'tp allreduce': 96, 'pp send': 12}`` → ``'96 tp allreduce, 12 pp send'``."""
    return ", ".join(f"{n} {k}" for k, n in counts.items()) or "no communication"
