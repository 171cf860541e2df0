"""The Tower Module (TM): a dense compressor per tower, run on the tower's host before the
cross-host return.

A tower whose features pool to ``D_t`` values per sample (the sum of their embedding dims)
passes them through ``f_t: R^{D_t} → R^{D'_t}`` on the ``H·B`` samples its host holds, so the
cross-host return carries ``D'_t`` instead of ``D_t`` values per sample (ratio
``c = D_t / D'_t``). Kinds (reconstructed, not confirmed by the DMT paper; papers.md §3.4):

- ``identity``: ``D'_t = D_t``, no compute, no parameters. The model function is unchanged
  (semantic preservation; the gloo test checks it).
- ``linear``: one projection ``D_t → D'_t`` with bias (a low-rank feature mixer).
- ``mlp``: ``D_t → D'_t`` → ReLU → ``D'_t → D'_t``.

The module is data-parallel inside the host (gradient all-reduce over the host's GPUs only).

>>> tm = TowerModuleSpec(kind="linear", ratio=4)
>>> tm.out_width(512)
128
>>> tm.flops_fwd(512, samples=1000)
131072000.0
>>> TowerModuleSpec().out_width(512)
512
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import SpecError

__all__ = ["TowerModuleSpec", "TM_KINDS", "build_torch_module"]

TM_KINDS = ("identity", "linear", "mlp")


@dataclass(frozen=True, slots=True, kw_only=True)
class TowerModuleSpec:
    """Kind and compression ratio of every tower's module.

    Attributes
    ----------
    kind : str
        ``identity``, ``linear`` or ``mlp``.
    ratio : float
        Compression ``c = D_t / D'_t`` (≥ 1); ignored by ``identity``. The output width is
        ``ceil(D_t / c)`` rounded up to a multiple of ``multiple``.
    multiple : int
        Output widths are multiples of this (4: column widths TorchRec accepts).
    """

    kind: str = "identity"
    ratio: float = 1.0
    multiple: int = 4

    def __post_init__(self) -> None:
        if self.kind not in TM_KINDS:
            raise SpecError(f"unknown tower module {self.kind!r}", source="--tower-module",
                            fix=f"use one of: {', '.join(TM_KINDS)}")
        if not (isinstance(self.ratio, (int, float)) and math.isfinite(self.ratio)
                and self.ratio >= 1):
            raise SpecError(f"tower module ratio must be a number ≥ 1, got {self.ratio!r}",
                            source="--tm-ratio", fix="pass e.g. --tm-ratio 4 (1: no compression)")
        if self.multiple < 1:
            raise SpecError("multiple must be ≥ 1", source="multiple", fix="use 1 or 4")

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    def out_width(self, in_width: int) -> int:
        """``D'_t`` for a tower of ``in_width`` pooled values per sample."""
        if self.is_identity or in_width <= 0:
            return int(in_width)
        w = math.ceil(in_width / self.ratio)
        w = self.multiple * math.ceil(w / self.multiple)
        return int(min(in_width, max(self.multiple, w)))

    def layers(self, in_width: int) -> list[tuple[int, int]]:
        """(in, out) of every matrix."""
        if self.is_identity:
            return []
        out = self.out_width(in_width)
        if self.kind == "linear":
            return [(in_width, out)]
        return [(in_width, out), (out, out)]

    def flops_fwd(self, in_width: int, *, samples: float) -> float:
        """Forward FLOPs on ``samples`` samples (2 per multiply-add)."""
        return float(sum(2.0 * samples * i * o for i, o in self.layers(in_width)))

    def param_count(self, in_width: int) -> int:
        return int(sum(i * o + o for i, o in self.layers(in_width)))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ratio": self.ratio, "multiple": self.multiple}


def build_torch_module(spec: TowerModuleSpec, in_width: int, *, seed: int = 0):
    """A ``torch.nn.Module`` implementing ``spec`` for one tower (seeded weights)."""
    import torch
    from torch import nn
    if spec.is_identity:
        return nn.Identity()
    gen = torch.Generator().manual_seed(int(seed))
    mods: list = []
    for k, (i, o) in enumerate(spec.layers(in_width)):
        lin = nn.Linear(i, o)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(o, i, generator=gen) / math.sqrt(i))
            lin.bias.zero_()
        if k:
            mods.append(nn.ReLU())
        mods.append(lin)
    return nn.Sequential(*mods)
