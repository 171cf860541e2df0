"""The one validation layer every spec goes through.

Every input file of clusterplan (topologies, workloads, LLM model specs, table specs and CSVs,
sweep grids, plans read back) checks its values here, so the rules and the errors are the same
everywhere: an error names the file (``source``), the field (a dotted path such as
``tables[3].embedding_dim``), the value it got and the fix, and becomes exit code 2 with one line.

* :func:`whole`, :func:`number`, :func:`choice` check one value (types, ranges, choices);
  ``lenient=True`` accepts numbers written as text (CSV cells, YAML 1.1's ``8.5e13``, ``1_000``).
* :class:`Fields` reads a mapping of a spec with them, and checks its keys (unknown fields are
  errors that list the allowed ones) and its sections; cross-field rules live in each spec's
  parser and raise through :meth:`Fields.err`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from simulator.errors import SpecError
from simulator.units import parse_bandwidth, parse_bytes, parse_time

__all__ = ["Fields", "whole", "number", "choice", "as_number"]

_REQUIRED = object()


def as_number(value: Any) -> Any:
    """A number written as text (``"1_000"``, ``" 2.5 "``, ``"8.5e13"``) as int/float; anything
    else unchanged."""
    if isinstance(value, str):
        s = value.strip().replace("_", "")
        try:
            return int(s)
        except ValueError:
            try:
                return float(s)
            except ValueError:
                return value
    return value


def _who(label: str) -> str:
    return f"{label}: " if label else ""


def whole(value: Any, *, source: str | None, field: str, minimum: int = 0,
          maximum: int = 2**31 - 1, what: str | None = None, label: str = "",
          lenient: bool = False) -> int:
    """``value`` as an int in ``[minimum, maximum]``; ``lenient``: also ``"12"`` and ``12.0``."""
    v = as_number(value) if lenient else value
    if lenient and isinstance(v, float) and math.isfinite(v) and v.is_integer():
        v = int(v)
    what = what or field.rsplit(".", 1)[-1]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise SpecError(f"{_who(label)}{what} must be a whole number ≥ {minimum}, got {value!r}",
                        source=source, field=field, fix=f"write a whole number ≥ {minimum}")
    if v > maximum:
        raise SpecError(f"{_who(label)}{what} is {v:,}, larger than the {maximum:,} allowed",
                        source=source, field=field, fix=f"write a whole number ≤ {maximum:,}")
    return v


def number(value: Any, *, source: str | None, field: str, minimum: float = 0.0,
           exclusive: bool = False, maximum: float | None = None, what: str | None = None,
           label: str = "", lenient: bool = False) -> float:
    """``value`` as a finite float ≥ (or > with ``exclusive``) ``minimum`` and ≤ ``maximum``."""
    v = as_number(value) if lenient else value
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    if ok:
        ok = (v > minimum if exclusive else v >= minimum) and math.isfinite(v)
        ok = ok and (maximum is None or v <= maximum)
    if not ok:
        rng = f"{'>' if exclusive else '≥'} {minimum}" + (f" and ≤ {maximum}" if maximum else "")
        what = what or field.rsplit(".", 1)[-1]
        raise SpecError(f"{_who(label)}{what} must be a number {rng}, got {value!r}",
                        source=source, field=field, fix=f"write a number {rng}")
    return float(v)


def choice(value: Any, choices: tuple[str, ...], *, source: str | None, field: str,
           label: str = "", normalise: bool = False) -> str:
    """``value`` if it is one of ``choices`` (``normalise``: trimmed and lower-cased first)."""
    v = value
    if normalise:
        v = str(value).strip().lower() if value is not None else ""
    if v not in choices:
        raise SpecError(f"{_who(label)}{value!r} is not one of {', '.join(choices)}",
                        source=source, field=field, fix=f"use one of: {', '.join(choices)}")
    return v


@dataclass(frozen=True, slots=True)
class Fields:
    """Typed access to one mapping of a spec, with errors that name the source and the field."""

    data: Mapping[str, Any]
    source: str
    prefix: str = ""

    def path(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def err(self, key: str, message: str, fix: str) -> SpecError:
        return SpecError(message, source=self.source, field=self.path(key), fix=fix)

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def sub(self, key: str, *, required: bool = False) -> "Fields":
        value = self.data.get(key)
        if value is None:
            if required:
                raise self.err(key, "missing section", f"add a '{key}:' mapping")
            value = {}
        if not isinstance(value, Mapping):
            raise self.err(key, f"expected a mapping, got {value!r}", f"make '{key}' a mapping")
        return Fields(value, self.source, self.path(key))

    def check_keys(self, allowed: set[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.err(str(key), f"unknown field {key!r}",
                               f"remove it or use one of: {', '.join(sorted(allowed))}")

    def _get(self, key: str, default: Any, required: bool) -> Any:
        if key not in self.data or self.data[key] is None:
            if required or default is _REQUIRED:
                raise self.err(key, "missing field", f"add '{key}'")
            return default
        return self.data[key]

    def str(self, key: str, default: Any = None, *, choices: tuple[str, ...] | None = None,
            required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.err(key, f"expected text, got {value!r}", "write a string")
        return choice(value, choices, source=self.source, field=self.path(key)) if choices \
            else value

    def int(self, key: str, default: Any = None, *, minimum: int = 0,
            maximum: int = 2**31 - 1, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        return whole(value, source=self.source, field=self.path(key), minimum=minimum,
                     maximum=maximum)

    def float(self, key: str, default: Any = None, *, minimum: float = 0.0,
              exclusive: bool = False, maximum: float | None = None, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        # YAML 1.1 reads 8.5e13 (no dot, no sign) as text: numbers in text are accepted
        return number(value, source=self.source, field=self.path(key), minimum=minimum,
                      exclusive=exclusive, maximum=maximum, lenient=True)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self._get(key, default, False)
        if not isinstance(value, bool):
            raise self.err(key, f"expected true or false, got {value!r}", "write true or false")
        return value

    def bandwidth(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        try:
            return parse_bandwidth(value)
        except SpecError as e:
            raise self.err(key, e.message, e.fix or "") from None

    def time(self, key: str, default: Any = 0.0, *, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        try:
            return parse_time(value)
        except SpecError as e:
            raise self.err(key, e.message, e.fix or "") from None

    def bytes(self, key: str, default: Any = None, *, required: bool = False,
              maximum: float = 2.0**60) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        try:
            n = parse_bytes(value)
        except SpecError as e:
            raise self.err(key, e.message, e.fix or "") from None
        if n > maximum:
            raise self.err(key, f"{value!r} is more than {maximum:.3g} bytes",
                           "check the unit (e.g. 650 MB, 20 GB)")
        return n
