"""Each trainer export read by the trainer's own code (``pip install '.[trainers]'``): Megatron
Core's ``TransformerConfig`` (its ``__post_init__`` checks the parallel layout), torchtitan's
``ParallelismConfig`` through tyro (the parser torchtitan's ``ConfigManager`` runs on the
``--parallelism.*`` overrides), DeepSpeed's ``DeepSpeedConfig`` (its batch and ZeRO checks).
Each test skips, saying which package is missing, where the tool is not installed."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from export_plans import make_plan  # noqa: E402

from planner.export.deepspeed import export_deepspeed  # noqa: E402
from planner.export.megatron import export_megatron  # noqa: E402
from planner.export.torchtitan import export_torchtitan  # noqa: E402

HINT = "not installed: pip install '.[trainers]'"
LAYOUTS = [dict(tp=8, pp=1, dp=2), dict(tp=4, pp=4, vpp=2, dp=2), dict(tp=2, cp=2, pp=2, dp=2),
           dict(tp=1, pp=1, dp=16, fsdp="zero3")]


def _flags(text: str) -> dict[str, object]:
    """Megatron arguments (one flag per line) as ``field_name → value`` (True for a switch)."""
    out: dict[str, object] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        flag, *value = shlex.split(line)
        key = flag.lstrip("-").replace("-", "_")
        out[key] = int(value[0]) if value and value[0].isdigit() else (value[0] if value else True)
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_megatron_core_accepts_the_parallel_layout(layout):
    pytest.importorskip("megatron.core", reason=f"megatron-core {HINT}")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig
    plan = make_plan(**layout)
    flags = _flags(export_megatron(plan, num_layers=32, seq_len=8192)["megatron.args"])
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    parallel = {"tensor_model_parallel_size", "pipeline_model_parallel_size",
                "context_parallel_size"}
    assert parallel <= flags.keys() <= flags.keys() | fields
    assert parallel <= fields, "Megatron Core renamed a parallelism field we write"
    kw = {k: v for k, v in flags.items() if k in fields}
    if "num_layers_per_virtual_pipeline_stage" in flags:         # a training flag: vpp from it
        per_stage = 32 // kw["pipeline_model_parallel_size"]
        kw["virtual_pipeline_model_parallel_size"] = \
            per_stage // flags["num_layers_per_virtual_pipeline_stage"]
    cfg = TransformerConfig(hidden_size=8192, num_attention_heads=64,
                            pipeline_dtype=torch.bfloat16, **kw)
    p = plan["parallel"]
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size,
            cfg.context_parallel_size) == (p["tp"], p["pp"], p["cp"])
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == p["vpp"]
    assert cfg.sequence_parallel == (p["tp"] > 1)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_torchtitan_reads_every_setting_from_the_overrides(layout):
    """The overrides after --module/--config parsed as torchtitan 0.3.0's ConfigManager parses
    them (tyro, its registry) into its training and parallelism sections; then the start-up
    checks of its Trainer.Config on batch, micro-batch and CUDA graphs."""
    pytest.importorskip("tyro", reason=f"tyro (torchtitan's parser) {HINT}")
    configs = pytest.importorskip("torchtitan.config.configs", reason=f"torchtitan {HINT}")
    import tyro
    from torchtitan.config.manager import custom_registry

    job = dataclasses.make_dataclass("Job", [           # the two sections of Trainer.Config
        (name, cls, dataclasses.field(default_factory=cls))
        for name, cls in (("training", configs.TrainingConfig),
                          ("parallelism", configs.ParallelismConfig))])
    plan = make_plan(**layout, mbs=2, gbs=64 * layout["dp"], seq_len=8192)
    args = shlex.split(export_torchtitan(plan, num_layers=32)["torchtitan.args"])
    cfg = tyro.cli(job, args=args[args.index("--config") + 2:], registry=custom_registry)
    t, par, p = cfg.training, cfg.parallelism, plan["parallel"]
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree,
            par.context_parallel_degree) == (p["tp"], p["pp"], p["cp"])
    dp = par.data_parallel_replicate_degree * par.data_parallel_shard_degree
    assert dp == p["dp"] and (t.global_batch_size, t.seq_len) == (plan["global_batch_size"], 8192)
    assert t.global_batch_size % (t.local_batch_size * dp) == 0        # Trainer.Config's check
    if p["pp"] > 1:
        assert t.local_batch_size % par.pipeline_parallel_microbatch_size == 0
        assert par.pipeline_parallel_microbatch_size == plan["micro_batch_size"]
        assert t.disable_cuda_graphs, "torchtitan refuses CUDA graphs with PP at start-up"
        if p["vpp"] > 1:
            assert par.pipeline_parallel_layers_per_stage == 32 // (p["pp"] * p["vpp"])
    else:
        assert t.local_batch_size == plan["micro_batch_size"]


class _DataParallelGroup:
    """The data- and model-parallel sizes DeepSpeedConfig asks its ``mpu`` for (this process
    is the one rank of a real gloo group; the plan's group sizes come from here)."""

    def __init__(self, dp: int, tp: int) -> None:
        self.dp, self.tp = dp, tp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.tp


@pytest.mark.parametrize("layout", [dict(tp=2, pp=2, dp=4, fsdp="zero1"),
                                    dict(tp=1, pp=1, dp=16, fsdp="zero3"),
                                    dict(tp=4, pp=1, dp=2, fsdp="zero2")],
                         ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_deepspeed_config_accepts_the_export(tmp_path, layout):
    pytest.importorskip("pydantic", reason=f"pydantic (DeepSpeed's config) {HINT}")
    ds_config = pytest.importorskip("deepspeed.runtime.config", reason=f"deepspeed {HINT}")
    import deepspeed.comm
    import torch.distributed as dist
    plan = make_plan(**layout)
    files = export_deepspeed(plan)
    path = tmp_path / "ds_config.json"
    path.write_text(files["ds_config.json"])
    p = plan["parallel"]
    # DeepSpeedConfig reads the world from torch.distributed: one real gloo rank, no listener
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0,
                            world_size=1)
    try:
        deepspeed.comm.init_distributed(dist_backend="gloo")
        cfg = ds_config.DeepSpeedConfig(str(path), mpu=_DataParallelGroup(p["dp"], p["tp"]))
    finally:
        dist.destroy_process_group()
    doc = json.loads(files["ds_config.json"])
    assert cfg.train_batch_size == doc["train_batch_size"] == plan["global_batch_size"]
    assert cfg.gradient_accumulation_steps == plan["microbatches"]
    assert cfg.zero_optimization_stage == {"zero1": 1, "zero2": 2, "zero3": 3}[p["fsdp"]]
