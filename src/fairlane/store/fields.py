"""Reading a job record's fields for display: as they are, never failing.

A record read to be shown (a job's ``info()``, ``explain``, a run's view, the
dashboard) may hold fields damaged outside Fairlane, which a worker dead-letters as
``MalformedJob`` (``store/lua/lease.lua``). A reader shows what parses and leaves the
rest at its default, so one bad field hides nothing else. The scripts and the worker
read strictly; these are for readers only.
"""

from __future__ import annotations

from typing import Any, overload

__all__ = ["field_int", "field_text"]


def field_text(value: Any, default: str = "") -> str:
    """A field as text (bytes that are not UTF-8 shown with replacement characters)."""
    if value is None:
        return default
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


@overload
def field_int(value: Any) -> int | None: ...
@overload
def field_int(value: Any, default: int) -> int: ...
def field_int(value: Any, default: int | None = None) -> int | None:
    """A field as a whole number (a fraction is cut), else ``default``."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        return int(float(field_text(value)))
    except (ValueError, OverflowError):
        return default
