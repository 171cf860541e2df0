"""How much work NeuroShard's search may do within its time limit.

The search's stages stop on counts (shards placed by the grid searches, objective evaluations
of each local search) planned into the limit from what each cost on this project's host, not
on the clock, so a plan depends only on its inputs (the limit included); see
:mod:`planner.costmodel.planner`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Budget", "work_budget", "LEARNED_COST", "ANALYTIC_COST", "BUDGET_SHARE"]

#: seconds per shard a grid search places and per local-search evaluation (``a + b·tables``),
#: measured on the project's 2-core host over 8-96 tables and 2-8 ranks, planned about a third
#: above: with learned all-to-all nets for the rank count 0.15-0.19 ms per shard and
#: 0.2-0.45 ms per evaluation; with the analytic all-to-alls (no nets for that count)
#: 0.31-0.40 ms per shard and 0.3-0.4 ms + 12-17 µs per table
LEARNED_COST = (2.5e-4, 2.0e-4, 5.0e-6)
ANALYTIC_COST = (5.0e-4, 5.0e-4, 2.0e-5)
#: the budgets plan for this share of the time; the rest is margin for a slower or busier machine
BUDGET_SHARE = 0.5


def work_budget(limit_s: float, tables: int, *, learned_comm: bool, refine: bool = True
                ) -> tuple[int, int]:
    """``(shard placements for the grid and beam search, evaluations per local search)``
    planned into ``limit_s`` seconds for ``tables`` tables: the beam gets 75% of the time when
    the local search follows (two local searches share the rest), all of it otherwise;
    ``learned_comm``: the weights hold all-to-all nets for the rank count (cheaper to score)."""
    per_unit, eval_a, eval_b = LEARNED_COST if learned_comm else ANALYTIC_COST
    beam = 0.75 if refine else 1.0
    units = int(BUDGET_SHARE * beam * limit_s / per_unit)
    evals = int(BUDGET_SHARE * (1.0 - beam) * limit_s / 2 / (eval_a + eval_b * tables))
    return units, evals


@dataclass
class Budget:
    """The work one plan has left (:func:`work_budget`)."""

    units: int          # shard placements the grid searches may still make
    evals: int          # objective evaluations of each local search
