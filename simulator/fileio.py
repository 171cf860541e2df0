"""Reading YAML specs and writing output files, with the project's error rules.

Every spec loader parses YAML through :func:`parse_yaml` (a syntax error names the file, the line
and the column, exit 2), and every output goes through :func:`atomic_write_text` (a temporary
file in the same folder renamed into place, so nothing is ever half-written).
"""

from __future__ import annotations

import gc
import importlib.resources
import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import SpecError

__all__ = ["parse_yaml", "parse_json", "dumps_json", "read_text", "read_json_file", "check_input_file",
           "check_writable", "atomic_write_text", "builtin_names", "read_spec_mapping",
           "MAX_SPEC_BYTES", "MAX_TRACE_BYTES"]


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


_STR, _SEQ, _MAP = (f"tag:yaml.org,2002:{kind}" for kind in ("str", "seq", "map"))
_SCALARS = frozenset(f"tag:yaml.org,2002:{kind}" for kind in ("null", "bool", "int", "float"))


class _Unusual(Exception):
    """A node :func:`_plain` leaves to PyYAML's constructor: a merge key, another tag, a
    sequence or mapping used as a key."""


def _plain(loader: Any, node: yaml.Node) -> Any:
    """The object under ``node`` of a document without anchors, built as ``construct_document``
    builds it but directly: strings, lists and dicts here, null/bool/int/float by the loader's own
    constructors. A 16,384-line topology is 150,000 nodes, and the generic constructor spends
    about 1 µs of bookkeeping on each."""
    tag = node.tag
    if isinstance(node, yaml.ScalarNode):
        if tag == _STR:
            return node.value
        if tag in _SCALARS:
            return loader.construct_object(node)
    elif tag == _SEQ and isinstance(node, yaml.SequenceNode):
        return [_plain(loader, item) for item in node.value]
    elif tag == _MAP and isinstance(node, yaml.MappingNode):
        out = {}
        for key, value in node.value:
            if not isinstance(key, yaml.ScalarNode):
                raise _Unusual
            out[_plain(loader, key)] = _plain(loader, value)
        return out
    raise _Unusual


def parse_yaml(text: str, *, source: str) -> Any:
    """``yaml.safe_load`` (through :data:`SAFE_LOADER`) with a located :class:`SpecError` on a
    syntax error, and on a document that expands to more than :data:`MAX_EXPANDED_VALUES`."""
    collecting = gc.isenabled()
    gc.disable()   # the node tree holds no cycles; collecting while it grows tripled the parse
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
            if "&" not in text:
                try:
                    return _plain(loader, node)
                except _Unusual:
                    pass
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except RecursionError:
        raise SpecError("the YAML document is nested too deeply", source=source,
                        fix="flatten the document (a spec is a few levels deep)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = getattr(exc, "problem", None)
        detail = f": {problem}" if problem else ""
        raise SpecError(f"YAML syntax error at {where}{detail}", source=source,
                        fix="fix the YAML syntax (indentation, colons, quotes)") from None
    finally:
        if collecting:
            gc.enable()


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


#: the largest spec, plan or table file read (bytes): a 16,384-GPU topology is ~5 MB and a
#: million-table CSV ~60 MB; more is a wrong file (or /dev/zero), refused before it is read
MAX_SPEC_BYTES = 256 * 2**20
#: the largest trace read (Perfetto / Kineto JSON of a whole training step)
MAX_TRACE_BYTES = 2 * 2**30


def check_input_file(path: str | Path, *, max_bytes: int = MAX_SPEC_BYTES,
                     field: str | None = None, missing_fix: str | None = None) -> Path:
    """``path`` when it is a regular file of at most ``max_bytes``; else a SpecError (exit 2)
    naming it: missing, a folder, a FIFO or device (which would block or never end), too big."""
    p = Path(path)
    source = str(p) or "."
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SpecError("no such file", source=source, field=field,
                        fix=missing_fix or "check the path") from None
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", source=source, field=field,
                        fix="check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError("is a directory, not a file", source=source, field=field,
                        fix="pass the path of a file inside it")
    if not stat.S_ISREG(st.st_mode):
        raise SpecError("is not a regular file (a pipe, socket or device)", source=source,
                        field=field, fix="save the input to a file and pass its path")
    if st.st_size > max_bytes:
        raise SpecError(f"is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for this "
                        "kind of input", source=source, field=field,
                        fix="check that this is the right file")
    return p


def read_text(path: str | Path, *, max_bytes: int = MAX_SPEC_BYTES, field: str | None = None,
              missing_fix: str | None = None) -> str:
    """A text input's contents through :func:`check_input_file`; SpecError (exit 2) for a file
    that is not UTF-8 or cannot be read."""
    p = check_input_file(path, max_bytes=max_bytes, field=field, missing_fix=missing_fix)
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as e:
        raise SpecError(f"cannot read: {e.strerror}", source=str(p), field=field,
                        fix="check the path and its permissions") from None
    if len(data) > max_bytes:              # it grew after the check
        raise SpecError(f"is over the {max_bytes:,}-byte limit for this kind of input",
                        source=str(p), field=field, fix="check that this is the right file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise SpecError(f"is not UTF-8 text (byte {e.start})", source=str(p), field=field,
                        fix="pass a text file (YAML, JSON or CSV) saved as UTF-8") from None


def parse_json(text: str, *, source: str, field: str | None = None,
               fix: str = "pass a JSON file written by clusterplan") -> Any:
    """``json.loads`` with a located SpecError for bad JSON, and for JSON nested too deep to
    parse; NaN and Infinity are refused (not JSON)."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not a JSON value")
    try:
        return json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(f"not JSON: {exc.msg}", source=source,      # the place, not the flag
                        field=f"line {exc.lineno} column {exc.colno}", fix=fix) from None
    except RecursionError:
        raise SpecError("not JSON this program reads: nested too deeply", source=source,
                        field=field, fix=fix) from None
    except ValueError as exc:
        raise SpecError(f"not JSON: {exc}", source=source, field=field, fix=fix) from None


def _first_non_finite(doc: Any, path: str = "") -> str | None:
    if isinstance(doc, float) and not math.isfinite(doc):
        return path or "(the document)"
    if isinstance(doc, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in doc.items())
    elif isinstance(doc, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(doc))
    else:
        return None
    for p, v in items:
        found = _first_non_finite(v, p)
        if found:
            return found
    return None


def dumps_json(doc: Any, *, source: str = "the result", **kw) -> str:
    """``json.dumps(doc, **kw)`` that refuses NaN and Infinity (not JSON: most readers reject
    them) with a SpecError naming the first such field, instead of writing them."""
    try:
        return json.dumps(doc, allow_nan=False, **kw)
    except ValueError:
        where = _first_non_finite(json.loads(json.dumps(doc, **kw)))
        raise SpecError("a result is not a finite number (the inputs' magnitudes overflow "
                        "the model)", source=source, field=where,
                        fix="check the inputs for values far outside what training sees") \
            from None


def read_json_file(path: str | Path, *, field: str, missing_fix: str, json_fix: str,
                   max_bytes: int = MAX_SPEC_BYTES) -> Any:
    """A JSON file's document; SpecError (exit 2) naming the file and ``field`` when it is
    missing (``missing_fix``: how to make one), unreadable, or not JSON (``json_fix``)."""
    text = read_text(path, max_bytes=max_bytes, field=field, missing_fix=missing_fix)
    return parse_json(text, source=str(path), field=field, fix=json_fix)


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
