"""Progress bars for long jobs (rich), on stderr, only where a person is watching.

A bar appears when stderr is a terminal and ``CLUSTERPLAN_PROGRESS`` is not ``0``; in pipes,
CI and tests nothing is printed, so ``--json`` output and logs stay clean. ``CLUSTERPLAN_PROGRESS=1``
forces bars on.
"""

from __future__ import annotations

import os
import sys
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

__all__ = ["enabled", "progress", "track"]

T = TypeVar("T")


def enabled() -> bool:
    flag = os.environ.get("CLUSTERPLAN_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return sys.stderr.isatty()


@contextmanager
def progress(total: int | None, description: str) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n=1)``; draws a rich bar (elapsed, remaining) while the block runs."""
    if not enabled():
        yield lambda n=1: None
        return
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn()]
    with Progress(*cols, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def track(items: Iterable[T], total: int | None, description: str) -> Iterator[T]:
    """Iterate ``items`` with a bar (see :func:`progress`)."""
    with progress(total, description) as advance:
        for item in items:
            yield item
            advance(1)


class Bar:
    """A bar driven by absolute updates (``update(done)``), for loops that poll; ``close()``
    always (a no-op when bars are off)."""

    def __init__(self, total: int | None, description: str) -> None:
        self._p = None
        if enabled():
            self._p = Progress(TextColumn("{task.description}"), BarColumn(),
                               MofNCompleteColumn(), TimeElapsedColumn(),
                               console=Console(stderr=True), transient=True)
            self._p.start()
            self._task = self._p.add_task(description, total=total)

    def update(self, done: int) -> None:
        if self._p is not None:
            self._p.update(self._task, completed=done)

    def close(self) -> None:
        if self._p is not None:
            self._p.stop()
            self._p = None
