"""A sweep file: one ``clusterplan`` command run over a grid of argument values.

.. code-block:: yaml

    command: [collective, allreduce]     # the subcommand and its positional arguments
    args: {--topology: h100-ib}          # fixed options, the same at every point
    grid:                                # cartesian product of these option values
      --size: [1MiB, 64MiB, 1GiB]
      --ranks: [8, 64, 512]
    zip:                                 # optional: lists of equal length, taken side by side
      --algo: [ring, tree]               #   (each zipped tuple is one more grid axis)
    keep: [time_s, busbw_Bps]            # optional: JSON keys of the result to keep
                                         #   (dotted paths; default: every top-level number/text)
    plot: {x: size, y: time_s, hue: ranks, logx: true, logy: true}   # optional

Every point runs ``clusterplan COMMAND... ARGS... GRID-VALUES... --json``; the command's JSON
becomes one row of the result table. Options given without a value (flags) are written
``--flag: true``. Keys of ``args``/``grid`` must be options (``--name``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.errors import SpecError
from simulator.fileio import parse_yaml, read_text
from simulator.validation import Fields

__all__ = ["SweepSpec", "Point", "load_sweep", "parse_sweep", "points", "MAX_POINTS"]

#: refuse grids larger than this (a typo in a list multiplies the work)
MAX_POINTS = 100_000
_KEYS = {"command", "args", "grid", "zip", "keep", "plot", "description"}
_PLOT_KEYS = {"x", "y", "hue", "logx", "logy", "title"}


@dataclass(frozen=True)
class SweepSpec:
    command: tuple[str, ...]
    args: dict[str, Any]
    grid: dict[str, list[Any]]
    zip: dict[str, list[Any]] = field(default_factory=dict)
    keep: tuple[str, ...] | None = None
    plot: dict[str, Any] | None = None
    source: str = "<sweep>"


@dataclass(frozen=True)
class Point:
    """One run: its index in grid order, the varied values, and the full argv."""

    index: int
    params: dict[str, Any]
    argv: tuple[str, ...]

    @property
    def key(self) -> str:
        """Stable identity of the run (resuming matches finished points by it)."""
        return hashlib.sha256(json.dumps(self.argv).encode()).hexdigest()[:16]


def load_sweep(path: str | Path) -> SweepSpec:
    text = read_text(path)
    return parse_sweep(parse_yaml(text, source=str(path)), source=str(path))


def parse_sweep(doc: Any, *, source: str) -> SweepSpec:
    if not isinstance(doc, dict):
        raise SpecError("the document must be a mapping", source=source,
                        fix="write command:, args:, grid: (see planner/sweep/grid.py)")
    f = Fields(doc, source)
    f.check_keys(_KEYS)
    cmd = doc.get("command")
    if isinstance(cmd, str):
        cmd = cmd.split()
    if not (isinstance(cmd, list) and cmd and all(isinstance(c, (str, int, float)) for c in cmd)):
        raise f.err("command", f"expected the subcommand as a list, got {cmd!r}",
                    "write e.g. command: [collective, allreduce]")
    if str(cmd[0]) == "sweep":
        raise f.err("command", "a sweep cannot run sweeps", "name another subcommand")
    args = _options(f, "args", lists=False)
    grid = _options(f, "grid", lists=True)
    zipped = _options(f, "zip", lists=True)
    if zipped and len({len(v) for v in zipped.values()}) != 1:
        raise f.err("zip", "the zip lists have different lengths "
                    f"({', '.join(f'{k}: {len(v)}' for k, v in zipped.items())})",
                    "give every zip list the same number of values")
    both = (set(args) & set(grid)) | (set(args) & set(zipped)) | (set(grid) & set(zipped))
    if both:
        name = sorted(both)[0]
        raise f.err(name, f"option {name} is given in more than one of args/grid/zip",
                    "keep it in one place")
    if not grid and not zipped:
        raise f.err("grid", "nothing to sweep", "add grid: {--option: [value, ...]}")
    keep = doc.get("keep")
    if keep is not None and not (isinstance(keep, list) and keep
                                 and all(isinstance(k, str) for k in keep)):
        raise f.err("keep", f"expected a list of JSON keys, got {keep!r}",
                    "write e.g. keep: [step_time_s, mfu]")
    plot = doc.get("plot")
    if plot is not None:
        pf = f.sub("plot")
        pf.check_keys(_PLOT_KEYS)
        pf.str("x", required=True)
        pf.str("y", required=True)
        pf.str("hue")
    spec = SweepSpec(command=tuple(str(c) for c in cmd), args=args, grid=grid, zip=zipped,
                     keep=tuple(keep) if keep else None, plot=plot, source=source)
    n = 1
    for v in grid.values():
        n *= len(v)
    n *= len(next(iter(zipped.values()))) if zipped else 1
    if n > MAX_POINTS:
        raise f.err("grid", f"{n:,} points, more than the {MAX_POINTS:,} allowed",
                    "shorten the lists or split the sweep")
    return spec


def _options(f: Fields, key: str, *, lists: bool) -> dict[str, Any]:
    sub = f.sub(key)
    out: dict[str, Any] = {}
    for name, value in sub.data.items():
        if not (isinstance(name, str) and name.startswith("--") and len(name) > 2):
            raise sub.err(str(name), f"{name!r} is not an option",
                          "write options with their dashes, e.g. --size")
        if lists:
            if not isinstance(value, list) or not value:
                raise sub.err(name, f"expected a non-empty list of values, got {value!r}",
                              f"write {name}: [a, b, ...]")
            for v in value:
                _scalar(sub, name, v)
        else:
            _scalar(sub, name, value)
        out[name] = value
    return out


def _scalar(f: Fields, name: str, v: Any) -> None:
    if isinstance(v, bool) or isinstance(v, (int, float, str)):
        return
    raise f.err(name, f"expected a number, text or true/false, got {v!r}",
                "write one plain value per entry")


def _argv(options: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, v in options.items():
        if v is True:
            out.append(name)
        elif v is False:
            continue
        else:
            out += [name, str(v)]
    return out


def points(spec: SweepSpec) -> list[Point]:
    """Every run of the sweep, in a fixed order (grid axes in file order, then zip)."""
    axes = [[(k, v) for v in vals] for k, vals in spec.grid.items()]
    if spec.zip:
        names = list(spec.zip)
        axes.append([tuple(zip(names, combo)) for combo in zip(*spec.zip.values())])
    out = []
    for i, combo in enumerate(itertools.product(*axes)):
        params: dict[str, Any] = {}
        for item in combo:
            if item and isinstance(item[0], tuple):
                params.update(dict(item))
            else:
                params[item[0]] = item[1]
        argv = [*spec.command, *_argv(spec.args), *_argv(params), "--json"]
        out.append(Point(index=i, params={k.lstrip("-"): v for k, v in params.items()},
                         argv=tuple(argv)))
    return out
