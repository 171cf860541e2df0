"""The Tower Module of a :class:`~planner.model.dmt.module.TowerModuleSpec` as a real torch
module, for the gloo checks of DMT's semantics."""

from __future__ import annotations

import math
from typing import Sequence

from planner.model.dmt.module import TowerModuleSpec

__all__ = ["build_torch_module"]



def build_torch_module(spec: TowerModuleSpec, dims: Sequence[int], *, seed: int = 0):
    """A ``torch.nn.Module`` implementing ``spec`` for one tower (seeded weights); input
    ``(batch, Σ dims)`` with the features' columns concatenated in order."""
    import torch
    from torch import nn
    if spec.is_identity:
        return nn.Identity()
    spec.check(dims)
    gen = torch.Generator().manual_seed(int(seed))
    if spec.kind == "mix":
        F, d, K = len(dims), int(dims[0]), spec._mix_k(dims)
        w = torch.randn(K, F, generator=gen) / math.sqrt(F)

        class _Mix(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.weight = nn.Parameter(w)

            def forward(self, x):
                v = x.reshape(x.shape[0], F, d)
                return torch.einsum("kf,bfd->bkd", self.weight, v).reshape(x.shape[0], K * d)
        return _Mix()
    mods: list = []
    for k, (i, o) in enumerate(spec._layers(dims)):
        lin = nn.Linear(i, o)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(o, i, generator=gen) / math.sqrt(i))
            lin.bias.zero_()
        if k:
            mods.append(nn.ReLU())
        mods.append(lin)
    return nn.Sequential(*mods)
