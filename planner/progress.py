"""Progress of long jobs, on stderr (stdout stays the command's result, ``--json`` included).

On a terminal a bar (rich) is drawn while the job runs. Elsewhere (a pipe, a log, CI) a job that
takes longer than :data:`LINE_EVERY_S` prints one plain line per that many seconds
(``plan: 1,200/2,402 after 30 s``), so long work is never silent; short jobs print nothing.
``CLUSTERPLAN_PROGRESS=1`` forces bars on, ``CLUSTERPLAN_PROGRESS=0`` turns everything off.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["enabled", "progress", "track", "stages", "each", "Bar", "LINE_EVERY_S"]

T = TypeVar("T")

#: seconds between plain progress lines where no bar is drawn
LINE_EVERY_S = 10.0


def enabled() -> bool:
    """Whether bars are drawn (a terminal, or ``CLUSTERPLAN_PROGRESS=1``)."""
    flag = os.environ.get("CLUSTERPLAN_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return sys.stderr.isatty()


def _silenced() -> bool:
    return os.environ.get("CLUSTERPLAN_PROGRESS") in ("0", "false", "no")


class _Lines:
    """Plain progress lines every :data:`LINE_EVERY_S` seconds (no terminal, not silenced)."""

    def __init__(self, total: int | None, description: str) -> None:
        self.total, self.description = total, description
        self.t0 = self.last = time.monotonic()
        self.done = 0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if now - self.last >= LINE_EVERY_S:
            self.last = now
            of = f"/{self.total:,}" if self.total else ""
            print(f"{self.description}: {done:,}{of} after {now - self.t0:.0f} s",
                  file=sys.stderr, flush=True)


@contextmanager
def progress(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n=1)``; draws a rich bar (elapsed, remaining) while the block runs, or
    prints a plain line now and then where there is no terminal."""
    if not enabled():
        if _silenced():
            yield lambda n=1: None
            return
        lines = _Lines(total, description)
        yield lambda n=1: lines.update(lines.done + n)
        return
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*cols, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


@contextmanager
def stages(description: str, total: int, *, quiet: bool = False
           ) -> Iterator[Callable[[str], None]]:
    """Yield ``stage(name)`` for a job of ``total`` stages: on a terminal a bar naming the stage;
    elsewhere one line per stage (``plan mip: 2/3 model build after 0.4 s``), unless ``quiet``
    (a job known to be short) or progress is silenced."""
    t0 = time.monotonic()
    if not enabled():
        count = [0]

        def line(name: str) -> None:
            count[0] += 1
            if not quiet and not _silenced():
                print(f"{description}: {count[0]}/{total} {name} after "
                      f"{time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        yield line
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)

        def advance(name: str) -> None:
            bar.update(task, description=f"{description}: {name}",
                       completed=min(total, bar.tasks[0].completed + 1))
        yield advance


def track(items: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    """Iterate ``items`` with a bar (see :func:`progress`)."""
    with progress(total, description) as advance:
        for item in items:
            yield item
            advance(1)


def each(items: Iterable[T], description: str, label: Callable[[T], str] = str) -> Iterator[T]:
    """Iterate ``items`` as the stages of a job (:func:`stages`): a line naming each one
    (``label(item)``) as it starts, elapsed seconds included, also where there is no terminal
    (a notebook, a log): for sweeps whose points take seconds to minutes each."""
    items = list(items)
    with stages(description, len(items)) as stage:
        for item in items:
            stage(label(item))
            yield item


class Bar:
    """A bar driven by absolute updates (``update(done)``), for loops that poll; ``close()``
    always (a no-op when bars are off)."""

    def __init__(self, total: int | None, description: str) -> None:
        self._p = None
        self._lines = None if enabled() or _silenced() else _Lines(total, description)
        if enabled():
            self._p = Progress(TextColumn("{task.description}"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(),
                               console=Console(stderr=True), transient=True)
            self._p.start()
            self._task = self._p.add_task(description, total=total)

    def update(self, done: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=done)
        elif self._lines is not None:
            self._lines.update(done)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
