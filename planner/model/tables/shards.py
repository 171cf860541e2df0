"""Sharding types and shard layouts, following TorchRec's layout rules.

A table of ``rows × dim`` is cut into shards, each a block ``[row_offset : row_offset + rows,
col_offset : col_offset + cols]`` on one rank:

- ``table_wise``: one shard, the whole table, on one rank.
- ``column_wise``: column blocks whose widths are multiples of 4 (any widths, not only halves);
  several blocks of one table may sit on one rank, and blocks on the same rank are merged.
- ``row_wise``: over all ``world`` ranks in order, blocks of ``ceil(rows / world)`` rows, the
  last non-empty rank the remainder and trailing ranks possibly empty. TorchRec's training path
  buckets ids by this block, so uneven blocks give wrong results (formats.md §2.10):

  >>> row_blocks(10, 4)
  (3, 3, 3, 1)
  >>> row_blocks(5, 4)
  (2, 2, 1, 0)

- ``table_row_wise``: the row-wise rule over the ranks of one host.
- ``data_parallel``: a full replica on every rank.
- ``subset_row_wise``: the rows split over some of the ranks, any of them (HugeCTR's layout for
  a table in several GPUs' shard lists: its keys dealt modulo the shard count, so every shard
  serves an even share of the ids; the blocks here carry the row counts). Each shard pools its
  share of every sample's ids, and the pooled all-to-all sends these partial sums to the
  samples' ranks, which add them up. TorchRec has no such type: only ``--planner hugectr_auto``
  makes it, and only ``export --to hugectr`` exports it.

  >>> [(s.rank, s.rows) for s in subset_row_wise(0, "t", 10, 16, [5, 2]).shards]
  [(2, 5), (5, 5)]

- ``hierarchical_row_wise``: the rows split over every GPU of one or more whole hosts
  (HugeCTR's layout under its ``Hierarchical`` communication, the ``hier_auto`` plan of a
  multi-node run). Each shard pools its share of every sample's ids, as ``subset_row_wise``;
  but the partial sums are first reduced inside each host (a reduce-scatter over the host's
  GPUs, as ``table_row_wise``), so one reduced vector per host and sample crosses hosts in the
  pooled all-to-all, where the sample's rank adds the hosts' vectors up. On one host it costs
  what ``table_row_wise`` costs. Only ``--planner hugectr_auto`` makes it.

  >>> [(s.rank, s.rows) for s in hierarchical_row_wise(0, "t", 10, 16, [[2, 3], [0, 1]]).shards]
  [(0, 3), (1, 3), (2, 3), (3, 1)]
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from simulator.errors import SpecError

__all__ = ["ShardingType", "Shard", "TableSharding", "row_blocks", "column_widths",
           "table_wise", "column_wise", "column_wise_counts", "row_wise", "table_row_wise",
           "subset_row_wise", "hierarchical_row_wise", "data_parallel", "validate_sharding",
           "ALL_SHARDING_TYPES", "HUGECTR_TYPES", "ROW_SPLIT_TYPES", "HOST_REDUCED_TYPES",
           "parse_sharding_types"]


class ShardingType(enum.StrEnum):
    """How one table is split and placed (TorchRec's ``sharding_type`` strings)."""

    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    DATA_PARALLEL = "data_parallel"
    SUBSET_ROW_WISE = "subset_row_wise"
    HIERARCHICAL_ROW_WISE = "hierarchical_row_wise"

    @property
    def short(self) -> str:
        return {"table_wise": "TW", "column_wise": "CW", "row_wise": "RW",
                "table_row_wise": "TWRW", "data_parallel": "DP",
                "subset_row_wise": "SRW", "hierarchical_row_wise": "HRW"}[self.value]


#: HugeCTR's layouts that TorchRec has no form of: only ``--planner hugectr_auto`` makes them
HUGECTR_TYPES: tuple[ShardingType, ...] = (ShardingType.SUBSET_ROW_WISE,
                                           ShardingType.HIERARCHICAL_ROW_WISE)

#: TorchRec's sharding types, what the planners choose from unless told otherwise
ALL_SHARDING_TYPES: tuple[ShardingType, ...] = tuple(
    t for t in ShardingType if t not in HUGECTR_TYPES)

#: the types whose shards hold a block of rows and serve only the ids that fall in it
ROW_SPLIT_TYPES: tuple[ShardingType, ...] = (
    ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.SUBSET_ROW_WISE,
    ShardingType.HIERARCHICAL_ROW_WISE)

#: the types whose partial sums are reduce-scattered inside each host before the all-to-all
HOST_REDUCED_TYPES: tuple[ShardingType, ...] = (ShardingType.TABLE_ROW_WISE,
                                                ShardingType.HIERARCHICAL_ROW_WISE)

_ALIASES = {"tw": "table_wise", "cw": "column_wise", "rw": "row_wise", "twrw": "table_row_wise",
            "dp": "data_parallel", "row-wise": "row_wise", "column-wise": "column_wise",
            "table-wise": "table_wise", "table-row-wise": "table_row_wise",
            "data-parallel": "data_parallel", "srw": "subset_row_wise",
            "subset-row-wise": "subset_row_wise", "hrw": "hierarchical_row_wise",
            "hierarchical-row-wise": "hierarchical_row_wise"}


def parse_sharding_types(value, *, source: str = "--sharding-types",
                         field: str | None = None) -> tuple[ShardingType, ...]:
    """``'table_wise,row_wise'`` or a list of names/aliases (tw, cw, rw, twrw, dp) → types.

    The result keeps the canonical order of :class:`ShardingType`, whatever the input order.
    """
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    else:
        raise SpecError(f"expected a list of sharding types, got {value!r}", source=source,
                        field=field, fix="write e.g. table_wise,column_wise,row_wise")
    if not items:
        raise SpecError("no sharding type given", source=source, field=field,
                        fix="list at least one of: " + ", ".join(t.value for t in ShardingType))
    chosen = set()
    for it in items:
        key = _ALIASES.get(it.lower(), it.lower())
        if key in HUGECTR_TYPES:
            raise SpecError(f"{it!r} is HugeCTR's layout, which only its own planner makes",
                            source=source, field=field,
                            fix="plan with --planner hugectr_auto, or choose among "
                                + ", ".join(t.value for t in ALL_SHARDING_TYPES))
        try:
            chosen.add(ShardingType(key))
        except ValueError:
            raise SpecError(f"unknown sharding type {it!r}", source=source, field=field,
                            fix="use " + ", ".join(t.value for t in ALL_SHARDING_TYPES)
                            + " (or tw, cw, rw, twrw, dp)") from None
    return tuple(t for t in ALL_SHARDING_TYPES if t in chosen)


@dataclass(frozen=True, slots=True)
class Shard:
    """One block of a table on one rank; offsets and sizes in rows and columns."""

    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True, slots=True)
