"""Memory layout of one transformer block's tensors: an online caching allocator against an
offline plan (MEMO §6.4, papers.md §6), and the fragmentation between them.

A block's forward asks for tensors in order and frees them when their last reader is done
(:func:`block_requests`). Three ways to place them in one address range, each giving the peak
address used:

``online``
    What a caching allocator does without knowing the future: each request takes the smallest
    free gap that holds it (best fit), else grows the range; freed gaps merge with neighbours.
``planned``
    MEMO's substitute for its MIP: tensors by decreasing size × lifetime, each at the lowest
    offset that overlaps no placed tensor alive at the same time.
``optimal``
    The dynamic-storage-allocation MIP of §6.4 (offsets ``A_i``, ordering binaries ``z_ij`` for
    tensors alive together, minimise the peak ``M``) solved by CBC for small cases; its status
    and gap are reported.

The live-bytes maximum over time bounds every layout from below. ``fragmentation`` is a
layout's peak over that bound, minus one.

>>> reqs = [Request("a", 2, 0, 2), Request("b", 2, 0, 4), Request("c", 4, 2, 4)]
>>> live_peak(reqs), online_peak(reqs), planned_peak(reqs)    # a's gap is too small for c
(6, 8.0, 6.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.model.llm import activations as act
from planner.model.llm.spec import ModelSpec

__all__ = ["Request", "block_requests", "offload_requests", "live_peak", "online_peak",
           "planned_peak", "optimal_peak", "layout_report"]


@dataclass(frozen=True, slots=True)
class Request:
    """A tensor of ``size`` bytes alive over steps ``[start, end)`` of a pass."""

    name: str
    size: float
    start: int
    end: int


def _overlap(a: Request, b: Request) -> bool:
    return a.start < b.end and b.start < a.end


def live_peak(reqs: list[Request]) -> float:
    """The most bytes alive at one step (a lower bound on any layout's peak)."""
    steps = sorted({r.start for r in reqs})
    return max((sum(r.size for r in reqs if r.start <= t < r.end) for t in steps), default=0)


def online_peak(reqs: list[Request]) -> float:
    """Peak address of a best-fit allocator that serves requests in time order."""
    gaps: list[list[float]] = []              # free [offset, size], merged with neighbours
    top = 0.0
    placed: dict[str, tuple[float, float]] = {}
    events = sorted([(r.end, 0, r) for r in reqs] + [(r.start, 1, r) for r in reqs],
                    key=lambda e: (e[0], e[1]))
    for _, kind, r in events:
        if kind == 0:                          # frees first at the same step
            off, size = placed.pop(r.name)
            gaps.append([off, size])
            gaps = _merge(gaps)
            continue
        fit = [g for g in gaps if g[1] >= r.size]
        if fit:
            g = min(fit, key=lambda g: (g[1], g[0]))
            placed[r.name] = (g[0], r.size)
            g[0] += r.size
            g[1] -= r.size
            gaps = [x for x in gaps if x[1] > 0]
        else:
            placed[r.name] = (top, r.size)
            top += r.size
    return top


def _merge(gaps: list[list[float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for off, size in sorted(gaps):
        if out and abs(out[-1][0] + out[-1][1] - off) < 1e-9:
            out[-1][1] += size
        else:
            out.append([off, size])
    return out


def planned_peak(reqs: list[Request]) -> float:
    """Peak of the offline plan: decreasing size × lifetime, lowest non-overlapping offset."""
    order = sorted(reqs, key=lambda r: (-r.size * (r.end - r.start), r.name))
    placed: list[tuple[Request, float]] = []
    peak = 0.0
    for r in order:
        busy = sorted((off, off + p.size) for p, off in placed if _overlap(p, r))
        off = 0.0
        for lo, hi in busy:
            if off + r.size <= lo:
                break
            off = max(off, hi)
        placed.append((r, off))
        peak = max(peak, off + r.size)
    return peak


def optimal_peak(reqs: list[Request], *, time_limit_s: float = 10.0) -> dict:
    """The §6.4 MIP by CBC: ``{"peak", "status", "gap"}``. Status ``optimal`` when CBC proves
    it, else ``time limit`` with the best layout found (never worse than the planned one, whose
    peak is the big M) and its gap to the live-bytes bound."""
    import pulp                       # only here: simulating a step never solves the MIP

    from planner.lp import cbc, variable
    lp = pulp.LpProblem("dsa", pulp.LpMinimize)
    cap = planned_peak(reqs)          # the heuristic's layout bounds the optimum: the big M
    m = variable(lp, "M", 0, cap)
    a = {r.name: variable(lp, f"A_{i}", 0, cap) for i, r in enumerate(reqs)}
    lp += m
    for r in reqs:
        lp += a[r.name] + r.size <= m
    for i, x in enumerate(reqs):
        for j, y in enumerate(reqs[i + 1:], start=i + 1):
            if _overlap(x, y):
                z = variable(lp, f"z_{i}_{j}", 0, 1, cat="Binary")
                lp += a[x.name] + x.size <= a[y.name] + z * cap
                lp += a[y.name] + y.size <= a[x.name] + (1 - z) * cap
    lp += m >= live_peak(reqs)
    lp.solve(cbc(timeLimit=time_limit_s))
    bound = live_peak(reqs)
    best = pulp.value(m) if lp.sol_status in (pulp.LpSolutionOptimal,
                                               pulp.LpSolutionIntegerFeasible) else None
    best = cap if best is None else min(float(best), cap)
    # proven by CBC, or a layout that meets the live-bytes bound (nothing can do better)
    proven = lp.sol_status == pulp.LpSolutionOptimal or best <= bound * (1 + 1e-9)
    return {"peak": best, "status": "optimal" if proven else "time limit",
            "gap": 0.0 if proven else (best - bound) / best}


def block_requests(m: ModelSpec, *, seq: int, batch: int = 1, tp: int = 1, cp: int = 1,
                   precision: str = "bf16", sequence_parallel: bool = True) -> list[Request]:
    """The tensors one block's forward allocates, in order, with their lifetimes in steps: the
    tensors it keeps for its backward (:func:`~planner.model.llm.activations.block_terms`,
    alive to the end of the pass) and the transient outputs freed once read (the fused QKV
    output, the projections' outputs, the residual sums)."""
    keep = act.block_terms(m, seq=seq, batch=batch, tp=tp, cp=cp,
                           sequence_parallel=sequence_parallel, precision=precision)
    e = act.activation_bytes(precision)
    tokens = seq / cp * batch
    h = m.hidden_size
    res = tp if sequence_parallel and tp > 1 else 1
    qkv = e * tokens * (h / tp + 2 * act.kv_width_per_rank(m, tp))   # the fused QKV output
    order = [("norm1_input", 0), ("qkv_input", 1), ("qkv_out", 2), ("q", 3), ("k", 3),
             ("v", 3), ("attn_out", 4), ("proj_out", 5), ("norm2_input", 6), ("fc1_input", 7),
             ("fc1_output", 8), ("fc2_input", 9), ("fc2_out", 10), ("block_out", 11)]
    transient = {"qkv_out": (qkv, 4), "proj_out": (e * tokens * h / res, 7),
                 "fc2_out": (e * tokens * h / res, 12), "block_out": (e * tokens * h / res, 13)}
    end = 13
    reqs = []
    for name, t in order:
        if name in transient:
            size, last = transient[name]
            reqs.append(Request(name, size, t, last))
        elif keep.get(name, 0) > 0:
            reqs.append(Request(name, keep[name], t, end))
    return reqs


def offload_requests(m: ModelSpec, *, layers: int, alpha: float, seq: int, batch: int = 1,
                     tp: int = 1, cp: int = 1, precision: str = "bf16",
                     sequence_parallel: bool = True) -> list[Request]:
    """The forward of ``layers`` blocks under MEMO's token-wise swap: each block's requests
    (:func:`block_requests`) with its kept tensors split by token, the offloaded share (the block
    input and attention output whole, ``alpha`` of the others) alive until its copy to the host
    has drained two blocks later, the dropped share freed when the block ends; the last two
    blocks keep everything."""
    one = block_requests(m, seq=seq, batch=batch, tp=tp, cp=cp, precision=precision,
                         sequence_parallel=sequence_parallel)
    k = max(r.end for r in one)
    out = []
    for i in range(layers):
        base, last = i * k, i >= layers - 2
        for r in one:
            name = f"{r.name}/{i}"
            if r.end < k:                                       # transient
                out.append(Request(name, r.size, base + r.start, base + r.end))
            elif last:
                out.append(Request(name, r.size, base + r.start, layers * k))
            else:
                share = 1.0 if r.name in ("norm1_input", "attn_out") else alpha
                if share > 0:
                    out.append(Request(name + "/swap", r.size * share, base + r.start,
                                       base + 2 * k))
                if share < 1:
                    out.append(Request(name + "/drop", r.size * (1 - share), base + r.start,
                                       base + k))
    return out


def layout_report(reqs: list[Request], *, mip: bool = True) -> dict:
    """Peaks of the three layouts and their fragmentation over the live-bytes bound."""
    bound = live_peak(reqs)
    out = {"live_bytes": bound, "online_bytes": online_peak(reqs),
           "planned_bytes": planned_peak(reqs)}
    if mip:
        opt = optimal_peak(reqs)
        out |= {"optimal_bytes": opt["peak"], "mip_status": opt["status"], "mip_gap": opt["gap"],
                "planned_over_optimal": out["planned_bytes"] / opt["peak"] - 1}
    out["online_fragmentation"] = out["online_bytes"] / bound - 1
    out["planned_fragmentation"] = out["planned_bytes"] / bound - 1
    return out
