"""Error-bounded lossy compression of the pooled-embedding all-to-all (Feng et al., SC 2024;
papers.md §8).

Each rank compresses the pooled embeddings it sends with an error-bounded compressor, the peer
decompresses what it receives. The model spec says (YAML)::

    a2a_compression:
      error_bound: 0.01          # |error| ≤ error_bound × σ of each table's pooled output
      tables: {user_id: 0.001}   # table-wise bounds (the rest take error_bound)
      schedule: [[0, 3.0], [20000, 1.0]]   # iteration-wise: from iteration i, bounds × m
      backward: false            # also the gradients' all-to-all
      iteration: 0               # the training iteration the step is simulated at

or, instead of ``error_bound`` and ``tables``, ``budget: 0.01`` with optional
``sensitivity: {user_id: 4}``: the bounds are then chosen per table (:func:`bounds_for_budget`).

A bound of ``rel`` costs ``c0 + c1·log2(1/rel)`` bits per value (fitted to SZ3 on pooled
embeddings, ``traces/calibration/a2a-compression.yaml``; a quantised Gaussian's entropy has
``c0 = 1.05``, ``c1 = 1``), so a table's bytes shrink by ``8·bytes_per_value / bits``. The
compressor and decompressor are compute ops at the calibrated throughput of the device kind.

Under an error budget ``B`` (the bytes-weighted mean of ``sensitivity × bound`` over tables),
the bytes sent, ``Σ b_t (c0 + c1·log2(1/rel_t))``, are least with ``rel_t = B / s_t``
(Lagrange: ``c1·b_t / (rel_t ln 2) = λ s_t b_t``): :func:`bounds_for_budget`.

>>> c = A2ACompression(error_bound=0.01)
>>> round(c.ratio(0.01, value_bytes=4), 2)
4.02
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

from simulator.errors import SpecError
from simulator.fileio import read_text

__all__ = ["A2ACompression", "parse_compression", "bounds_for_budget", "calibration",
           "CALIBRATION"]

CALIBRATION = Path(__file__).resolve().parents[3] / "traces" / "calibration" \
    / "a2a-compression.yaml"


@lru_cache(maxsize=4)
def calibration(path: str = str(CALIBRATION)) -> dict:
    """The bits-per-value fit and codec throughputs (bytes/s) of the calibration file."""
    return yaml.safe_load(read_text(path, field="a2a_compression"))


@dataclass(frozen=True, slots=True, kw_only=True)
class A2ACompression:
    """What ``a2a_compression`` says; bounds relative to each table's pooled σ."""

    error_bound: float
    tables: tuple[tuple[str, float], ...] = ()
    schedule: tuple[tuple[int, float], ...] = ()
    backward: bool = False
    iteration: int = 0
    calibration_file: str = str(CALIBRATION)

    @property
    def cal(self) -> dict:
        return calibration(self.calibration_file)

    def to_dict(self) -> dict:
        return {"error_bound": self.error_bound, "tables": dict(self.tables),
                "schedule": [list(s) for s in self.schedule], "backward": self.backward,
                "iteration": self.iteration}

    def multiplier(self, iteration: int | None = None) -> float:
        """The iteration-wise factor on every bound at ``iteration`` (default: the spec's)."""
        it = self.iteration if iteration is None else iteration
        m = 1.0
        for start, factor in self.schedule:
            if it >= start:
                m = factor
        return m

    def bound(self, table: str, iteration: int | None = None) -> float:
        """Table ``table``'s relative bound at ``iteration``."""
        return min(1.0, dict(self.tables).get(table, self.error_bound)
                   * self.multiplier(iteration))

    def bits_per_value(self, rel: float) -> float:
        b = self.cal["bits_per_value"]
        return max(1.0, b["c0"] + b["c1"] * math.log2(1.0 / rel))

    def ratio(self, rel: float, *, value_bytes: int) -> float:
        """How many times fewer bytes a table sends at relative bound ``rel`` (≥ 1)."""
        return max(1.0, 8.0 * value_bytes / self.bits_per_value(rel))

    def effective_ratio(self, tables, *, value_bytes: int) -> float:
        """All tables' pooled bytes over their compressed bytes; ``tables`` (name, dim) pairs,
        each sending ``dim`` values per sample."""
        raw = sum(d for _, d in tables)
        packed = sum(d / self.ratio(self.bound(n), value_bytes=value_bytes) for n, d in tables)
        return raw / packed if packed > 0 else 1.0

    def throughput_Bps(self, device: str) -> tuple[float, float]:
        """(compress, decompress) bytes of input per second on ``device`` (gpu or cpu)."""
        t = self.cal["throughput_Bps"]["cpu" if device == "cpu" else "gpu"]
        return float(t["compress"]), float(t["decompress"])


