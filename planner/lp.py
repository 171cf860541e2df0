"""The MIP solver every planner uses: PuLP models solved by CBC.

PuLP 3.3 deprecates two things its 4.0 removes: constructing ``LpVariable`` directly (variables
are created by the problem, :func:`variable`) and the bundled ``PULP_CBC_CMD`` (4.0 wants a CBC
binary, e.g. ``pip install pulp[cbc]``, run through ``COIN_CMD``). The project pins PuLP below
4.0 and asks for the bundled CBC here, in one place, falling back to ``COIN_CMD`` (a ``cbc`` on
PATH) where the bundled one is missing.
"""

from __future__ import annotations

import warnings

import pulp

__all__ = ["variable", "cbc"]


def variable(lp: pulp.LpProblem, name: str, low: float | None = None, up: float | None = None,
             cat: str = "Continuous") -> pulp.LpVariable:
    """A variable of ``lp`` (PuLP ≥ 3.3 attaches it to the problem; older PuLP does not need to)."""
    if hasattr(lp, "add_variable"):
        return lp.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, low, up, cat=cat)


def cbc(**options) -> pulp.LpSolver:
    """CBC with ``options`` (``msg``, ``timeLimit``, ``warmStart``, ``options``…): PuLP's
    bundled binary, or a ``cbc`` on PATH when the bundled one is gone.

    Pass no ``threads``: CBC without it searches serially, while the bundled binary given
    ``threads 1`` took its threaded path and stalled exactly 10 s on 4-12% of solves of a
    10-city ring model whose search itself took milliseconds (2026-11-29, this project's 2-core
    VM: 0 of 100 without the option), the same solutions either way."""
    options.setdefault("msg", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)      # see the module docstring
        try:
            solver = pulp.PULP_CBC_CMD(**options)
            if solver.available():
                return solver
        except Exception:  # noqa: BLE001 - PuLP 4 has no PULP_CBC_CMD
            pass
        return pulp.COIN_CMD(**options)
