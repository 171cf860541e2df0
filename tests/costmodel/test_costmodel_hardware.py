"""Cost-model weights are keyed by the hardware they were trained on: a plan for other devices
falls back to the analytic model, says so, and is never worse than greedy there."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simulator.errors import SpecError  # noqa: E402
from simulator.topology import load_topology  # noqa: E402

from planner.cli.main import main  # noqa: E402
from planner.costmodel.planner import NeuroShardPlanner  # noqa: E402
from planner.costmodel.weights import (  # noqa: E402
    HardwareMismatchWarning,
    device_kind,
    shipped_weights_path,
    weights_device,
    weights_for,
)
from planner.model.tables.generate import synthesize_tables  # noqa: E402
from planner.model.tables.spec import ModelSpec  # noqa: E402
from planner.model.tables.task import ShardingTask  # noqa: E402
from planner.sharding.planners import get_planner  # noqa: E402

TOPOLOGIES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "topologies")
                    .glob("*.yaml"))


@pytest.mark.parametrize("name,kind", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"),
    ("Some New Accelerator", "Some New Accelerator"), ("", "cpu")])
def test_device_kind_of_a_collection(name, kind):
    assert device_kind({"gpu": name} if name else {"cpu_model": "AMD EPYC"}) == kind


def test_shipped_weights_are_keyed_by_their_hardware():
    assert weights_device(shipped_weights_path()) == "cpu"
    assert weights_for("cpu") == shipped_weights_path()
    assert weights_for("h100-sxm") is None and weights_for("a100-80gb") is None


def _task(topology: str) -> ShardingTask:
    tables = tuple(replace(t, num_embeddings=min(t.num_embeddings, 2_000_000))
                   for t in synthesize_tables(24, seed=7))
    model = ModelSpec(name="t24", tables=tables, batch_size=16384, optimizer="sgd",
                      source="test")
    return ShardingTask(model=model, topology=topology)


@pytest.mark.parametrize("topology", [t for t in TOPOLOGIES if t != "localhost-gloo"])
def test_neuroshard_never_above_greedy_on_every_gpu_topology(topology):
    devices = min(8, load_topology(topology).num_gpus)
    task = _task(topology)
    greedy = get_planner("greedy").plan(task, devices, seed=0)
    with pytest.warns(HardwareMismatchWarning, match="no learned cost model"):
        plan = get_planner("neuroshard").plan(task, devices, seed=0)
    assert plan.valid and plan.planner == "neuroshard"
    assert plan.step_cost_s <= greedy.step_cost_s * (1 + 1e-12)
    assert "analytic cost model" in plan.stats.notes[0]


def test_cpu_weights_plan_cpu_tasks_without_fallback():
    task = _task("localhost-gloo:node.gpus=4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HardwareMismatchWarning)   # another CPU model only
        plan = get_planner("neuroshard", beam=0, refine=False).plan(task, 4, seed=0)
    assert any(n.startswith("learned cost") for n in plan.stats.notes)
    assert not any("analytic cost model" in n for n in plan.stats.notes)


def test_given_weights_of_other_hardware_fall_back_and_say_whose():
    with pytest.warns(HardwareMismatchWarning, match="trained on cpu"):
        plan = get_planner("neuroshard", weights=str(shipped_weights_path())).plan(
            _task("dgx-h100"), 8, seed=0)
    assert plan.valid


def test_no_fallback_is_a_spec_error():
    with pytest.raises(SpecError, match="no cost-model weights for h100-sxm"):
        NeuroShardPlanner().plan(_task("dgx-h100"), 8, seed=0)


def test_cli_prints_the_fallback_as_one_warning_line(capsys):
    assert main(["plan", "criteo-dlrm", "--devices", "8", "--planner", "neuroshard",
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert err.count("clusterplan: warning: neuroshard: no learned cost model for a100-80gb") == 1
    assert "Traceback" not in err and ".py:" not in err