class TableSharding:
    """The layout of one table: its type and its shards in shard order.

    ``table`` is the table's index in the model spec; ``name`` its name. For
    ``table_row_wise`` ``host`` is the host index; for ``column_wise`` ``parts`` is the number of
    equal column parts the widths were built from (0 when the widths are free-form).
    """

    table: int
    name: str
    sharding_type: ShardingType
    shards: tuple[Shard, ...]
    host: int = -1
    parts: int = 0

    @property
    def ranks(self) -> tuple[int, ...]:
        """One rank per shard, in shard order (what TorchRec's planner writes)."""
        return tuple(s.rank for s in self.shards)

    def key(self) -> tuple:
        """A hashable, order-stable identity of the layout."""
        return (self.table, self.sharding_type.value, self.host,
                tuple((s.rank, s.row_offset, s.col_offset, s.rows, s.cols) for s in self.shards))


def row_blocks(rows: int, world: int) -> tuple[int, ...]:
    """Rows per rank for row-wise sharding: ``ceil(rows / world)`` each, remainder last.

    >>> row_blocks(10, 4)
    (3, 3, 3, 1)
    >>> row_blocks(3, 4)
    (1, 1, 1, 0)
    """
    if world <= 0:
        raise ValueError("world must be positive")
    block = math.ceil(rows / world)
    out, left = [], rows
    for _ in range(world):
        take = min(block, left)
        out.append(take)
        left -= take
    return tuple(out)


