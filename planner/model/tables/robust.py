"""The expected step cost of a plan when its ranks' lookup times are off by the lookup model's
own error, for planners that should not trust the model closer than it was measured to be.

A plan that evens its ranks out fills each to the predicted maximum; the model's error per
configuration (10-12% MAPE on its own calibration sweep, not noise: the same shards err the
same way every step) then decides which rank is really slowest, and the more ranks sit near
the top, the further the measured maximum lands above the predicted one. With each rank's
lookups off by an unknown factor ``e^{σZ_r − σ²/2}`` (``Z_r`` independent standard normals, the
same for a rank's forward and backward; mean 1, so one rank's expected time is its
prediction), the expected step cost is ::

    E[ Σ_lookup phases  max_r  c_{k,r} · e^{σZ_r − σ²/2} ]  +  Σ_other phases  max_r  c_{k,r}

estimated on :data:`DRAWS` fixed antithetic draws (the same on every run, so a plan's score
depends only on the plan). ``σ`` comes from the lookup fit in use: ``σ = MAPE · √(π/2)``, the
log-normal scale whose mean absolute error is that MAPE (:func:`sigma_from_mape`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from planner.model.tables.features import BREAKDOWN_KEYS

__all__ = ["DRAWS", "LOOKUP_PHASES", "DEFAULT_SIGMA", "sigma_from_mape", "error_factors",
           "expected_step_cost"]

#: draws of the rank errors (half of them the negatives of the other half)
DRAWS = 128
#: the phases the lookup model's error applies to
LOOKUP_PHASES = ("lookup_fwd_s", "lookup_bwd_s")
#: σ when the lookups are priced from priors with no fit to measure their error by
DEFAULT_SIGMA = 0.15


def sigma_from_mape(mape: float | None) -> float:
    """The log-normal ``σ`` whose mean absolute relative error is ``mape`` (for small σ,
    ``E|e^{σZ} − 1| ≈ σ·√(2/π)``); :data:`DEFAULT_SIGMA` when there is no measured fit."""
    if mape is None or not math.isfinite(mape) or mape < 0:
        return DEFAULT_SIGMA
    return float(mape) * math.sqrt(math.pi / 2.0)


@functools.lru_cache(maxsize=64)
def _normals(n: int, draws: int) -> np.ndarray:
    half = np.random.default_rng(np.random.SeedSequence([n, draws, 0x0B57])).standard_normal(
        (draws // 2, n))
    return np.concatenate([half, -half])


def error_factors(n: int, sigma: float, draws: int = DRAWS) -> np.ndarray:
    """(draws, n) multiplicative errors of ``n`` ranks' lookups, mean 1 (module docstring)."""
    return np.exp(sigma * _normals(n, draws) - 0.5 * sigma * sigma)


def expected_step_cost(components, sigma: float, draws: int = DRAWS) -> np.ndarray | float:
    """Expected step cost, seconds, of plans whose per-rank components (``(..., ranks)`` each,
    :data:`~.features.BREAKDOWN_KEYS`) carry the lookup error ``sigma`` (module docstring);
    the step cost itself when ``sigma`` is 0."""
    total = 0.0
    f = None
    for k in BREAKDOWN_KEYS:
        if k not in components:
            continue
        c = np.asarray(components[k], dtype=float)
        if k in LOOKUP_PHASES and sigma > 0:
            if f is None:
                f = error_factors(c.shape[-1], sigma, draws)
            total = total + (c[..., None, :] * f).max(axis=-1).mean(axis=-1)
        else:
            total = total + c.max(axis=-1)
    return float(total) if np.ndim(total) == 0 else total
