"""Per-worker embedding caches with bounded staleness (HET, Miao et al. PVLDB 2022; papers.md §9).

Workers train against a parameter server (PS) that holds the embedding rows; each worker keeps
a cache of ``capacity`` rows. Every row has a server clock ``C_s(k)`` (updates applied to it) and,
in a worker's cache, the clock it last saw ``C_c(k)`` and its un-pushed local updates:

- **lookup** (the distinct keys of the worker's batch, in order of first use): a cached row is
  served locally if ``C_s(k) − C_c(k) ≤ pull_bound``, else it is refreshed from the server (a
  pull); an uncached row is pulled and inserted, evicting by ``lru`` (least recently used) or
  ``lfu`` (least frequently used, ties to the least recent);
- **update** (after the step): every looked-up row gets one local update; a row whose un-pushed
  updates exceed ``push_bound`` pushes them (the server adds them to ``C_s(k)``, and the worker's
  own clock advances by its own updates); an evicted row pushes what it has.

Workers run an iteration in lockstep: all look up against the server clocks at its start, then
all push. Keys go to server ``k mod servers``. ``pull_bound = push_bound = 0`` is synchronous
PS training (every lookup pulls what changed, every update is pushed); large bounds are HET's
cache-enabled mode. Bytes count the row (``dim`` values of ``value_bytes``) and an 8-byte key
with its clock each way.

>>> import numpy as np
>>> stream = [[np.array([1, 2, 3])], [np.array([2, 3, 4])]]   # 2 iterations, 1 worker
>>> s = simulate_caches(stream, rows=10, capacity=3, servers=1, policy="lru",
...                     pull_bound=10, push_bound=10, dim=4)
>>> s.hits.tolist(), s.pulls.tolist()                       # 2 and 3 were cached
([[0], [2]], [[3], [1]])
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

__all__ = ["CacheStats", "simulate_caches", "zipf_stream", "POLICIES"]

POLICIES = ("lru", "lfu")


@dataclass
class CacheStats:
    """Per iteration × worker counts of distinct rows: ``hits`` served locally, ``pulls``
    fetched (misses and stale refreshes), ``stale`` the refreshes among the pulls, ``pushes``
    rows whose updates were sent; ``pulls_by_server`` / ``pushes_by_server`` split by server
    (iteration × worker × server)."""

    hits: np.ndarray
    stale: np.ndarray
    pulls_by_server: np.ndarray
    pushes_by_server: np.ndarray
    row_bytes: float

    @property
    def pulls(self) -> np.ndarray:
        return self.pulls_by_server.sum(2)

    @property
    def pushes(self) -> np.ndarray:
        return self.pushes_by_server.sum(2)

    @property
    def server_rows(self) -> np.ndarray:
        """Rows each server sent and took per iteration (iteration × server)."""
        return (self.pulls_by_server + self.pushes_by_server).sum(1)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits.sum() + self.pulls.sum()
        return float(self.hits.sum() / lookups) if lookups else 0.0

    def bytes_per_iteration(self) -> tuple[np.ndarray, np.ndarray]:
        """(pulled, pushed) bytes per iteration, all workers."""
        return self.pulls.sum(1) * self.row_bytes, self.pushes.sum(1) * self.row_bytes


class _Cache:
    """One worker's cache: key -> [seen clock, un-pushed updates, uses, last use]; LFU keeps a
    heap of (uses, last use, key) entries, stale ones skipped when popped."""

    def __init__(self, capacity: int, policy: str) -> None:
        self.capacity, self.policy = capacity, policy
        self.lines: OrderedDict[int, list] = OrderedDict()
        self.heap: list[tuple[int, int, int]] = []
        self.tick = 0

    def insert(self, k: int, seen: int) -> None:
        self.tick += 1
        self.lines[k] = [seen, 0, 1, self.tick]
        if self.policy == "lfu":
            heapq.heappush(self.heap, (1, self.tick, k))

    def touch(self, k: int) -> None:
        self.tick += 1
        line = self.lines[k]
        self.lines.move_to_end(k)
        line[2] += 1
        line[3] = self.tick
        if self.policy == "lfu":
            heapq.heappush(self.heap, (line[2], line[3], k))

    def victim(self) -> int:
        if self.policy == "lru":
            return next(iter(self.lines))
        while True:                                  # least used, then least recently used
            uses, tick, k = heapq.heappop(self.heap)
            line = self.lines.get(k)
            if line is not None and line[2] == uses and line[3] == tick:
                return k


def simulate_caches(stream, *, rows: int, capacity: int, servers: int, policy: str,
                    pull_bound: int, push_bound: int, dim: int,
                    value_bytes: int = 4) -> CacheStats:
    """Run the caches over ``stream[iteration][worker]`` (arrays of row ids, repeats allowed)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    iters, workers = len(stream), len(stream[0])
    clock = np.zeros(rows, dtype=np.int64)
    caches = [_Cache(capacity, policy) for _ in range(workers)]
    hits, stale = (np.zeros((iters, workers), dtype=np.int64) for _ in range(2))
    pulls, pushes = (np.zeros((iters, workers, servers), dtype=np.int64) for _ in range(2))
    for it in range(iters):
        looked = []
        for w in range(workers):
            keys = _first_use_order(stream[it][w])
            looked.append(keys)
            h, p, st, pushed = _lookup(caches[w], keys, clock, pull_bound, capacity)
            hits[it, w], stale[it, w] = h, st
            np.add.at(pulls[it, w], np.asarray(p, dtype=np.int64) % servers, 1)
            for k, n in pushed:                       # evicted rows push what they had
                clock[k] += n
                pushes[it, w, k % servers] += 1
        for w in range(workers):
            for k in looked[w]:
                line = caches[w].lines.get(k)
                if line is None:                      # no cache: the update goes straight out
                    clock[k] += 1
                    pushes[it, w, k % servers] += 1
                    continue
                line[1] += 1
                if line[1] > push_bound:
                    clock[k] += line[1]
                    line[0] += line[1]
                    line[1] = 0
                    pushes[it, w, k % servers] += 1
    return CacheStats(hits, stale, pulls, pushes, dim * value_bytes + 16)


