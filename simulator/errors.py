"""User-facing errors: every one names where the problem is, what is wrong and how to fix it.

The CLI turns a :class:`SpecError` into one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

__all__ = ["ClusterplanError", "SpecError", "SimulationError", "clip"]


#: the longest part (place, message, fix) of an error line: a bad value is quoted, and a value
#: can be a megabyte of text
MAX_PART_CHARS = 400


def clip(text: str, limit: int = MAX_PART_CHARS) -> str:
    """``text`` up to ``limit`` characters, the rest replaced by a count."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


class ClusterplanError(Exception):
    """Base class of every error clusterplan reports to a user (exit code 2 in the CLI)."""

    exit_code = 2


class SpecError(ClusterplanError):
    """Bad input: a file, a field in it, what is wrong with its value, and the fix.

    Parameters
    ----------
    message:
        What is wrong, with the offending value.
    source:
        The file (or ``"--flag"`` / built-in name) the value came from.
    field:
        Dotted path of the field inside the source, e.g. ``links[3].bandwidth``.
    fix:
        One sentence telling the user what to do.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None,
                 fix: str | None = None) -> None:
        self.message = message
        self.source = source
        self.field = field
        self.fix = fix
        super().__init__(self.render())

    def render(self) -> str:
        where = ": ".join(clip(p) for p in (self.source, self.field) if p)
        text = f"{where}: {clip(self.message)}" if where else clip(self.message)
        if self.fix:
            text += f" (fix: {clip(self.fix)})"
        return text

    def at(self, *, source: str | None = None, field_prefix: str | None = None) -> "SpecError":
        """Return a copy located in ``source`` with ``field_prefix`` prepended to the field."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return SpecError(self.message, source=source or self.source, field=field, fix=self.fix)


class SimulationError(ClusterplanError):
    """The simulation cannot complete: a deadlock, an unroutable flow, an unhandled fault."""
