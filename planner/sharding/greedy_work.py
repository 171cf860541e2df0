"""The work a greedy run may spend (:class:`Work`), counted in rank evaluations so that a
time limit becomes a budget that depends on the inputs and the limit alone, never on the
machine's speed; :mod:`planner.sharding.greedy` spends it and the MIP planner's warm start
shares it."""

from __future__ import annotations

__all__ = ["Work", "SHORTLIST", "CALL_EVALS"]

#: what one pricing of candidate plans costs beyond its ranks, in rank evaluations (measured
#: on the 2-core CI machine: ~100 µs a call, ~0.17 µs a rank)
CALL_EVALS = 600
#: ranks scored per unit: with more ranks that have room, the ones with the lowest cost now
#: (scoring all is O(ranks²) per unit: 3.4 s for 300 tables on 256 ranks, 0.5 s with 32)
SHORTLIST = 32


class Work:
    """Rank evaluations a greedy run may still spend (None: no limit): pricing a candidate
    plan of ``n`` ranks spends ``n``. Greedy narrows its shortlist, and drops its second
    rule, to stay within it, so a short time limit gives a plan that depends on the inputs
    and the limit alone, never on the machine's speed."""

    def __init__(self, budget: float | None = None) -> None:
        self.left = None if budget is None else float(budget)
        self.spent = 0.0

    def spend(self, evals: float, calls: int = 1) -> None:
        """Charge ``evals`` rank evaluations made in ``calls`` pricings (each costs about
        :data:`CALL_EVALS` evaluations more, whatever its size)."""
        evals += calls * CALL_EVALS
        self.spent += evals
        if self.left is not None:
            self.left -= evals

    def shortlist(self, fixed: float, units: int, n: int) -> int:
        """Ranks to score per unit (1 … :data:`SHORTLIST`) so that ``units`` units of ``n``
        ranks fit what is left after ``fixed`` evaluations."""
        if self.left is None:
            return SHORTLIST
        left = self.left - fixed - units * 2 * CALL_EVALS
        return int(min(SHORTLIST, max(1, left // max(1, units * n))))
