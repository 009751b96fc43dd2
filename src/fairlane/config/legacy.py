"""The deprecated array shape of a lanes file's classes, read as it always was.

This module owns ``[[lanes.<lane>.classes]]``: an array of tables, each naming its class
with a ``name`` key. It was the lanes file's only shape until classes were written one
way everywhere, a table per class keyed by its name (``fairlane.config.classes``), and
it stays readable: ``array_classes`` reads it with the checks and error messages it
always had, and ``warn_array_shape`` is the ``DeprecationWarning`` that ``load_lanes``
(so the ``lanes_file`` setting too) gives for a file that still uses it, naming the
lanes and the shape to write instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import fields

from fairlane.config.files import ConfigError
from fairlane.policy.classes import ClassTable, ServiceClass

__all__ = ["array_classes", "warn_array_shape"]

_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(ServiceClass))


def warn_array_shape(source: str, lanes: Sequence[str], *, stacklevel: int) -> None:
    """Warn that ``lanes`` of ``source`` declare their classes as an array of tables."""
    example = lanes[0]
    who = (
        f"lanes {', '.join(lanes)} write their" if len(lanes) > 1 else f"lane {example} writes its"
    )
    warnings.warn(
        f"{source}: {who} classes as an array of tables "
        f"([[lanes.{example}.classes]] with name = ...), which is deprecated: write a table "
        f"per class, keyed by its name ([lanes.{example}.classes.<name>]), the shape "
        "[pools.<lane>] tables use",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def array_classes(entries: Sequence[object], where: str) -> ClassTable:
    """A lane's table from its array of class tables; ``where`` is ``<source>: lanes.<lane>``."""
    classes = [_entry(entry, f"{where}.classes[{i}]") for i, entry in enumerate(entries)]
    try:
        return ClassTable(classes)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _entry(entry: object, where: str) -> ServiceClass:
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where} must be a table")
    for key in entry:
        if key not in _FIELDS:
            import difflib  # noqa: PLC0415 - only for a key that is wrong, off a start-up

            close = difflib.get_close_matches(str(key), list(_FIELDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint} (keys: {', '.join(_FIELDS)})")
    if "name" not in entry:
        raise ConfigError(f"{where}: every class needs a name")
    for key, value in entry.items():
        _check_value(key, value, where)
    try:
        return ServiceClass(**entry)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _check_value(key: str, value: object, where: str) -> None:
    if key == "name":
        ok, wanted = isinstance(value, str), "a string"
    elif key in ("batch", "restricted", "deadline_order"):
        ok, wanted = isinstance(value, bool), "true or false"
    elif key == "min_slots":
        ok, wanted = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif key == "max_wait":  # a field added since; a duration as the table shape reads it
        ok = isinstance(value, str | int | float) and not isinstance(value, bool)
        wanted = 'a duration ("90s", "12h") or seconds'
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        wanted = "a finite number (leave borrowable out for no limit)"
    if not ok:
        raise ConfigError(f"{where}.{key} must be {wanted}, got {value!r}")
