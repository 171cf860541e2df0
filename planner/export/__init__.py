"""Export an LLM plan (``clusterplan plan MODEL --out plan.json``) to trainer configurations.

One module per target, each a pure function ``export_<target>(plan) -> {file name: text}`` that
re-parses its own output before returning it (``validate_<target>``):

- ``torchtitan``: v0.2.x job TOML and the ``--parallelism.*`` overrides,
- ``megatron``: ``pretrain_gpt.py`` arguments,
- ``deepspeed``: ``ds_config.json`` and the pipeline topology arguments,
- ``hostfile``: host list, rank → host/GPU map, MPI rankfile and torchrun per-host settings.
"""

from __future__ import annotations

from typing import Any, Callable

from simulator.errors import SpecError

from planner.export._plan import check_plan
from planner.export.deepspeed import export_deepspeed
from planner.export.hostfile import export_hostfile
from planner.export.megatron import export_megatron
from planner.export.torchtitan import export_torchtitan

__all__ = ["TARGETS", "export_plan", "check_plan", "export_torchtitan", "export_megatron",
           "export_deepspeed", "export_hostfile"]

TARGETS: dict[str, Callable[..., dict[str, str]]] = {
    "torchtitan": export_torchtitan,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "hostfile": export_hostfile,
}

# keyword options each exporter understands (others are dropped, so one option set fits all)
_OPTIONS = {
    "torchtitan": ("num_layers", "seq_len", "hsdp_shard"),
    "megatron": ("num_layers", "seq_len", "precision"),
    "deepspeed": ("precision", "hsdp_shard"),
    "hostfile": (),
}


def export_plan(plan: dict, target: str, **options: Any) -> dict[str, str]:
    """Export ``plan`` to ``target`` (one of :data:`TARGETS`): file name → text."""
    if target not in TARGETS:
        raise SpecError(f"unknown target {target!r}", field="--to",
                        fix=f"use one of {', '.join(TARGETS)}")
    training = ((plan.get("spec") or {}).get("training") or {}) if isinstance(plan, dict) else {}
    for key, what in (("offload", "token-wise activation swap (MEMO)"),
                      ("documents", "variable-length document packing (WLB-LLM)")):
        if training.get(key) and target != "hostfile":
            raise SpecError(f"the plan trains with {what}, which {target} cannot express",
                            field=f"spec.training.{key}",
                            fix=f"re-plan with --target {target} (only what it runs), or run the "
                                "plan with a trainer that has it")
    kw = {k: v for k, v in options.items() if k in _OPTIONS[target] and v is not None}
    return TARGETS[target](plan, **kw)