def column_widths(dim: int, parts: int) -> tuple[int, ...]:
    """Widths of ``parts`` column blocks, each a multiple of 4, as equal as possible.

    >>> column_widths(128, 4)
    (32, 32, 32, 32)
    >>> column_widths(40, 3)
    (16, 12, 12)

    Raises ``ValueError`` when ``dim`` is not a multiple of 4 or ``parts > dim / 4``.
    """
    if dim % 4 or parts < 1 or parts > dim // 4:
        raise ValueError(f"cannot split dim {dim} into {parts} column blocks of multiples of 4")
    units = dim // 4
    base, extra = divmod(units, parts)
    return tuple(4 * (base + (1 if i < extra else 0)) for i in range(parts))


def table_wise(table: int, name: str, rows: int, dim: int, rank: int) -> TableSharding:
    """The whole table on ``rank``."""
    return TableSharding(table, name, ShardingType.TABLE_WISE, (Shard(rank, 0, 0, rows, dim),))


def column_wise(table: int, name: str, rows: int, dim: int, ranks: Sequence[int],
                widths: Sequence[int], *, parts: int = 0) -> TableSharding:
    """Column blocks of the given widths on the given ranks (in column order)."""
    if len(ranks) != len(widths) or sum(widths) != dim or any(w <= 0 or w % 4 for w in widths):
        raise ValueError(f"column widths {tuple(widths)} must be positive multiples of 4 summing "
                         f"to {dim}, one per rank")
    shards, off = [], 0
    for r, w in zip(ranks, widths):
        shards.append(Shard(int(r), 0, off, rows, int(w)))
        off += w
    return TableSharding(table, name, ShardingType.COLUMN_WISE, tuple(shards), parts=parts)


def column_wise_counts(table: int, name: str, rows: int, dim: int, parts: int,
                       counts: Sequence[int]) -> TableSharding:
    """``parts`` equal column parts, ``counts[r]`` of them on rank ``r``, merged per rank.

    Ranks holding parts get one contiguous block each, in rank order:

    >>> ts = column_wise_counts(0, "t", 10, 64, 4, [1, 0, 3])
    >>> [(s.rank, s.col_offset, s.cols) for s in ts.shards]
    [(0, 0, 16), (2, 16, 48)]
    """
    if sum(counts) != parts:
        raise ValueError(f"counts {tuple(counts)} must sum to {parts}")
    if dim % (4 * parts):
        raise ValueError(f"dim {dim} is not divisible into {parts} parts of multiples of 4")
    w = dim // parts
    ranks = [r for r, c in enumerate(counts) if c > 0]
    widths = [counts[r] * w for r in ranks]
    if len(ranks) == 1:
        return table_wise(table, name, rows, dim, ranks[0])
    return column_wise(table, name, rows, dim, ranks, widths, parts=parts)


def _row_shards(rows: int, dim: int, ranks: Sequence[int]) -> tuple[Shard, ...]:
    """TorchRec's even row blocks (:func:`row_blocks`) on ``ranks``, in their order."""
    shards, off = [], 0
    for r, n in zip(ranks, row_blocks(rows, len(ranks))):
        shards.append(Shard(int(r), off, 0, n, dim))
        off += n
    return tuple(shards)


def row_wise(table: int, name: str, rows: int, dim: int, world: int) -> TableSharding:
    """Even row blocks over ranks ``0 .. world-1`` (TorchRec's rule, see :func:`row_blocks`)."""
    return TableSharding(table, name, ShardingType.ROW_WISE, _row_shards(rows, dim, range(world)))


def table_row_wise(table: int, name: str, rows: int, dim: int, host: int,
                   host_ranks: Sequence[int]) -> TableSharding:
    """The row-wise rule over the ranks of one host."""
    return TableSharding(table, name, ShardingType.TABLE_ROW_WISE,
                         _row_shards(rows, dim, host_ranks), host=host)


