"""What every command writes: one JSON object with ``--json`` or text for people, files written
atomically, progress lines on stderr. A leaf: it imports no command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from simulator.fileio import atomic_write_text

__all__ = ["emit", "atomic_write", "write_json", "progress_line"]


def emit(args: argparse.Namespace, data: dict, human: str) -> None:
    """Print ``data`` as JSON when ``--json`` was given, else the human text."""
    if getattr(args, "json", False):
        print(json.dumps(data, indent=2, default=_jsonable))
    else:
        print(human)


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def atomic_write(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file: never half a file."""
    atomic_write_text(path, text)


def write_json(path: str | Path, doc: dict) -> None:
    """``doc`` as indented UTF-8 JSON with a final newline, written atomically."""
    atomic_write_text(path, json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


def progress_line(msg: str) -> None:
    """One progress line on stderr (stdout stays the command's result)."""
    print(msg, file=sys.stderr, flush=True)
