"""Stragglers, failures and restarts: what they cost a synchronous training job.

* **Stragglers** are per-rank compute slowdown factors (``simulate(..., slowdown=...)``); a
  synchronous step waits for the slowest rank on its critical path.
* **Link faults** scale a link's capacity from a moment on (``simulate(..., link_faults=...)``):
  flows in flight are re-rated, so a collective that used the link slows and others do not.
* **Failures and restarts** follow MegaScale's *effective training time ratio* (ETTR): productive
  training time over wall time. With GPU failures arriving as a Poisson process (rate
  ``gpus / MTBF``), checkpoints of cost ``C`` every ``τ`` seconds of work and a restart of ``R``
  seconds (reschedule, reload, warm up), the expected wall time to finish one checkpointed
  segment is Daly's (2006) exact expression ``e^{λR} (e^{λ(τ + C)} − 1) / λ``, so
  ``ETTR = τ / that``. The interval that maximises it is close to Young/Daly's ``√(2C/λ)``.
  :func:`simulate_failures` draws the same process event by event (seeded) to check it.
* **Diagnosis**: :func:`find_stragglers` names the ranks whose busy time stands out from the rest
  (robust z-score on the median absolute deviation), as MegaScale's per-rank heat map does;
  :func:`find_hot_links` does the same for links against the others of their tier and kind.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from simulator.errors import SpecError
from simulator.units import parse_time

__all__ = ["parse_stragglers", "LinkFault", "parse_link_faults", "Reliability", "ettr",
           "optimal_checkpoint_interval", "simulate_failures", "find_stragglers",
           "find_hot_links"]


def parse_stragglers(items: Iterable[str], num_gpus: int, *, source: str = "--straggler"
                     ) -> dict[int, float]:
    """``["17=1.1", "300=1.25"]`` → ``{17: 1.1, 300: 1.25}`` (rank → compute slowdown ≥ 1)."""
    out: dict[int, float] = {}
    for item in items:
        rank, eq, factor = str(item).partition("=")
        try:
            r, f = int(rank), float(factor)
        except ValueError:
            raise SpecError(f"{item!r} is not RANK=FACTOR", source=source,
                            fix="write e.g. --straggler 17=1.1 (rank 17 computes 10% slower)") from None
        if not eq or not 0 <= r < num_gpus:
            raise SpecError(f"rank {rank} is outside 0..{num_gpus - 1}", source=source,
                            field="rank", fix=f"use a rank below {num_gpus}")
        if not (math.isfinite(f) and f >= 1.0):
            raise SpecError(f"slowdown {factor} for rank {r} must be a finite factor ≥ 1",
                            source=source, field="factor",
                            fix="1.1 means 10% slower; use 1 for a healthy rank")
        out[r] = f
    return out


@dataclass(frozen=True, slots=True)
class LinkFault:
    """From ``at_s`` seconds into the step, ``links`` carry ``factor`` of their capacity.

    Links are bundles (a leaf's uplinks to a spine are one bundle): losing ``k`` of its ``n``
    cables is ``factor = (n − k)/n``, the rest carrying the rerouted traffic as ECMP does; a
    flaky or lossy link is a factor below 1 too. ``label`` is what the user wrote."""

    links: tuple[int, ...]
    factor: float
    at_s: float = 0.0
    label: str = ""


#: the least capacity a faulty link keeps: one cable of a 10,000-cable bundle (below it a step
#: would be quoted in centuries)
MIN_LINK_FACTOR = 1e-4


def parse_link_faults(items: Iterable[str], topo, *, source: str = "--link-fault"
                      ) -> list[LinkFault]:
    """``['leaf0/rail0->spine0=0.5@2ms', 'n3/nic*<->*=0.25']`` → :class:`LinkFault` s.

    ``SRC->DST`` names links by their end nodes (shell-style wildcards allowed), ``<->`` both
    directions; ``=FACTOR`` the capacity kept, in [:data:`MIN_LINK_FACTOR`, 1]; ``@TIME`` when it happens (default 0).
    ``clusterplan topology show NAME --json`` lists the node names.
    """
    lt = topo.links
    names = [f"{a}->{b}" for a, b in zip(lt.src, lt.dst)]
    out: list[LinkFault] = []
    for item in items:
        spec, eq, rest = str(item).rpartition("=")
        factor_s, _, at = rest.partition("@")
        if not eq or ("->" not in spec):
            raise SpecError(f"{item!r} is not SRC->DST=FACTOR[@TIME]", source=source,
                            fix="write e.g. --link-fault 'leaf0/rail0->spine0=0.5@10ms'")
        try:
            factor = float(factor_s)
        except ValueError:
            raise SpecError(f"factor {factor_s!r} in {item!r} is not a number", source=source,
                            field="factor", fix="0.5 keeps half the capacity") from None
        if not (MIN_LINK_FACTOR <= factor <= 1):
            raise SpecError(f"factor {factor} in {item!r} must be in [{MIN_LINK_FACTOR:g}, 1]",
                            source=source, field="factor",
                            fix="a bundle keeping k of n cables has factor k/n; a link with "
                                "no path around it cannot fail entirely in this model")
        at_s = parse_time(at, field=source) if at else 0.0
        if at_s < 0:
            raise SpecError(f"time {at} in {item!r} is negative", source=source, field="time",
                            fix="give a time from the start of the step, e.g. @5ms")
        both = "<->" in spec
        a, b = spec.split("<->" if both else "->", 1)
        pats = [f"{a}->{b}"] + ([f"{b}->{a}"] if both else [])
        links = tuple(i for i, nm in enumerate(names) if any(fnmatch.fnmatchcase(nm, p)
                                                              for p in pats))
        if not links:
            sample = ", ".join(names[i] for i in range(0, len(names), max(1, len(names) // 4)))
            raise SpecError(f"no link of {topo.name} matches {spec!r}", source=source,
                            field="link", fix=f"name links as SRC->DST, e.g. {sample}")
        out.append(LinkFault(links, factor, at_s, str(item)))
    return out


@dataclass(frozen=True, slots=True)
class Reliability:
    """Failure and checkpoint inputs, seconds.

    ``mtbf_gpu_s``: mean time between failures of one GPU (with its share of host, NIC and
    software faults). ``checkpoint_interval_s``: training time between checkpoints.
    ``checkpoint_cost_s``: stall to write one. ``restart_s``: from failure to training again.
    """

    mtbf_gpu_s: float
    checkpoint_interval_s: float
    checkpoint_cost_s: float = 0.0
    restart_s: float = 600.0

    def __post_init__(self) -> None:
        for k in ("mtbf_gpu_s", "checkpoint_interval_s"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v > 0):
                raise SpecError(f"{k} must be positive seconds, got {v!r}", field=k,
                                fix="give a time such as 30min or 5e6s")
        for k in ("checkpoint_cost_s", "restart_s"):
            v = getattr(self, k)
            if not (math.isfinite(v) and v >= 0):
                raise SpecError(f"{k} must be non-negative seconds, got {v!r}", field=k,
                                fix="give a time such as 20s")

    @classmethod
    def parse(cls, *, mtbf: str, interval: str, cost: str = "0s", restart: str = "10min"
              ) -> "Reliability":
        """From the command line's strings; errors name the flag."""
        flags = {"mtbf_gpu_s": "--mtbf", "checkpoint_interval_s": "--checkpoint-every",
                 "checkpoint_cost_s": "--checkpoint-cost", "restart_s": "--restart"}
        values = [parse_time(v, field=f) for v, f in
                  zip((mtbf, interval, cost, restart), flags.values())]
        try:
            return cls(*values)
        except SpecError as e:
            flag = flags.get(e.field or "", e.field)
            raise SpecError(e.message.replace(e.field or "", flag or ""), field=flag,
                            fix=e.fix) from None


def ettr(gpus: int, rel: Reliability) -> float:
    """Expected productive / wall time for ``gpus`` GPUs (Daly's exact renewal expression)."""
    lam = gpus / rel.mtbf_gpu_s
    tau, c, r = rel.checkpoint_interval_s, rel.checkpoint_cost_s, rel.restart_s
    x = lam * (tau + c)
    # in logs: a job failing far more often than it checkpoints has e^{λ(τ+C)} past any float
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 30 else math.log(math.expm1(x))
    log_wall = lam * r + log_expm1 - math.log(lam)
    return math.exp(math.log(tau) - log_wall)


def optimal_checkpoint_interval(gpus: int, rel: Reliability) -> float:
    """Interval maximising :func:`ettr` (golden-section search around Young/Daly's √(2C/λ))."""
    lam = gpus / rel.mtbf_gpu_s
    guess = math.sqrt(2 * max(rel.checkpoint_cost_s, 1e-9) / lam)
    lo, hi = guess / 20, guess * 20
    f = lambda t: -ettr(gpus, Reliability(rel.mtbf_gpu_s, t, rel.checkpoint_cost_s,  # noqa: E731
                                          rel.restart_s))
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(100):
        if f(c) < f(d):
            b, d = d, c
            c = b - g * (b - a)
        else:
            a, c = c, d
            d = a + g * (b - a)
    return (a + b) / 2


def simulate_failures(gpus: int, rel: Reliability, *, work_s: float, seed: int = 0) -> dict:
    """Run ``work_s`` seconds of training through seeded Poisson failures, event by event.

    Returns wall time, failures, time lost to re-done work, restarts and checkpoint stalls,
    and the realised ETTR. A failure during a restart restarts the restart.
    """
    if not (work_s > 0 and math.isfinite(work_s)):
        raise SpecError(f"work_s must be positive, got {work_s!r}", field="work_s",
                        fix="give the training time to simulate in seconds")
    rng = np.random.default_rng(seed)
    lam = gpus / rel.mtbf_gpu_s
    tau, c, r = rel.checkpoint_interval_s, rel.checkpoint_cost_s, rel.restart_s
    wall = done = lost = restarting = stalls = 0.0
    failures = 0
    next_fail = rng.exponential(1 / lam)
    while done < work_s - 1e-9:
        seg = min(tau, work_s - done)
        need = seg + (c if done + seg < work_s - 1e-9 else 0.0)
        if wall + need <= next_fail:
            wall += need
            done += seg
            stalls += need - seg
            continue
        failures += 1
        lost += next_fail - wall
        wall = next_fail
        while True:                       # restart, itself interruptible
            next_fail = wall + rng.exponential(1 / lam)
            if wall + r <= next_fail:
                wall += r
                restarting += r
                break
            failures += 1
            restarting += next_fail - wall
            wall = next_fail
    return {"wall_s": wall, "work_s": work_s, "failures": failures, "lost_work_s": lost,
            "restart_s": restarting, "checkpoint_stall_s": stalls, "ettr": work_s / wall}


def find_stragglers(busy_s: Mapping[int, float], *, min_excess: float = 0.02,
                    z: float = 3.5) -> list[dict]:
    """Ranks whose busy time stands out: ``busy / median − 1 ≥ min_excess`` and a robust
    z-score (0.6745·(x − median)/MAD) ≥ ``z``; slowest first. ``busy_s``: rank → seconds."""
    if not busy_s:
        return []
    ranks = np.fromiter(busy_s.keys(), dtype=np.int64)
    x = np.fromiter(busy_s.values(), dtype=float)
    med = float(np.median(x))
    if med <= 0:
        return []
    mad = float(np.median(np.abs(x - med)))
    # identical healthy ranks give MAD 0: fall back to a tiny fraction of the median
    scale = mad if mad > 0 else 1e-6 * med
    score = 0.6745 * (x - med) / scale
    excess = x / med - 1
    hit = np.nonzero((excess >= min_excess) & (score >= z))[0]
    order = hit[np.argsort(-x[hit], kind="stable")]
    return [{"rank": int(ranks[i]), "busy_s": float(x[i]), "median_s": med,
             "slowdown": float(x[i] / med)} for i in order]


def find_hot_links(topo, busy_s, *, min_excess: float = 0.2, z: float = 3.5,
                   top: int = 5) -> list[dict]:
    """Links busy far longer than the other links of their tier and kind that carried traffic:
    a degraded link moves the same bytes as its peers in more seconds. ``busy_s`` per link
    (``SimResult.link_busy_s``); slowest first, at most ``top``."""
    if busy_s is None:
        return []
    lt = topo.links
    busy = np.asarray(busy_s, dtype=float)
    groups: dict[tuple, list[int]] = {}
    for i in np.flatnonzero(busy > 0):
        groups.setdefault((lt.tier[i], lt.kind[i]), []).append(int(i))
    out = []
    for (tier, kind), idx in groups.items():
        if len(idx) < 3:
            continue
        found = find_stragglers({i: busy[i] for i in idx}, min_excess=min_excess, z=z)
        out += [{"link": f"{lt.src[f['rank']]}->{lt.dst[f['rank']]}", "tier": tier, "kind": kind,
                 "busy_s": f["busy_s"], "median_s": f["median_s"], "ratio": f["slowdown"]}
                for f in found]
    out.sort(key=lambda d: -d["ratio"])
    return out[:top]
