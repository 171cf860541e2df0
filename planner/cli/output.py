"""What every command writes: one JSON object with ``--json`` or text for people, files written
atomically, progress lines on stderr. A leaf: it imports no command.

Results never carry wall-clock time (same inputs, same bytes): the entries named in
:data:`TIMING_KEYS` are split off every result and go to ``--timings FILE`` as JSON, or to one
``timings:`` line on stderr."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from simulator.errors import SpecError
from simulator.fileio import atomic_write_text, check_writable, dumps_json

__all__ = ["emit", "atomic_write", "write_json", "progress_line", "TIMING_KEYS",
           "split_timings", "report_timings", "add_timings_option"]

#: result entries that measure this run's wall clock (seconds, or rates from them): they differ
#: from run to run, so they are reported apart from the result
TIMING_KEYS = frozenset({"wall_s", "events_per_s", "timings_s", "solve_s", "candidates_time_s"})


def split_timings(doc: Any, path: str = "") -> tuple[Any, dict[str, Any]]:
    """``doc`` without its :data:`TIMING_KEYS` entries (at any depth), and those entries by
    dotted path (``search.wall_s``)."""
    found: dict[str, Any] = {}
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            where = f"{path}.{k}" if path else str(k)
            if k in TIMING_KEYS:
                found[where] = v
            else:
                out[k], inner = split_timings(v, where)
                found.update(inner)
        return out, found
    if isinstance(doc, list):
        out_l = []
        for i, v in enumerate(doc):
            item, inner = split_timings(v, f"{path}[{i}]")
            out_l.append(item)
            found.update(inner)
        return out_l, found
    return doc, found


def add_timings_option(p: argparse.ArgumentParser) -> None:
    """``--timings FILE``: where this command's wall-clock figures go (checked as the
    arguments are parsed, before any work)."""
    p.add_argument("--timings", metavar="FILE", type=_writable_timings,
                   help="write this run's wall-clock timings (seconds) here as JSON; without "
                        "it they go to one line on stderr, never into the result")


def _writable_timings(text: str) -> str:
    try:
        check_writable(text, field="--timings")
    except SpecError as exc:
        raise argparse.ArgumentTypeError(f"{exc.message} (fix: {exc.fix})") from None
    return text


def report_timings(args: argparse.Namespace, timings: dict[str, Any]) -> None:
    """Write ``timings`` to ``--timings FILE`` (JSON), else as one ``timings:`` stderr line."""
    if not timings:
        return
    path = getattr(args, "timings", None)
    if path:
        atomic_write_text(path, dumps_json(timings, indent=2, default=_jsonable) + "\n",
                          field="--timings")
        return
    flat = {k: v for k, v in timings.items() if isinstance(v, (int, float))}
    if flat:
        progress_line("timings: " + ", ".join(f"{k} {v:.3g}" for k, v in flat.items()))


def emit(args: argparse.Namespace, data: dict, human: str,
         timings: dict[str, Any] | None = None) -> None:
    """Print ``data`` as JSON when ``--json`` was given, else the human text; its wall-clock
    entries, and ``timings`` split off earlier, go to :func:`report_timings`."""
    data, found = split_timings(data)
    if getattr(args, "json", False):
        print(dumps_json(data, indent=2, default=_jsonable))
    else:
        print(human)
    report_timings(args, {**(timings or {}), **found})


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
    atomic_write_text(path, dumps_json(doc, indent=2, ensure_ascii=False) + "\n")


def progress_line(msg: str) -> None:
    """One progress line on stderr (stdout stays the command's result)."""
    print(msg, file=sys.stderr, flush=True)
