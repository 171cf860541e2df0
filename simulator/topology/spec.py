"""Reading topology YAML: files, built-in names, command-line overrides, typed field access.

A topology is named either by a path to a YAML file or by the name of a file shipped in the
``topologies`` package (``dgx-a100``, ``selene-a100`` ...). Overrides change any field by its dotted
path, so a file states parameters and the command line resizes it::

    selene-a100:nodes=192
    h100-ib:nodes=64,node.nic_bandwidth=200Gb/s

``--gpus N`` on the CLI is shorthand for ``nodes = ceil(N / node.gpus)``.
"""

from __future__ import annotations

import copy
import math
import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

from ..errors import SpecError
from ..fileio import parse_yaml, read_text
from ..units import parse_bandwidth, parse_bytes, parse_time

__all__ = ["Fields", "builtin_topology_names", "read_topology_mapping", "parse_topology_ref"]


def builtin_topology_names() -> list[str]:
    """Names of the topology files shipped in the ``topologies`` package, sorted."""
    root = importlib.resources.files("topologies")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def parse_topology_ref(ref: str) -> tuple[str, dict[str, str]]:
    """Split ``'name:key=value,key2=value2'`` into the name and its overrides."""
    name, _, rest = ref.partition(":")
    if len(name) == 1 and rest.startswith(("\\", "/")):  # a Windows drive letter, not overrides
        name, rest = ref, ""
    overrides: dict[str, str] = {}
    if rest:
        for item in rest.split(","):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise SpecError(f"override {item!r} is not key=value", source="--topology",
                                field=ref, fix="write e.g. selene-a100:nodes=192")
            overrides[key.strip()] = value.strip()
    return name, overrides


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_overrides(doc: dict, overrides: Mapping[str, Any], *, source: str) -> dict:
    """Return a copy of ``doc`` with each dotted key set to its value (strings parsed as YAML)."""
    doc = copy.deepcopy(doc)
    for key, raw in overrides.items():
        value = _yaml_value(raw) if isinstance(raw, str) else raw
        parts = key.split(".")
        cur = doc
        for p in parts[:-1]:
            nxt = cur.get(p)
            if nxt is None:
                nxt = cur[p] = {}
            if not isinstance(nxt, dict):
                raise SpecError(f"cannot override {key!r}: {p!r} is not a mapping", source=source,
                                field=key, fix="override a leaf field such as nodes=16")
            cur = nxt
        cur[parts[-1]] = value
    return doc


def read_topology_mapping(ref: str | Path, overrides: Mapping[str, Any] | None = None
                          ) -> tuple[dict, str]:
    """Load the YAML mapping of a topology file or built-in name; return it and its source name.

    Raises
    ------
    SpecError
        Unknown name, missing file, YAML syntax error or a document that is not a mapping.
    """
    ref = str(ref)
    if not ref.strip():
        raise SpecError("no topology given (empty name)", source="--topology",
                        fix=f"use one of: {', '.join(builtin_topology_names())} or a YAML path")
    name, inline = parse_topology_ref(ref) if not Path(ref).exists() else (ref, {})
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.exists():
            raise SpecError(f"file not found: {name}", source=name, fix="check the path")
        source, text = str(path), read_text(path)
    else:
        names = builtin_topology_names()
        if name not in names:
            raise SpecError(f"unknown topology {name!r}; built-in: {', '.join(names)}",
                            source="--topology", field="name",
                            fix="use a built-in name or a path to a topology YAML file")
        source = f"topologies/{name}.yaml"
        text = (importlib.resources.files("topologies") / f"{name}.yaml").read_text()
    doc = parse_yaml(text, source=source)
    if not isinstance(doc, dict):
        raise SpecError("the document must be a mapping of fields", source=source,
                        fix="see topologies/README.md for the schema")
    merged = dict(inline)
    merged.update(overrides or {})
    return apply_overrides(doc, merged, source=source), source


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
        if choices and value not in choices:
            raise self.err(key, f"{value!r} is not one of {', '.join(choices)}",
                           f"use one of: {', '.join(choices)}")
        return value

    def int(self, key: str, default: Any = None, *, minimum: int = 0,
            maximum: int = 2**31 - 1, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.err(key, f"expected an integer ≥ {minimum}, got {value!r}",
                           f"write a whole number ≥ {minimum}")
        if value > maximum:
            raise self.err(key, f"{value} is larger than the {maximum:,} this field allows",
                           f"write a whole number ≤ {maximum:,}")
        return value

    def float(self, key: str, default: Any = None, *, minimum: float = 0.0,
              exclusive: bool = False, maximum: float | None = None, required: bool = False) -> Any:
        value = self._get(key, default, required)
        if value is None:
            return None
        if isinstance(value, str):  # YAML 1.1 reads 8.5e13 (no dot, no sign) as text
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            ok = (value > minimum if exclusive else value >= minimum) and math.isfinite(value)
            ok = ok and (maximum is None or value <= maximum)
        if not ok:
            rng = f"{'>' if exclusive else '≥'} {minimum}" + (f" and ≤ {maximum}" if maximum else "")
            raise self.err(key, f"expected a number {rng}, got {value!r}", f"write a number {rng}")
        return float(value)

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


_REQUIRED = object()
