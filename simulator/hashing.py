"""Counter-based hashing: a deterministic pseudo-random integer for any tuple of integer keys.

Switches pick an ECMP path by hashing a flow's header; simulated variability picks a GPU's
speed from its position in the job. Both need draws that depend only on the keys (same keys,
same draw, whatever else is drawn), vectorised over millions of keys, which a sequential
random generator does not give. This is SplitMix64 (Steele, Lea and Flood, OOPSLA 2014; the
seeding function of Java's ``SplittableRandom`` and of xoshiro) folded over the keys.

>>> int(hash64(1, 2, 3)) == int(hash64(1, 2, 3)), int(hash64(1, 2, 3)) == int(hash64(1, 2, 4))
(True, False)
"""

from __future__ import annotations

import numpy as np

__all__ = ["hash64", "uniform"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: a bijection of uint64 that spreads every input bit."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash64(*keys) -> np.ndarray:
    """A uint64 per element of the broadcast integer ``keys`` (scalars or arrays; negative
    integers are taken modulo 2⁶⁴). Deterministic across runs and platforms."""
    arrays = np.broadcast_arrays(*[np.asarray(k, dtype=np.int64) for k in keys])
    h = np.zeros(arrays[0].shape, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in arrays:
            h = _mix(h + _GOLDEN + k.astype(np.uint64))
    return h


def uniform(*keys) -> np.ndarray:
    """A float in the open interval (0, 1) per element of the broadcast ``keys``: the top 53
    bits of :func:`hash64`, shifted off 0 by half a step (inverse CDFs stay finite)."""
    return ((hash64(*keys) >> np.uint64(11)).astype(np.float64) + 0.5) / float(2 ** 53)
