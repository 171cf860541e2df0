"""Parallel layout: which global rank holds which (tp, cp, dp, pp) coordinate.

Megatron's convention (``order="tp-cp-dp-pp"``, innermost first): consecutive ranks share a
tensor-parallel group, then context, data and pipeline axes, so TP stays inside a node and PP is
outermost (and crosses buildings first). Any permutation of the four axes is accepted.

>>> lay = Layout(tp=2, cp=1, dp=2, pp=4)
>>> lay.group("tp", 0), lay.group("dp", 0), lay.group("pp", 1)
([0, 1], [0, 2], [1, 5, 9, 13])
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import SpecError

__all__ = ["Layout", "AXES"]

AXES = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True, slots=True)
class Layout:
    tp: int
    cp: int
    dp: int
    pp: int
    order: str = "tp-cp-dp-pp"

    def __post_init__(self) -> None:
        axes = self.order.split("-")
        if sorted(axes) != sorted(AXES):
            raise SpecError(f"order {self.order!r} is not a permutation of tp, cp, dp, pp",
                            field="order", fix="write e.g. tp-cp-dp-pp (innermost first)")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def _axes(self) -> list[str]:
        return self.order.split("-")

    def rank(self, *, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        coord = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
        r, stride = 0, 1
        for ax in self._axes():
            r += coord[ax] * stride
            stride *= getattr(self, ax)
        return r

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for ax in self._axes():
            size = getattr(self, ax)
            out[ax] = rank % size
            rank //= size
        return out

    def group(self, axis: str, rank: int) -> list[int]:
        """Ranks that differ from ``rank`` only along ``axis``, in axis order."""
        c = self.coords(rank)
        return [self.rank(**{**c, axis: i}) for i in range(getattr(self, axis))]

    def ep_group(self, rank: int, ep: int) -> list[int]:
        """Expert-parallel group of ``rank``: ``ep`` consecutive members of its DP group."""
        g = self.group("dp", rank)
        i = g.index(rank) // ep * ep
        return g[i:i + ep]
