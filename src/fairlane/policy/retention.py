"""How long finished job records are kept: by count and by age, per task.

A record is removed when either bound is exceeded: more than ``count`` newer
records of the same task and outcome exist, or it finished more than ``age``
ago. ``None`` for a bound means unbounded; a task must ask for that explicitly
(``Retention(completed=None)``) -- the defaults bound both.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

__all__ = ["DEFAULT_AUDIT_ENTRIES", "Keep", "Retention", "parse_duration"]

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(value: str | float | int | timedelta) -> float:
    """Seconds from a number or a string such as ``"500ms"``, ``"90s"``, ``"12h"``, ``"7d"``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value)
        if match is None:
            raise ValueError(f"not a duration: {value!r} (use e.g. '90s', '15m', '12h', '7d')")
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {value!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Keep:
    """Bounds for one outcome's records: at most ``count`` of them, none older than ``age`` s."""

    count: int | None
    age: float | None

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 0:
            raise ValueError(f"retention count must be >= 0, got {self.count}")

    @classmethod
    def of(cls, spec: KeepSpec) -> Keep:
        """``1000`` keeps a count, ``"7d"`` keeps an age, ``(1000, "7d")`` both, ``None`` all."""
        if spec is None or isinstance(spec, Keep):
            return spec if isinstance(spec, Keep) else cls(None, None)
        if isinstance(spec, bool):
            raise TypeError("retention must be a count, a duration, (count, duration) or None")
        if isinstance(spec, int):
            return cls(spec, None)
        if isinstance(spec, tuple):
            count, age = spec
            return cls(count, None if age is None else parse_duration(age))
        return cls(None, parse_duration(spec))

    def encode(self) -> str:
        """``count,age_ms`` with -1 for unbounded, as the Lua library reads it."""
        count = -1 if self.count is None else self.count
        age = -1 if self.age is None else round(self.age * 1000)
        return f"{count},{age}"

    def describe(self) -> str:
        parts = []
        if self.count is not None:
            parts.append(f"last {self.count}")
        if self.age is not None:
            parts.append(f"{self.age:g}s")
        return " / ".join(parts) if parts else "forever"


KeepSpec = (
    int | str | float | timedelta | tuple[int | None, str | float | timedelta | None] | Keep | None
)

#: A producer that enqueues a large batch and only then awaits its results (the common
#: enqueue-then-gather) finds every one for an hour, up to 200,000 per task: about
#: 120 MB of records for small results, more for large ones (then set a lower count).
DEFAULT_COMPLETED: KeepSpec = (200_000, "1h")
DEFAULT_FAILED: KeepSpec = (10000, "7d")
#: The HTTP gateway's audit trail keeps its newest 100,000 entries (about 86 bytes each
#: with short tenant names: some 9 MB); it is bounded by count only (``store.audit``).
DEFAULT_AUDIT_ENTRIES = 100_000


class Retention:
    """Per-task retention of completed and of failed (dead, expired, cancelled) records."""

    __slots__ = ("completed", "failed")

    def __init__(self, completed: KeepSpec = DEFAULT_COMPLETED, failed: KeepSpec = DEFAULT_FAILED):
        self.completed = Keep.of(completed)
        self.failed = Keep.of(failed)

    def __repr__(self) -> str:
        return f"Retention(completed={self.completed.describe()}, failed={self.failed.describe()})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Retention)
            and self.completed == other.completed
            and self.failed == other.failed
        )

    def __hash__(self) -> int:
        return hash((self.completed, self.failed))
