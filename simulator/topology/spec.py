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
import importlib.resources
from pathlib import Path
from typing import Any, Mapping

import yaml

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text

__all__ = ["builtin_topology_names", "read_topology_mapping", "parse_topology_ref"]


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
    """Return a copy of ``doc`` with each dotted key set to its value (strings parsed as YAML);
    ``doc`` itself when there is nothing to override."""
    if not overrides:
        return doc
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


