"""The worked examples in the sharding modules' docstrings."""

from __future__ import annotations

import doctest
import importlib

import pytest


@pytest.mark.parametrize("name", ["planner.sharding", "planner.model.tables.shards",
                                  "planner.model.tables.access", "planner.sharding.dle_pytorch",
                                  "planner.model.tables.trainer",
                                  "planner.sharding.best"])
def test_doctests(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_stages_implement_their_protocols():
    from planner.sharding import (
        ShardingTask,
        check_feasible,
        get_planner,
        load_model_spec,
        prepare,
        simulate_step,
        synthesize_tables,
    )
    from planner.sharding import protocols as p
    assert isinstance(load_model_spec, p.SpecLoader)
    assert isinstance(synthesize_tables, p.TableSource)
    assert isinstance(check_feasible, p.FeasibilityCheck)
    assert isinstance(simulate_step, p.StepSimulator)
    problem = prepare(ShardingTask(model=load_model_spec("criteo-dlrm")), 8)
    assert isinstance(problem.cost, p.ShardEstimator)
    assert all(isinstance(get_planner(n), p.Planner) for n in ("random", "size", "mip"))