def _first_use_order(ids) -> list[int]:
    ids = np.asarray(ids, dtype=np.int64)
    _, first = np.unique(ids, return_index=True)
    return ids[np.sort(first)].tolist()


def _lookup(cache: _Cache, keys: list[int], clock: np.ndarray, pull_bound: int,
            capacity: int) -> tuple[int, list[int], int, list[tuple[int, int]]]:
    """(hits, pulled keys, stale refreshes, evicted (key, un-pushed updates))."""
    hits, stale = 0, 0
    pulled, evicted = [], []
    lines = cache.lines
    for k in keys:
        line = lines.get(k)
        if line is not None:
            cache.touch(k)
            if clock[k] - line[0] <= pull_bound:
                hits += 1
                continue
            stale += 1
            line[0] = int(clock[k])                  # refreshed: the server's value + own delta
            pulled.append(k)
            continue
        if capacity <= 0:
            pulled.append(k)
            continue
        if len(lines) >= capacity:
            v = cache.victim()
            n = lines.pop(v)[1]
            if n:
                evicted.append((v, n))
        cache.insert(k, int(clock[k]))
        pulled.append(k)
    return hits, pulled, stale, evicted


def zipf_stream(*, rows: int, exponent: float, lookups: int, workers: int, iterations: int,
                seed: int = 0) -> list[list[np.ndarray]]:
    """Row ids drawn with probability ∝ rank^-exponent, ranks scattered over the rows by a
    fixed permutation (hot rows are not neighbours); ``lookups`` ids per worker and iteration."""
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=float) ** -float(exponent)
    p /= p.sum()
    perm = rng.permutation(rows)
    return [[perm[rng.choice(rows, size=lookups, p=p)] for _ in range(workers)]
            for _ in range(iterations)]