def _positive(value, where: str, source: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        v = float("nan")
    if not (math.isfinite(v) and 0.0 < v <= 1.0):
        raise SpecError(f"{where} must be a finite fraction in (0, 1] of the pooled output's σ, "
                        f"got {value!r}", source=source, field=where,
                        fix="write e.g. 0.01 (1% of the pooled values' standard deviation)")
    return v


def parse_compression(doc, *, source: str, table_names: set[str]) -> A2ACompression:
    """``a2a_compression`` of a model spec (SpecError naming the field, exit 2)."""
    if not isinstance(doc, dict):
        raise SpecError(f"expected a mapping, got {doc!r}", source=source,
                        field="a2a_compression", fix="write a2a_compression: {error_bound: 0.01}")
    allowed = {"error_bound", "tables", "schedule", "backward", "iteration", "budget",
               "sensitivity"}
    for key in doc:
        if key not in allowed:
            raise SpecError(f"unknown field {key!r}", source=source,
                            field=f"a2a_compression.{key}",
                            fix=f"use one of: {', '.join(sorted(allowed))}")
    if "budget" in doc:
        eb, tables = _budget_bounds(doc, source, table_names)
    else:
        eb = _positive(doc.get("error_bound"), "a2a_compression.error_bound", source)
        tables = [(str(name), _positive(v, f"a2a_compression.tables.{name}", source))
                  for name, v in _named(doc, "tables", source, table_names).items()]
    schedule = []
    for i, item in enumerate(doc.get("schedule") or []):
        where = f"a2a_compression.schedule[{i}]"
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], int)
                and item[0] >= 0 and isinstance(item[1], (int, float))
                and math.isfinite(item[1]) and item[1] > 0):
            raise SpecError(f"{item!r} is not [from_iteration, factor]", source=source,
                            field=where, fix="write e.g. [[0, 3.0], [20000, 1.0]]")
        schedule.append((int(item[0]), float(item[1])))
    if [s for s, _ in schedule] != sorted({s for s, _ in schedule}):
        raise SpecError("schedule iterations are not increasing", source=source,
                        field="a2a_compression.schedule", fix="list phases in order")
    backward, it = doc.get("backward", False), doc.get("iteration", 0)
    if not isinstance(backward, bool):
        raise SpecError(f"backward must be true or false, got {backward!r}", source=source,
                        field="a2a_compression.backward", fix="write true or false")
    if isinstance(it, bool) or not isinstance(it, int) or it < 0:
        raise SpecError(f"iteration must be a whole number ≥ 0, got {it!r}", source=source,
                        field="a2a_compression.iteration", fix="write e.g. 0")
    return A2ACompression(error_bound=eb, tables=tuple(sorted(tables)),
                          schedule=tuple(schedule), backward=backward, iteration=it)


def _named(doc, key: str, source: str, table_names: set[str]) -> dict:
    """``doc[key]``, a mapping of table names (SpecError for a name the model lacks)."""
    m = doc.get(key) or {}
    if not isinstance(m, dict):
        raise SpecError(f"{key} must map table names to numbers, got {m!r}", source=source,
                        field=f"a2a_compression.{key}", fix="write {table_name: value}")
    for name in m:
        if name not in table_names:
            raise SpecError(f"no table {name!r} in the model", source=source,
                            field=f"a2a_compression.{key}.{name}", fix="name one of its tables")
    return m


def _budget_bounds(doc, source: str, table_names: set[str]) -> tuple[float, list]:
    """(default bound, per-table bounds) chosen under ``budget`` (:func:`bounds_for_budget`)."""
    if "error_bound" in doc or "tables" in doc:
        raise SpecError("budget with error_bound or tables: give bounds or a budget",
                        source=source, field="a2a_compression.budget",
                        fix="drop error_bound/tables (the budget chooses them) or the budget")
    budget = _positive(doc["budget"], "a2a_compression.budget", source)
    sens = {n: 1.0 for n in table_names}
    for name, v in _named(doc, "sensitivity", source, table_names).items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                math.isfinite(v) and v > 0):
            raise SpecError(f"sensitivity of {name} must be a positive number, got {v!r}",
                            source=source, field=f"a2a_compression.sensitivity.{name}",
                            fix="write e.g. 2.0 (twice as sensitive as the default 1)")
        sens[name] = float(v)
    bounds = bounds_for_budget(budget, sens)
    return budget, sorted((n, b) for n, b in bounds.items() if b != budget)


def bounds_for_budget(budget: float, sensitivity: dict[str, float], *, lo: float = 1e-4,
                      hi: float = 0.3) -> dict[str, float]:
    """Per-table relative bounds that send the fewest bytes under ``budget`` (the bytes-weighted
    mean of ``sensitivity × bound``): ``budget / s_t``, clipped to the fitted ``[lo, hi]``.

    >>> bounds_for_budget(0.01, {"a": 1.0, "b": 4.0})
    {'a': 0.01, 'b': 0.0025}
    """
    if not (math.isfinite(budget) and budget > 0):
        raise SpecError(f"error budget {budget!r} is not a positive number",
                        field="a2a_compression.budget", fix="give e.g. 0.01")
    return {t: min(hi, max(lo, budget / s)) for t, s in sensitivity.items()}
