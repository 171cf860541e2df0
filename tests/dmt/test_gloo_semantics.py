"""Semantic preservation, run for real with gloo: 4 processes as 2 hosts of 2.

With identity tower modules every sample gets, through the SPTT route (cross-host peer
all-to-all, intra-host all-to-all, lookup, intra-host pooled exchange, cross-host return), the
pooled embeddings the flat route gives it; with a linear module, what the flat route followed by
the same per-tower module gives.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from planner.measure.dmt.check import SemanticCase, run_semantic_check  # noqa: E402

# rows, dim, mean pooling
TABLES = ((120, 8, 2.0), (64, 12, 1.0), (300, 16, 3.0), (50, 4, 1.5), (200, 8, 2.5),
          (90, 16, 1.0))
# flat over 4 ranks: TW, CW (2 blocks), RW over all 4 (TorchRec's even blocks), TW ...
FLAT = {0: [(0, 0, 0, 120, 8)], 1: [(1, 0, 0, 64, 4), (3, 0, 4, 64, 8)],
        2: [(0, 0, 0, 75, 16), (1, 75, 0, 75, 16), (2, 150, 0, 75, 16), (3, 225, 0, 75, 16)],
        3: [(2, 0, 0, 50, 4)], 4: [(3, 0, 0, 200, 8)], 5: [(1, 0, 0, 90, 16)]}
# towers: {0, 2, 5} on host 0 (ranks 0, 1), {1, 3, 4} on host 1 (ranks 2, 3)
TOWERS = (((0, 2, 5), 0), ((1, 3, 4), 1))
HOST = {0: [(0, 0, 0, 120, 8)], 2: [(0, 0, 0, 150, 16), (1, 150, 0, 150, 16)],
        5: [(0, 0, 0, 90, 8), (1, 0, 8, 90, 8)],
        1: [(3, 0, 0, 64, 12)], 3: [(2, 0, 0, 25, 4), (3, 25, 0, 25, 4)], 4: [(2, 0, 0, 200, 8)]}


def test_sptt_route_preserves_pooled_embeddings():
    """One spawn, per rank: flat; SPTT with identity modules; SPTT with linear modules (ratio 2)
    against the flat result through the same modules; and a backward pass through the flat and
    the identity SPTT route with the same upstream gradients (equal table gradients)."""
    case = SemanticCase(tables=TABLES, flat=FLAT, host_layouts=HOST, towers=TOWERS, world=4,
                        gpus_per_host=2, local_batch=16, seed=3,
                        modules=(("identity", 1.0), ("linear", 2.0)), gradients=True)
    out = run_semantic_check(case, timeout_s=150)
    dims = [d for _, d, _ in TABLES]
    # towers concatenate in tower order: reorder the flat columns the same way
    cols = np.concatenate([np.arange(sum(dims[:t]), sum(dims[:t + 1]))
                           for tabs, _ in TOWERS for t in tabs])
    for r, o in enumerate(out):
        assert o["flat"].shape == (16, sum(dims))
        assert np.abs(o["flat"]).sum() > 0
        ident, lin = o["sptt"]
        assert ident.shape == o["flat"].shape
        np.testing.assert_allclose(ident, o["flat"][:, cols], rtol=1e-6, atol=1e-6,
                                   err_msg=f"rank {r}")
        np.testing.assert_array_equal(o["ref"][0], o["flat"][:, cols])
        widths = [4 * -(-(-(-sum(dims[t] for t in tabs) // 2)) // 4) for tabs, _ in TOWERS]
        assert lin.shape == (16, sum(widths))
        np.testing.assert_allclose(lin, o["ref"][1], rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")
        # backward: the same upstream gradients give the same table gradients on both routes
        gf, gs = o["grad_flat"], o["grad_sptt"]
        assert gf.shape == (sum(rows * d for rows, d, _ in TABLES),) and np.abs(gf).sum() > 0
        np.testing.assert_allclose(gs, gf, rtol=1e-5, atol=1e-5, err_msg=f"rank {r}")
