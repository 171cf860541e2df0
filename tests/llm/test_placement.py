"""Which parallel axes cross building boundaries, and how stages spread over buildings."""

import pytest

from simulator.topology import load_topology

from planner.llm.placement import crossing_axes, stages_per_building
from planner.model.llm.layout import Layout


@pytest.fixture(scope="module")
def four():
    topo = load_topology("four-buildings-h100:nodes=4")
    assert len({topo.devices[g]["building"] for g in topo.gpus}) == 4
    return topo


@pytest.mark.parametrize("order,pp,dp,axes,stages", [
    ("tp-cp-dp-pp", 4, 4, ["pp"], [1, 1, 1, 1]),          # one stage per building
    ("tp-cp-dp-pp", 2, 8, ["pp", "dp"], [1, 1, 1, 1]),    # mixed: each stage spans 2 buildings
    ("tp-cp-pp-dp", 2, 8, ["dp"], [2, 2, 2, 2]),          # whole pipelines per building
    ("tp-cp-pp-dp", 8, 2, ["dp", "pp"], [4, 4, 4, 4]),    # mixed: a pipeline spans 2 buildings
])
def test_crossing_axes_and_stage_split(four, order, pp, dp, axes, stages):
    gpus_per_building = four.num_gpus // 4
    lay = Layout(tp=8, cp=1, dp=dp, pp=pp, order=order)
    assert lay.world == four.num_gpus
    assert crossing_axes(lay, four) == axes
    assert stages_per_building(lay, four) == stages
    # cross-check "pp crosses" against the definition: a stage's successor in another building
    pp_crosses = any(lay.rank(pp=s) // gpus_per_building != lay.rank(pp=s + 1) // gpus_per_building
                     for s in range(pp - 1))
    assert ("pp" in axes) == pp_crosses


def test_single_building_has_no_crossing():
    topo = load_topology("h100-ib:nodes=4")
    assert crossing_axes(Layout(tp=8, cp=1, dp=2, pp=2), topo) == []
