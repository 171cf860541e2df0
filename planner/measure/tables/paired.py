"""How sure a paired measurement is that one plan is faster than another.

:func:`~.plans.measure_many` times several plans of one task *paired*: kernel iteration ``k``
of every plan's ranks runs back to back, and round ``j`` of every plan's collectives too, so
load from other processes hits the plans alike at each index. :func:`step_ratio_interval`
resamples those indices (the same draw for both plans: a paired bootstrap) and recomputes
each plan's step cost (per phase the slowest rank's median, summed), giving an interval for
the ratio of the two step costs. An interval that holds 1 says the two plans are not told
apart at this noise; TorchRec's plan measured twice in one run is the check of the method
(its interval should hold 1 about as often as ``level`` says).

What it cannot see: drift slower than one measurement (every index of one plan shifted
alike) and the choice of ids; both are the same for the plans of one task. With few samples
a bootstrap of medians is coarse and its interval too narrow: at 7 repeats TorchRec's plan
against itself excluded 1 on 4 of 79 tasks (2026-11-28), at 3 (``--quick``) on 2 of 4.
"""

from __future__ import annotations

import numpy as np

from planner.model.tables.cost import BREAKDOWN_KEYS

__all__ = ["step_ratio_interval"]

_LOOKUP = ("lookup_fwd_s", "lookup_bwd_s")


def _arrays(m, key: str, length: int) -> np.ndarray | None:
    """``(ranks, length)`` samples of ``key`` (a rank without any: zeros); None when the
    measurement has a nonzero median there but no samples."""
    per_rank = m.samples_s.get(key)
    if per_rank is None:
        return None if any(m.measured_s.get(key, [0.0])) else np.zeros((m.devices, length))
    out = np.zeros((m.devices, length))
    for r, xs in enumerate(per_rank):
        if len(xs) == length:
            out[r] = xs
        elif xs:
            return None
    return out


def _length(a, b, keys) -> int:
    """The common number of samples of ``keys`` in both measurements (0: none)."""
    lens = {len(xs) for m in (a, b) for k in keys for xs in m.samples_s.get(k, []) if xs}
    return lens.pop() if len(lens) == 1 else 0


def _costs(m, idx: dict[str, np.ndarray]) -> np.ndarray | None:
    """Step cost per bootstrap draw: per key the slowest rank's median, summed."""
    total = 0.0
    for key in BREAKDOWN_KEYS:
        sel = idx["lookup" if key in _LOOKUP else "comm"]
        x = _arrays(m, key, sel.shape[1]) if sel.size else None
        if x is None:
            if sel.size == 0 and not any(m.measured_s.get(key, [0.0])):
                continue
            return None
        total = total + np.median(x[:, sel], axis=-1).max(axis=0)
    return np.asarray(total)


def step_ratio_interval(a, b, *, level: float = 0.95, draws: int = 2000,
                        seed: int = 0) -> tuple[float, float] | None:
    """Paired-bootstrap interval (``level``, percentile) of ``a``'s step cost over ``b``'s,
    two :class:`~.plans.Measurement` of one :func:`~.plans.measure_many` call; None when
    either lacks the samples (plans measured one after another, or a different count)."""
    if a.devices != b.devices:
        raise ValueError("two measurements of different device counts are not paired")
    n_look = _length(a, b, _LOOKUP)
    n_comm = _length(a, b, [k for k in BREAKDOWN_KEYS if k not in _LOOKUP])
    if n_look == 0:
        return None
    rng = np.random.default_rng(seed)
    idx = {"lookup": rng.integers(0, n_look, size=(draws, n_look)),
           "comm": rng.integers(0, n_comm, size=(draws, n_comm)) if n_comm
           else np.zeros((draws, 0), dtype=int)}
    ca, cb = _costs(a, idx), _costs(b, idx)
    if ca is None or cb is None:
        return None
    q = (1.0 - level) / 2.0
    lo, hi = np.quantile(ca / cb, [q, 1.0 - q])
    return float(lo), float(hi)
