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

from planner.measure.tables.measurement import COMM_KEYS, LOOKUP_KEYS
from planner.model.tables.features import step_cost_of

__all__ = ["step_ratio_interval"]


def _arrays(m, key: str, length: int) -> np.ndarray | None:
    """``(ranks, length)`` samples of ``key`` (a rank without any: zeros); None when the
    measurement kept none of that length."""
    per_rank = m.samples_s.get(key)
    if per_rank is None or any(xs and len(xs) != length for xs in per_rank):
        return None
    out = np.zeros((m.devices, length))
    for r, xs in enumerate(per_rank):
        if xs:
            out[r] = xs
    return out


def _length(a, b, keys) -> int:
    """The common number of samples of ``keys`` in both measurements (0: none)."""
    lens = {len(xs) for m in (a, b) for k in keys for xs in m.samples_s.get(k, []) if xs}
    return lens.pop() if len(lens) == 1 else 0


def _costs(m, idx: dict[str, np.ndarray]) -> np.ndarray | None:
    """Step cost per bootstrap draw (:func:`step_cost_of` of each key's resampled medians);
    None when a key that cost time has no samples to resample."""
    comps = {}
    for key, x in m.measured_s.items():
        if not any(x):
            continue
        sel = idx["lookup" if key in LOOKUP_KEYS else "comm"]
        arr = _arrays(m, key, sel.shape[1])
        if arr is None or sel.size == 0:
            return None
        comps[key] = np.median(arr[:, sel], axis=-1).T          # (draws, ranks)
    return np.asarray(step_cost_of(comps)) if comps else None


def step_ratio_interval(a, b, *, level: float = 0.95, draws: int = 2000,
                        seed: int = 0) -> tuple[float, float] | None:
    """Paired-bootstrap interval (``level``, percentile) of ``a``'s step cost over ``b``'s,
    two :class:`~.plans.Measurement` of one :func:`~.plans.measure_many` call; None when
    either lacks the samples (plans measured one after another, or a different count)."""
    if a.devices != b.devices:
        raise ValueError("two measurements of different device counts are not paired")
    n_look = _length(a, b, LOOKUP_KEYS)
    n_comm = _length(a, b, COMM_KEYS)
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
