"""Reading YAML specs and writing output files, with the project's error rules.

Every spec loader parses YAML through :func:`parse_yaml` (a syntax error names the file, the line
and the column, exit 2), and every output goes through :func:`atomic_write_text` (a temporary
file in the same folder renamed into place, so nothing is ever half-written).
"""

from __future__ import annotations

import importlib.resources
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import SpecError

__all__ = ["parse_yaml", "check_writable", "atomic_write_text", "builtin_names",
           "read_spec_mapping"]


#: libyaml's safe loader where PyYAML was built with it (a 16,384-link topology in 0.85 s
#: instead of 4.2 s), else the pure-Python one; both build the same objects
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


#: values a document may expand to, aliases counted at every use: a 16,384-link topology has
#: about 150,000; an alias bomb of 1 KB has billions, which any walk over it (validation, an
#: error message) would never finish
MAX_EXPANDED_VALUES = 5_000_000


def _expanded_size(root: yaml.Node) -> int:
    """Values in the document under ``root`` with every alias expanded (shared nodes counted
    at each use), computed over the distinct nodes only."""
    size: dict[int, int] = {}
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in size:
            continue
        kids = []
        if isinstance(node, yaml.SequenceNode):
            kids = node.value
        elif isinstance(node, yaml.MappingNode):
            kids = [n for pair in node.value for n in pair]
        if done or not kids:
            size[id(node)] = 1 + sum(size[id(k)] for k in kids)
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)
    return size[id(root)]


def parse_yaml(text: str, *, source: str) -> Any:
    """``yaml.safe_load`` (through :data:`SAFE_LOADER`) with a located :class:`SpecError` on a
    syntax error, and on a document that expands to more than :data:`MAX_EXPANDED_VALUES`."""
    try:
        loader = SAFE_LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            # without an anchor ('&') no node is shared, and the size is the node count
            if "&" in text and _expanded_size(node) > MAX_EXPANDED_VALUES:
                raise SpecError(f"the document expands to more than {MAX_EXPANDED_VALUES:,} "
                                "values (YAML aliases used over and over)", source=source,
                                fix="write the values out, or use fewer nested aliases")
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None)
        detail = f": {problem}" if problem else ""
        raise SpecError(f"YAML syntax error at {where}{detail}", source=source,
                        fix="fix the YAML syntax (indentation, colons, quotes)") from None


def _new_file_mode(target: Path) -> int:
    """The permission bits a plain ``open(target, "w")`` would leave: the existing file's, or
    0666 less the umask (a temporary file starts at 0600)."""
    try:
        return target.stat().st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check_writable(path: str | Path, *, field: str = "--out") -> Path:
    """The file ``path`` names (symbolic links followed), or a :class:`SpecError` when it is a
    folder or its folder does not exist: callers check before long work, not after it."""
    p = Path(path)
    target = p.resolve()
    if target.is_dir():
        raise SpecError(f"{str(p)!r} is a folder", field=field,
                        fix=f"give a file path inside it, e.g. {p / 'out.json'}")
    if not target.parent.is_dir():
        raise SpecError(f"folder {str(p.parent)!r} does not exist", field=field,
                        fix="create the folder or give another path")
    return target


def atomic_write_text(path: str | Path, text: str, *, field: str = "--out") -> Path:
    """Write ``text`` to ``path`` atomically, never half a file: a missing folder or a folder
    given as the file is a :class:`SpecError`; a symbolic link is written through (its target
    replaced, the link kept); the file gets the mode a plain write would give it."""
    p = Path(path)
    target = check_writable(p, field=field)
    folder = target.parent
    mode = _new_file_mode(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def builtin_names(package: str) -> list[str]:
    """Names of the ``*.yaml`` files shipped in ``package``, sorted."""
    root = importlib.resources.files(package)
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def read_text(path: str | Path) -> str:
    """A spec file's text; SpecError (exit 2) for a directory, an unreadable or a binary file."""
    path = Path(path)
    if path.is_dir():
        raise SpecError("is a directory, not a spec file", source=str(path) or ".",
                        fix="pass the path of a YAML or CSV file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError("is not UTF-8 text", source=str(path),
                        fix="pass a YAML or CSV text file") from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", source=str(path),
                        fix="check the path and its permissions") from None


def read_json_file(path: str | Path, *, field: str, missing_fix: str, json_fix: str) -> Any:
    """A JSON file's document; SpecError (exit 2) naming the file and ``field`` when it is
    missing (``missing_fix``: how to make one), unreadable, or not JSON (``json_fix``)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise SpecError("no such file", source=source, field=field, fix=missing_fix) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read: {exc.__class__.__name__}", source=source, field=field,
                        fix="pass a readable JSON file") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"not JSON: {exc.msg}", source=source,
                        field=f"line {exc.lineno} column {exc.colno}", fix=json_fix) from None


def read_spec_mapping(ref: str | Path, *, package: str, what: str, fix: str) -> tuple[dict, str]:
    """Load a YAML spec given by path or by built-in name in ``package``; return it and its source.

    ``what`` names the kind of spec in errors ("model", "workload"); ``fix`` says what a valid
    document starts with when it is not a mapping.
    """
    ref = str(ref)
    if not ref.strip():
        raise SpecError(f"no {what} given (empty name)", source=what,
                        fix=f"pass a YAML path or one of: {', '.join(builtin_names(package))}")
    path = Path(ref)
    if path.exists():
        source, text = str(path), read_text(path)
    elif ref in builtin_names(package):
        source = f"{package.replace('.', '/')}/{ref}.yaml"
        text = (importlib.resources.files(package) / f"{ref}.yaml").read_text()
    else:
        raise SpecError(f"no {what} file or built-in {what} named {ref!r}", source=ref,
                        fix=f"pass a YAML path or one of: {', '.join(builtin_names(package))}")
    doc = parse_yaml(text, source=source)
    if not isinstance(doc, dict):
        raise SpecError("the document must be a mapping", source=source, fix=fix)
    return doc, source
