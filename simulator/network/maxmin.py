"""Max-min fair rates by progressive filling over a sparse (flow × link) matrix.

All unfrozen flows grow at the same rate until some link saturates; the flows crossing it freeze
at that rate; repeat. With a coefficient ``a[f, l]`` (the fraction of flow ``f`` that crosses
link ``l``; ECMP splits and symmetry multiplicities make it differ from 1) a link saturates when
``Σ_f a[f, l] · rate[f] = capacity[l]``. Each round is two weighted bincounts, and the number of
rounds is the number of distinct bottleneck levels, so a million flows solve in well under a
second. Flows that cross no link get ``inf`` (they are limited by nothing in the network).
"""

from __future__ import annotations

import numpy as np

__all__ = ["maxmin_rates"]


def maxmin_rates(flow: np.ndarray, link: np.ndarray, coef: np.ndarray, capacity: np.ndarray,
                 n_flows: int, *, rel_tol: float = 1e-9) -> np.ndarray:
    """Max-min fair rate of each flow, in the unit of ``capacity`` (bytes/s).

    Parameters
    ----------
    flow, link, coef : arrays of equal length
        Coordinate form of the (flow × link) coefficient matrix.
    capacity : np.ndarray
        Capacity of every link id (only those referenced matter), bytes/s.
    n_flows : int
        Number of flows (rows); flows with no entry get ``inf``.

    Examples
    --------
    Two flows sharing one 10 B/s link, one of them also crossing a 2 B/s link:

    >>> maxmin_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), np.ones(3),
    ...              np.array([10.0, 2.0]), 2).tolist()
    [8.0, 2.0]
    """
    rates = np.full(n_flows, np.inf)
    if flow.size == 0:
        return rates
    used, lidx = np.unique(link, return_inverse=True)     # the links in use, not the fabric's
    lidx = lidx.ravel()
    cap = capacity[used].astype(float)
    coef = coef.astype(float)
    nl = used.size
    active = np.bincount(flow, minlength=n_flows) > 0
    rates[active] = 0.0
    load = np.zeros(nl)
    while True:
        act_e = active[flow]
        if not act_e.any():
            break
        w = np.bincount(lidx[act_e], weights=coef[act_e], minlength=nl)
        valid = w > 0
        level = np.full(nl, np.inf)
        level[valid] = np.maximum(cap[valid] - load[valid], 0.0) / w[valid]
        t = level.min()
        sat = valid & (level <= t * (1 + rel_tol) + 1e-300)
        hit_e = act_e & sat[lidx]
        hit = np.zeros(n_flows, dtype=bool)
        hit[flow[hit_e]] = True
        rates[hit] = t
        active &= ~hit
        # links carry the frozen flows' rates from now on
        fe = hit[flow]
        load += np.bincount(lidx[fe], weights=coef[fe] * t, minlength=nl)
    return rates
