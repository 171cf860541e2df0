"""Plans of one table set trained side by side, steps interleaved
(``planner/measure/validate/dlrm_interleave.py``, ``validate unseen --plan-order
interleaved``): each plan trains exactly as it does alone (same losses, same calls, checked
against the simulator's step), and its turns of steps (blocks) alternate with the other plans'
turns."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrec")

from planner.measure.validate.dlrm import load_dlrm_config  # noqa: E402
from planner.measure.validate.dlrm_interleave import (InterleavedRunConfig,  # noqa: E402
                                                      interleaved_steps, split_result)
from planner.measure.validate.dlrm_report import validate_dlrm  # noqa: E402
from planner.measure.validate.runner import Pool  # noqa: E402
from planner.measure.validate.unseen_family import unseen_cases, write_case  # noqa: E402

STEPS, WARMUP = 3, 1


def _one_set():
    """The first 2-rank set of a small seeded family, with every plan kind it has."""
    cases = unseen_cases(6, seed=23, max_lookups=100_000, max_bytes=32 * 2 ** 20)
    first = next(c.model.name for c in cases if c.ranks == 2)
    return [c for c in cases if c.model.name == first]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interleave")
    cases = _one_set()
    assert len(cases) >= 3
    cfgs = [load_dlrm_config(str(write_case(c, tmp)), nproc=c.ranks, steps=STEPS,
                             warmup=WARMUP, timeout_s=60.0) for c in cases]
    # the last plan measures one step more: plans of one run may differ in steps
    cfgs[-1] = load_dlrm_config(str(write_case(cases[-1], tmp)), nproc=2, steps=STEPS + 1,
                                warmup=WARMUP, timeout_s=60.0)
    # the first plan takes two steps a turn, the others one
    together = InterleavedRunConfig(plans=tuple(cfgs), blocks=(2,) + (1,) * (len(cfgs) - 1))
    with Pool(2) as pool:
        alone = [pool.run(c) for c in cfgs]
        side_by_side = split_result(together, pool.run(together))
    return cfgs, alone, side_by_side, together.blocks


def test_each_plan_trains_as_it_does_alone(runs):
    """Same losses step by step on every rank (the models, batches and seeds are the plan's
    own, whatever else is in the process), and the same calls, matching the simulator's."""
    cfgs, alone, together, _ = runs
    for cfg, a, b in zip(cfgs, alone, together):
        d = validate_dlrm(cfg, result=b)
        assert d["structure"]["match"], d["structure"]["first_mismatch"]["text"]
        assert d["structure"]["steps_checked"] == cfg.steps
        for ra, rb in zip(a.ranks, b.ranks):
            assert len(rb["losses"]) == cfg.warmup + cfg.steps
            assert rb["losses"] == pytest.approx(ra["losses"], rel=1e-6)
            # the steps' calls (TorchRec checks its collectives once per process, at the
            # first model's build, so the calls before step 0 differ)
            assert [e[:5] for e in rb["events"] if e[0] >= 0] == \
                [e[:5] for e in ra["events"] if e[0] >= 0]


def test_turns_alternate_between_the_plans(runs):
    """On every rank, each step starts after the one before it in :func:`interleaved_steps`'
    order has ended (a turn of the first plan's two steps, then one of each other plan's,
    ...): the run's order is that."""
    cfgs, _, together, blocks = runs
    order = interleaved_steps(cfgs, blocks)
    assert order[:3] == [(0, 0), (0, 1), (1, 0)]
    for rank in range(2):
        spans = {(i, s): (t0, t1) for i, res in enumerate(together)
                 for s, t0, t1 in res.ranks[rank]["steps"]}
        assert sorted(spans) == sorted(order)
        starts = [spans[key][0] for key in order]
        assert starts == sorted(starts)
        assert all(spans[a][1] <= spans[b][0] for a, b in zip(order, order[1:]))


def test_plans_of_other_worlds_are_refused(tmp_path):
    cases = unseen_cases(6, seed=23, max_lookups=100_000, max_bytes=32 * 2 ** 20)
    two = next(c for c in cases if c.ranks == 2)
    four = next(c for c in cases if c.ranks == 4)
    cfgs = tuple(load_dlrm_config(str(write_case(c, tmp_path)), nproc=c.ranks, steps=1,
                                  warmup=0) for c in (two, four))
    with pytest.raises(ValueError, match="differ in world"):
        InterleavedRunConfig(plans=cfgs)
    with pytest.raises(ValueError, match="blocks"):
        InterleavedRunConfig(plans=cfgs[:1], blocks=(0,))
    with pytest.raises(ValueError, match="blocks"):
        InterleavedRunConfig(plans=cfgs[:1], blocks=(1, 1))


def test_interleave_doctests():
    import doctest

    from planner.measure.validate import dlrm_interleave
    assert doctest.testmod(dlrm_interleave).failed == 0