def subset_row_wise(table: int, name: str, rows: int, dim: int,
                    ranks: Sequence[int]) -> TableSharding:
    """The rows over ``ranks`` (any distinct ranks; shards in rank order), TorchRec's even
    blocks standing for HugeCTR's modulo split (the same counts up to one row)."""
    ranks = sorted(int(r) for r in ranks)
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"subset_row_wise needs distinct ranks, got {ranks}")
    return TableSharding(table, name, ShardingType.SUBSET_ROW_WISE, _row_shards(rows, dim, ranks))


def hierarchical_row_wise(table: int, name: str, rows: int, dim: int,
                          hosts: Sequence[Sequence[int]]) -> TableSharding:
    """The rows over every rank of ``hosts`` (each a host's ranks; shards in rank order), each
    host's partial sums reduced inside it before they cross hosts (module docstring)."""
    ranks = sorted(int(r) for h in hosts for r in h)
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"hierarchical_row_wise needs distinct ranks, got {ranks}")
    return TableSharding(table, name, ShardingType.HIERARCHICAL_ROW_WISE,
                         _row_shards(rows, dim, ranks))


def data_parallel(table: int, name: str, rows: int, dim: int, world: int) -> TableSharding:
    """A full replica on every rank."""
    return TableSharding(table, name, ShardingType.DATA_PARALLEL,
                         tuple(Shard(r, 0, 0, rows, dim) for r in range(world)))


def validate_sharding(ts: TableSharding, rows: int, dim: int, world: int,
                      hosts: Sequence[Sequence[int]] | None = None) -> list[str]:
    """Problems with a layout (empty list when it is well formed); ``hosts`` (each host's
    ranks) checks that a ``hierarchical_row_wise`` layout covers whole hosts."""
    problems = []
    for s in ts.shards:
        if not 0 <= s.rank < world:
            problems.append(f"shard on rank {s.rank}, outside 0..{world - 1}")
        if s.rows < 0 or s.cols < 0:
            problems.append("negative shard size")
    t = ts.sharding_type
    if t == ShardingType.DATA_PARALLEL:
        if sorted(s.rank for s in ts.shards) != list(range(world)) or any(
                (s.rows, s.cols) != (rows, dim) for s in ts.shards):
            problems.append("data_parallel needs one full replica per rank")
        return problems
    if t in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
        if any(s.rows != rows or s.row_offset != 0 for s in ts.shards):
            problems.append("column blocks must span all rows")
        off = 0
        for s in ts.shards:
            if s.col_offset != off:
                problems.append("column blocks must be contiguous and in order")
            off += s.cols
        if off != dim:
            problems.append(f"column widths sum to {off}, not {dim}")
        if t == ShardingType.TABLE_WISE and len(ts.shards) != 1:
            problems.append("table_wise has exactly one shard")
        if t == ShardingType.COLUMN_WISE and any(s.cols % 4 for s in ts.shards):
            problems.append("column widths must be multiples of 4")
        return problems
    expect = row_blocks(rows, len(ts.shards))
    if tuple(s.rows for s in ts.shards) != expect:
        problems.append(f"row blocks {tuple(s.rows for s in ts.shards)} are not TorchRec's even "
                        f"blocks {expect}")
    if any(s.cols != dim for s in ts.shards):
        problems.append("row blocks must span all columns")
    if t == ShardingType.ROW_WISE and [s.rank for s in ts.shards] != list(range(world)):
        problems.append("row_wise spans ranks 0..world-1 in order")
    ranks = [s.rank for s in ts.shards]
    if t in HUGECTR_TYPES and ranks != sorted(set(ranks)):
        problems.append(f"{t.value} shards sit on distinct ranks in rank order")
    if t == ShardingType.HIERARCHICAL_ROW_WISE and hosts is not None:
        held = set(ranks)
        partial = [list(h) for h in hosts if held & set(h) and not set(h) <= held]
        if partial:
            problems.append(f"hierarchical_row_wise holds part of a host ({partial[0]}): its "
                            "shards cover every rank of each host they use")
    return problems
