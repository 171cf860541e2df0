"""Pipeline schedules: the order in which each pipeline rank runs forward and backward passes.

An item is ``(kind, microbatch, chunk)`` with kind ``F`` or ``B``; ``chunk`` is the virtual
stage index on that rank (0 unless interleaved). Virtual stage of (rank r, chunk c) is
``c·pp + r`` (Megatron/torchtitan loop placement).

>>> one_f_one_b(pp=4, m=4, rank=3)
[('F', 0, 0), ('B', 0, 0), ('F', 1, 0), ('B', 1, 0), ('F', 2, 0), ('B', 2, 0), ('F', 3, 0), ('B', 3, 0)]
>>> one_f_one_b(pp=4, m=4, rank=0)[:4]
[('F', 0, 0), ('F', 1, 0), ('F', 2, 0), ('F', 3, 0)]
"""

from __future__ import annotations

from simulator.errors import SpecError

__all__ = ["gpipe", "one_f_one_b", "interleaved", "schedule"]

Item = tuple[str, int, int]


def gpipe(pp: int, m: int, rank: int) -> list[Item]:
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in reversed(range(m))]


def one_f_one_b(pp: int, m: int, rank: int) -> list[Item]:
    warm = min(pp - rank - 1, m)
    out: list[Item] = [("F", i, 0) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        out.append(("F", f, 0))
        f += 1
        out.append(("B", b, 0))
        b += 1
    out += [("B", i, 0) for i in range(b, m)]
    return out


def interleaved(pp: int, m: int, rank: int, vpp: int) -> list[Item]:
    """Megatron's interleaved 1F1B: micro-batches in groups of ``pp`` cycle through chunks."""
    if m % pp:
        raise SpecError(f"interleaved schedule needs micro-batches ({m}) divisible by pp ({pp})",
                        field="parallel.vpp", fix="change the batch or micro-batch size, or vpp=1")
    total = m * vpp

    def fwd(k: int) -> tuple[int, int]:
        chunk = (k // pp) % vpp
        mb = (k // (pp * vpp)) * pp + k % pp
        return mb, chunk

    def bwd(k: int) -> tuple[int, int]:
        mb, chunk = fwd(k)
        return mb, vpp - 1 - chunk

    warm = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    out: list[Item] = []
    for k in range(warm):
        out.append(("F", *fwd(k)))
    f, b = warm, 0
    while f < total:
        out.append(("F", *fwd(f)))
        f += 1
        out.append(("B", *bwd(b)))
        b += 1
    while b < total:
        out.append(("B", *bwd(b)))
        b += 1
    return out


def schedule(name: str, pp: int, m: int, rank: int, vpp: int = 1) -> list[Item]:
    if name == "gpipe":
        return gpipe(pp, m, rank)
    if vpp > 1 or name == "interleaved":
        return interleaved(pp, m, rank, vpp)
    return one_f_one_b(pp, m, rank)
