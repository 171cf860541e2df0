"""Exact rings: brute force (tiny n) and a mixed-integer program solved by CBC (small n).

The ring TSP on a symmetric cost matrix ``c`` (n × n): choose n undirected edges, two at every
rank, forming one cycle, with the least total cost. The MIP (Dantzig–Fulkerson–Johnson)::

    min Σ_{i<j} c_ij x_ij   s.t.  Σ_j x_ij = 2 for every i,
                                  Σ_{i<j ∈ S} x_ij ≤ |S| − 1 for every subtour S found,
                                  x_ij ∈ {0, 1}

is solved without the subtour constraints, then re-solved with a cut for each subtour in the
answer until the answer is one cycle (few rounds at n ≤ 30). A time limit bounds the whole loop;
when it runs out the best cycle seen (patched from the subtours) is returned, flagged inexact.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np
import pulp

from planner.lp import cbc, variable

__all__ = ["ExactRing", "ring_cost", "brute_force_ring", "mip_ring"]


@dataclass(frozen=True, slots=True)
class ExactRing:
    """A ring (``order``), its total cost, and whether optimality was proven."""

    order: tuple[int, ...]
    cost: float
    optimal: bool
    rounds: int = 0
    wall_s: float = 0.0


def ring_cost(c: np.ndarray, order) -> float:
    """Total cost of the closed ring ``order`` on matrix ``c``."""
    o = np.asarray(order, dtype=np.int64)
    return float(c[o, np.roll(o, -1)].sum())


def brute_force_ring(c: np.ndarray) -> ExactRing:
    """Enumerate every ring through rank 0 ((n − 1)!/2 distinct ones); n ≤ 10."""
    n = c.shape[0]
    if n > 10:
        raise ValueError(f"brute force over {n} ranks is too slow; use mip_ring")
    if n <= 3:
        o = tuple(range(n))
        return ExactRing(o, ring_cost(c, o), True)
    best, best_o = np.inf, None
    for perm in itertools.permutations(range(1, n)):
        if perm[0] > perm[-1]:      # each ring once, not in both directions
            continue
        o = (0,) + perm
        v = ring_cost(c, o)
        if v < best:
            best, best_o = v, o
    return ExactRing(best_o, best, True)


def _cycles(n: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    adj: dict[int, list[int]] = {i: [] for i in range(n)}
    for i, j in edges:
        adj[i].append(j)
        adj[j].append(i)
    seen, out = set(), []
    for s in range(n):
        if s in seen:
            continue
        cyc, prev, cur = [s], -1, s
        seen.add(s)
        while True:
            nxt = next((v for v in adj[cur] if v != prev and v not in seen), None)
            if nxt is None:
                break
            cyc.append(nxt)
            seen.add(nxt)
            prev, cur = cur, nxt
        out.append(cyc)
    return out


def _patch(c: np.ndarray, cycles: list[list[int]]) -> list[int]:
    """Join subtours into one ring, cheapest splice first (used only when time runs out)."""
    tour = list(cycles[0])
    for cyc in cycles[1:]:
        best = (np.inf, 0, 0)
        for a in range(len(tour)):
            u, v = tour[a], tour[(a + 1) % len(tour)]
            for b in range(len(cyc)):
                x, y = cyc[b], cyc[(b + 1) % len(cyc)]
                d = c[u, x] + c[y, v] - c[u, v] - c[x, y]
                if d < best[0]:
                    best = (d, a, b)
        _, a, b = best
        seg = cyc[b::-1] + cyc[:b:-1]       # x … y, going backwards round the cycle
        tour = tour[:a + 1] + seg + tour[a + 1:]
    return tour


def mip_ring(c: np.ndarray, *, time_limit_s: float = 20.0, start=None) -> ExactRing:
    """Optimal ring by the DFJ MIP with subtour cuts, PuLP + CBC, within ``time_limit_s``."""

    n = c.shape[0]
    t0 = time.perf_counter()
    if n <= 3:
        o = tuple(range(n))
        return ExactRing(o, ring_cost(c, o), True)
    prob = pulp.LpProblem("ring", pulp.LpMinimize)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    x = {p: variable(prob, f"x_{p[0]}_{p[1]}", cat="Binary") for p in pairs}
    prob += pulp.lpSum(float(c[i, j]) * x[i, j] for i, j in pairs)
    for k in range(n):
        prob += pulp.lpSum(x[min(k, m), max(k, m)] for m in range(n) if m != k) == 2
    best_tour = list(start) if start is not None else None
    rounds = 0
    while True:
        rounds += 1
        left = time_limit_s - (time.perf_counter() - t0)
        if left <= 0:
            break
        status = prob.solve(cbc(timeLimit=max(1, int(left + 0.999))))
        if pulp.LpStatus[status] != "Optimal":
            break
        edges = [p for p in pairs if x[p].value() is not None and x[p].value() > 0.5]
        cycles = _cycles(n, edges)
        if len(cycles) == 1:
            o = tuple(cycles[0])
            return ExactRing(o, ring_cost(c, o), True, rounds, time.perf_counter() - t0)
        for cyc in cycles:
            s = sorted(cyc)
            prob += pulp.lpSum(x[i, j] for i, j in itertools.combinations(s, 2)) <= len(s) - 1
        patched = _patch(c, cycles)
        if best_tour is None or ring_cost(c, patched) < ring_cost(c, best_tour):
            best_tour = patched
    if best_tour is None:
        best_tour = list(range(n))
    return ExactRing(tuple(best_tour), ring_cost(c, best_tour), False, rounds,
                     time.perf_counter() - t0)
