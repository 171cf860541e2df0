"""The launcher files put every rank where the plan placed it."""

from __future__ import annotations

import json
import shlex

from export_plans import make_plan

from planner.export import export_plan
from planner.export.hostfile import placement_from_files


def _want(plan):
    return {e["rank"]: (f"n{e['host']}", e["gpu"]) for e in plan["ranks"]}


def test_contiguous_placement_has_torchrun_settings():
    plan = make_plan(tp=4, cp=2, dp=2)
    files = export_plan(plan, "hostfile")
    assert files["hostfile"] == "n0 slots=8\nn1 slots=8\n"
    assert placement_from_files(files) == _want(plan)
    assert placement_from_files({"rankfile": files["rankfile"]}) == _want(plan)
    rm = json.loads(files["rank_map.json"])
    assert rm["format"] == "clusterplan.rank-map" and rm["world_size"] == 16
    assert rm["torchrun_compatible"] is True
    line = shlex.split(files["torchrun_hosts.txt"], comments=True)
    assert line[:2] == ["n0", "NODE_RANK=0"]


def test_scattered_placement_uses_rankfile_only():
    # ranks alternate between two hosts: torchrun cannot express it, the MPI rankfile can
    plan = make_plan(tp=2, dp=8, place=lambda r: (r % 2, r // 2))
    files = export_plan(plan, "hostfile")
    assert "torchrun_hosts.txt" not in files
    assert json.loads(files["rank_map.json"])["torchrun_compatible"] is False
    assert placement_from_files(files) == _want(plan)
    assert files["rankfile"].splitlines()[:2] == ["rank 0=n0 slot=0", "rank 1=n1 slot=0"]


def test_permuted_gpus_within_host():
    # rank i on host i//8, GPU 7 - i%8: CUDA_VISIBLE_DEVICES carries the order
    plan = make_plan(tp=8, dp=2, place=lambda r: (r // 8, 7 - r % 8))
    files = export_plan(plan, "hostfile")
    assert "CUDA_VISIBLE_DEVICES=7,6,5,4,3,2,1,0" in files["torchrun_hosts.txt"]
    assert placement_from_files(files) == _want(plan)
