"""Milli-units and the checks every admission setting passes.

The store counts work in integer milli-units (``to_milli``, half up, as Lua's
``math.floor(x + 0.5)``), so that the integer class rules apply to a pool's units.
Every number a caller gives the admission rules is checked here once, with the same
messages whichever setting it is.
"""

from __future__ import annotations

import math

__all__ = ["check_count", "check_number", "milli_floor", "to_milli"]

_EPS = 1e-9


def check_number(label: str, value: object, *, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float if it is a finite number within ``[low, high]`` (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{label} must be a number, got {value!r}")
    if not (math.isfinite(value) and low <= value <= high):
        raise ValueError(f"{label} must be finite and within [{low}, {high}], got {value!r}")
    return float(value)


def check_count(label: str, value: object, *, low: int = 0, high: int | None = None) -> int:
    """``value`` if it is an int of at least ``low`` (and at most ``high``), not a bool."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{label} must be an int, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"within [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{label} must be {bound}, got {value}")
    return value


def to_milli(units: float) -> int:
    """``units`` as integer milli-units, rounded half up (the store counts these)."""
    check_number("units", units)
    return math.floor(units * 1000 + 0.5)


def milli_floor(units: float) -> int:
    """A floor of ``units`` in milli-units, rounded up: ``0.07`` units is 70, not 71."""
    return math.ceil(units * 1000 - _EPS)
