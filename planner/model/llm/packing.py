"""Packing documents into the micro-batches of each global batch (WLB-LLM §5.2–5.3).

A global batch has ``n`` micro-batches of ``seq`` tokens each. Documents arrive in dataset
order, each cut to the sequence length. Three packers:

``original``
    Fill each sequence in order and cut the document that crosses its end (its rest opens the
    next sequence): equal tokens, unequal attention work.
``fixed``
    Fixed-length greedy repacking over ``window`` global batches: take their documents, longest
    first, each into the micro-batch with the least work that still has room (≤ ``seq``
    tokens); what fits nowhere waits for the next window, where it goes first. The window's
    micro-batches, sorted by work, form its global batches ``n`` at a time, so like work trains
    together (which is why a wider window balances better, and why it moves tokens across
    iterations).
``wlb``
    Variable-length packing with outlier delay (WLB-LLM Algorithm 1): documents of at least the
    first threshold wait in per-length FIFO queues until a queue holds ``n`` of them, then one
    goes to each micro-batch; the rest, longest first, go to the micro-batch of least predicted
    work if it stays within ``max_tokens``, else to the one with fewest tokens if it fits there,
    else to the next global batch. The loader reads new documents until the batch's own and
    carried ones hold ``n·seq`` tokens.

Work is ``work(d)`` per document (default ``d²``: causal attention, the packing imbalance the
paper reports); a cost model passes its attention-plus-linear latency instead.

>>> from planner.model.llm.documents import DocumentSpec, length_sampler
>>> spec = DocumentSpec(packing="original", seed=1)
>>> batches = pack(spec, length_sampler(spec), seq=8192, n=4, batches=2)
>>> [sum(mb) for mb in batches[0].microbatches]
[8192, 8192, 8192, 8192]
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from planner.model.llm.documents import DocumentSpec, LengthSampler

__all__ = ["GlobalBatch", "pack", "imbalance", "default_thresholds"]


@dataclass
class GlobalBatch:
    """One global batch: ``microbatches[j]`` lists its documents' lengths (tokens);
    ``delays`` the iterations each document's tokens waited (tokens, iterations): positive
    when trained later than it arrived, negative when a packing window pulled it earlier."""

    microbatches: list[list[int]]
    delays: list[tuple[int, int]] = field(default_factory=list)

    def tokens(self) -> list[int]:
        return [sum(mb) for mb in self.microbatches]


def default_thresholds(seq: int, queues: int) -> list[int]:
    """Queue lower bounds ``seq/2^(queues+1-i)``: with 2 queues, a quarter and half of it."""
    return [max(1, seq >> (queues + 1 - i)) for i in range(1, queues + 1)]


def imbalance(batch: GlobalBatch, work: Callable[[int], float] | None = None) -> float:
    """Max over mean of the micro-batches' work (WLB-LLM's packing imbalance, ≥ 1)."""
    w = _work_fn(work)
    per = [sum(w(d) for d in mb) for mb in batch.microbatches]
    mean = sum(per) / len(per)
    return max(per) / mean if mean > 0 else 1.0


def _work_fn(work):
    return work if work is not None else (lambda d: float(d) * d)


def pack(spec: DocumentSpec, sampler: LengthSampler, *, seq: int, n: int, batches: int,
         work: Callable[[int], float] | None = None) -> list[GlobalBatch]:
    """``batches`` global batches of ``n`` micro-batches of ``seq`` tokens, by ``spec.packing``."""
    packer = {"original": _original, "fixed": _fixed, "wlb": _wlb}[spec.packing]
    return packer(spec, sampler, seq, n, batches, _work_fn(work))


def _original(spec, sampler, seq, n, batches, work) -> list[GlobalBatch]:
    out = []
    pending: deque[int] = deque()               # the stream; a cut document's rest goes first
    for _ in range(batches):
        mbs = []
        for _ in range(n):
            cur, room = [], seq
            while room:
                if not pending:
                    pending.extend(sampler.stream(seq, seq))
                d = pending.popleft()
                take = min(d, room)
                cur.append(take)
                room -= take
                if d > take:
                    pending.appendleft(d - take)
            mbs.append(cur)
        out.append(GlobalBatch(mbs, [(t, 0) for mb in mbs for t in mb]))
    return out


def _fixed(spec, sampler, seq, n, batches, work) -> list[GlobalBatch]:
    out: list[GlobalBatch] = []
    waiting: list[tuple[int, int]] = []         # (length, arrival batch) left from a window
    b = 0
    while b < batches:
        k = min(spec.window, batches - b)
        docs = sorted(waiting, key=lambda x: -x[0])     # what waited goes first
        have = sum(d for d, _ in waiting)
        for j in range(k):                      # the loader reads what the window lacks
            need = max(0, (j + 1) * n * seq - have)
            new = sampler.stream(need, seq) if need else []
            docs += [(d, b + j) for d in new]
            have += sum(new)
        docs[len(waiting):] = sorted(docs[len(waiting):], key=lambda x: -x[0])
        heap = [(0.0, j) for j in range(k * n)]       # (work, micro-batch)
        mbs: list[list[tuple[int, int]]] = [[] for _ in range(k * n)]
        room = [seq] * (k * n)
        waiting = []
        for d, arrived in docs:
            j = _least_work_with_room(heap, room, d)
            if j is None:
                waiting.append((d, arrived))
                continue
            mbs[j].append((d, arrived))
            room[j] -= d
            heapq.heappush(heap, (heap_work(mbs[j], work), j))
        # micro-batches of like work train together: each global batch is balanced within
        order = sorted(range(k * n), key=lambda j: heap_work(mbs[j], work))
        for g in range(k):
            group = [mbs[j] for j in order[g * n:(g + 1) * n]]
            out.append(GlobalBatch([[d for d, _ in mb] for mb in group],
                                   [(d, b + g - a) for mb in group for d, a in mb]))
        b += k
    return out


def heap_work(mb, work) -> float:
    return sum(work(d) for d, _ in mb)


def _least_work_with_room(heap, room, d) -> int | None:
    """Pop micro-batches by least work until one has room for ``d``; the others go back."""
    skipped, found = [], None
    while heap:
        w, j = heapq.heappop(heap)
        if room[j] >= d:
            found = j
            break
        skipped.append((w, j))
    for item in skipped:
        heapq.heappush(heap, item)
    return found


def _wlb(spec, sampler, seq, n, batches, work) -> list[GlobalBatch]:
    max_tokens = spec.max_tokens or seq
    bounds = list(spec.thresholds) or default_thresholds(seq, spec.queues)
    queues: list[deque] = [deque() for _ in bounds] if spec.queues else []
    carried: list[tuple[int, int]] = []
    out = []
    for b in range(batches):
        have = sum(d for d, _ in carried)
        new = [(d, b) for d in sampler.stream(max(n * seq - have, 1), seq)]
        fresh = []
        for d, a in new:
            q = _queue_of(d, bounds) if queues else None
            if q is None:
                fresh.append((d, a))
            else:
                queues[q].append((d, a))
        for q in queues:
            while len(q) >= n:
                fresh += [q.popleft() for _ in range(n)]
        # Algorithm 1's document set (carried-over and new), longest first
        docs = sorted(carried + fresh, key=lambda x: -x[0])
        mbs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        load, toks = [0.0] * n, [0] * n
        carried = []
        for d, a in docs:
            j = min(range(n), key=lambda i: (load[i], i))
            if toks[j] + d > max_tokens:
                j = min(range(n), key=lambda i: (toks[i], i))
                if toks[j] + d > max_tokens:
                    carried.append((d, a))
                    continue
            mbs[j].append((d, a))
            load[j] += work(d)
            toks[j] += d
        out.append(GlobalBatch([[d for d, _ in mb] for mb in mbs],
                               [(d, b - a) for mb in mbs for d, a in mb]))
    return out


def _queue_of(d: int, bounds: list[int]) -> int | None:
    """The queue of a document of ``d`` tokens: the last lower bound it reaches (none: not an
    outlier)."""
    q = None
    for i, lo in enumerate(bounds):
        if d >= lo:
            q = i
    return q


def delay_histogram(batches: list[GlobalBatch]) -> dict[int, float]:
    """Share of tokens by iterations of delay (WLB-LLM's convergence concern)."""
    tok: dict[int, int] = {}
    for gb in batches:
        for t, it in gb.delays:
            tok[it] = tok.get(it, 0) + t
    total = sum(tok.values()) or 1
    return {k: tok[k] / total for k in sorted(tok)}


def mean_imbalance(batches: list[GlobalBatch], work=None) -> float:
    return float(np.mean([imbalance(gb, work) for gb in batches]))
