"""The Tower Module (TM): a dense compressor per tower, run on the tower's host before the
cross-host return.

A tower of features with embedding dims ``d_1 … d_F`` pools to ``D_t = Σ d_i`` values per
sample; the module ``f_t: R^{D_t} → R^{D'_t}`` runs on the ``H·B`` samples its host holds, so
the cross-host return carries ``D'_t`` instead of ``D_t`` values per sample (ratio
``c ≈ D_t / D'_t``). Kinds (reconstructed, not confirmed by the DMT paper; papers.md §3.4):

- ``identity``: ``D'_t = D_t``, no compute, no parameters. The model function is unchanged
  (semantic preservation; the gloo test checks it).
- ``mix``: feature mixing, the hierarchical interaction of a DLRM tower: the tower's ``F``
  vectors (one width ``d``) are mixed into ``K = ceil(F / c)`` vectors of width ``d`` by a
  learned ``K × F`` matrix (``D'_t = K·d``; FLOPs ``2·F·K·d`` per sample, ``F·K`` parameters).
  The interaction above sees ``K`` vectors per tower instead of ``F``.
- ``linear``: one dense projection ``D_t → D'_t = ceil(D_t / c)`` (rounded up to a multiple of
  4) with bias; ``D_t·D'_t`` parameters, so expensive for wide towers.
- ``mlp``: ``linear`` → ReLU → ``D'_t → D'_t``.

The module is data-parallel inside the host (gradient all-reduce over the host's GPUs only).

>>> tm = TowerModuleSpec(kind="mix", ratio=4)
>>> tm.out_width([64] * 10), tm.flops_fwd([64] * 10, samples=1000), tm.param_count([64] * 10)
(192, 3840000.0, 30)
>>> TowerModuleSpec(kind="linear", ratio=4).out_width([128, 128, 256])
128
>>> TowerModuleSpec().out_width([64, 32])
96
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from simulator.errors import SpecError

__all__ = ["TowerModuleSpec", "TM_KINDS"]

TM_KINDS = ("identity", "mix", "linear", "mlp")


@dataclass(frozen=True, slots=True, kw_only=True)
class TowerModuleSpec:
    """Kind and compression ratio of every tower's module.

    Attributes
    ----------
    kind : str
        ``identity``, ``mix``, ``linear`` or ``mlp``.
    ratio : float
        Compression ``c`` (≥ 1); ignored by ``identity``.
    multiple : int
        ``linear``/``mlp`` output widths are multiples of this (4: widths TorchRec accepts).
    """

    kind: str = "identity"
    ratio: float = 1.0
    multiple: int = 4

    def __post_init__(self) -> None:
        if self.kind not in TM_KINDS:
            raise SpecError(f"unknown tower module {self.kind!r}", source="--tower-module",
                            fix=f"use one of: {', '.join(TM_KINDS)}")
        if isinstance(self.ratio, bool) or not (isinstance(self.ratio, (int, float))
                                                and math.isfinite(self.ratio)
                                                and self.ratio >= 1):
            raise SpecError(f"tower module ratio must be a number ≥ 1, got {self.ratio!r}",
                            source="--tm-ratio", fix="pass e.g. --tm-ratio 4 (1: no compression)")
        if self.multiple < 1:
            raise SpecError("multiple must be ≥ 1", source="multiple", fix="use 1 or 4")

    @property
    def is_identity(self) -> bool:
        return self.kind == "identity"

    def check(self, dims: Sequence[int], *, tower: str = "a tower") -> None:
        """Raise :class:`SpecError` when the module cannot run on features of ``dims``."""
        if self.kind == "mix" and len(set(dims)) > 1:
            raise SpecError(f"{tower} mixes embedding dims {sorted(set(dims))}; the mix module "
                            "needs one width per tower", source="--tower-module",
                            fix="use --tower-module linear, or tables of one embedding_dim")

    def _mix_k(self, dims: Sequence[int]) -> int:
        return max(1, math.ceil(len(dims) / self.ratio))

    def out_width(self, dims: Sequence[int]) -> int:
        """``D'_t`` for a tower whose features have embedding dims ``dims``."""
        width = int(sum(dims))
        if self.is_identity or width <= 0:
            return width
        if self.kind == "mix":
            return self._mix_k(dims) * int(dims[0])
        w = math.ceil(width / self.ratio)
        w = self.multiple * math.ceil(w / self.multiple)
        return int(min(width, max(self.multiple, w)))

    def flops_fwd(self, dims: Sequence[int], *, samples: float) -> float:
        """Forward FLOPs on ``samples`` samples (2 per multiply-add)."""
        if self.is_identity or not dims:
            return 0.0
        if self.kind == "mix":
            return 2.0 * samples * len(dims) * self._mix_k(dims) * dims[0]
        return float(sum(2.0 * samples * i * o for i, o in self._layers(dims)))

    def param_count(self, dims: Sequence[int]) -> int:
        if self.is_identity or not dims:
            return 0
        if self.kind == "mix":
            return len(dims) * self._mix_k(dims)
        return int(sum(i * o + o for i, o in self._layers(dims)))

    def _layers(self, dims: Sequence[int]) -> list[tuple[int, int]]:
        width, out = int(sum(dims)), self.out_width(dims)
        return [(width, out)] if self.kind == "linear" else [(width, out), (out, out)]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "ratio": self.ratio, "multiple": self.multiple}


