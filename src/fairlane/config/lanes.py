"""Lanes as users declare them.

This module owns the lane side of the public API: the service-class table of each
lane, declared in Python (``ClassTable`` / ``ServiceClass``) or read from a lanes file
(``load_lanes``; the ``lanes_file`` setting reads the same), and the form of a
concurrency limit (``LimitValue``). The checks of what one call asks of its lane --
its class, width and limits -- are where jobs are built (``fairlane.registry.calls``).
It is pure -- no Redis, no asyncio; the rules by which classes share a lane are in
``fairlane.policy.classes``.

A lane that is never declared uses ``DEFAULT_CLASSES`` (guaranteed, standard, batch).

A lanes file holds ``[lanes.<lane>]`` tables, each class a table keyed by its name, in
the one shape of ``fairlane.config.classes`` (a config file's ``[pools.<lane>]`` adds
the admission pool to the same shape)::

    [lanes.heavy.classes.interactive]
    nominal_share = 0.7
    min_slots = 2
    lendable = 0.5

    [lanes.heavy.classes.bulk]
    batch = true

The older array shape, ``[[lanes.heavy.classes]]`` with ``name = "interactive"``, is
still read, with a ``DeprecationWarning`` (``fairlane.config.legacy``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from fairlane.config.classes import read_classes
from fairlane.config.files import ConfigError, join_key, read_toml
from fairlane.config.legacy import array_classes, warn_array_shape
from fairlane.policy.classes import DEFAULT_CLASSES, ClassTable, ServiceClass
from fairlane.policy.rates import Adaptive

__all__ = [
    "DEFAULT_CLASS",
    "LaneClasses",
    "LaneTables",
    "LimitValue",
    "check_lane",
    "class_table",
    "load_lanes",
    "parse_lanes",
    "read_toml",  # config.files' reader, still imported from here by the scenario reader
]

LaneClasses = ClassTable | Iterable[ServiceClass]
"""What a lane declaration accepts: a table, or its classes in rank tie-break order."""

DEFAULT_CLASS = "standard"
_MAX_LANE_LENGTH = 100
# a colon would make ``q:<lane>:<tenant>`` keys of two lanes collide
_BAD_LANE_CHARS = "{}:| \t\n\r\0"
_DEFAULT_TABLE = ClassTable(DEFAULT_CLASSES)


# -- lanes and their tables ------------------------------------------------------------------


def check_lane(lane: object) -> str:
    """A valid lane name, or ``ValueError``."""
    if (
        not isinstance(lane, str)
        or not lane
        or len(lane) > _MAX_LANE_LENGTH
        or any(c in lane for c in _BAD_LANE_CHARS)
    ):
        raise ValueError(
            f"lane name must be a non-empty string of at most {_MAX_LANE_LENGTH} characters "
            f"without braces, colons, '|' or whitespace: {lane!r}"
        )
    return lane


def class_table(classes: LaneClasses) -> ClassTable:
    """``classes`` as a ``ClassTable`` (checked: unique names, shares summing to at most 1)."""
    if isinstance(classes, ClassTable):
        return classes
    if isinstance(classes, str | bytes | Mapping) or not isinstance(classes, Iterable):
        raise TypeError(f"classes must be a ClassTable or ServiceClass objects, got {classes!r}")
    items = tuple(classes)
    for item in items:
        if not isinstance(item, ServiceClass):
            raise TypeError(f"classes must be ServiceClass objects, got {item!r}")
    return ClassTable(items)


class LaneTables:
    """The class tables an app declared, by lane; undeclared lanes get ``DEFAULT_CLASSES``."""

    def __init__(self) -> None:
        self._tables: dict[str, ClassTable] = {}
        self._sources: dict[str, str] = {}

    def declare(self, lane: str, classes: LaneClasses, *, source: str) -> ClassTable:
        """Record ``lane``'s table; a lane is declared once (``source`` names where, for errors)."""
        check_lane(lane)
        if lane in self._tables:
            raise ValueError(
                f"lane {lane!r} is already declared (by {self._sources[lane]}); "
                "declare each lane once"
            )
        table = class_table(classes)
        self._tables[lane] = table
        self._sources[lane] = source
        return table

    def forget(self, lane: str) -> None:
        self._tables.pop(lane, None)
        self._sources.pop(lane, None)

    def table(self, lane: str) -> ClassTable:
        """The lane's table: as declared, else the default one."""
        return self._tables.get(lane, _DEFAULT_TABLE)

    def is_declared(self, lane: str) -> bool:
        return lane in self._tables

    def items(self) -> list[tuple[str, ClassTable]]:
        return list(self._tables.items())

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._tables))

    def __len__(self) -> int:
        return len(self._tables)

    def check_class(self, lane: str, service_class: str) -> str:
        """``service_class`` if ``lane`` has it, else ``ValueError`` listing the lane's classes."""
        table = self.table(lane)
        if service_class not in table:
            how = "declared" if lane in self._tables else "default"
            raise ValueError(
                f"lane {lane!r} has no service class {service_class!r}; its {how} classes are "
                f"{', '.join(table.names)}"
            )
        return service_class


# -- a job's limits ----------------------------------------------------------------------------


#: A concurrency limit: a fixed count, or one that adapts to the upstream's pushback.
LimitValue = int | Adaptive


# -- lanes files ----------------------------------------------------------------------------


def load_lanes(path: Path | str) -> dict[str, ClassTable]:
    """Read the ``[lanes.<name>]`` tables of a TOML file; ``ConfigError`` if invalid.

    A file in the deprecated array shape (``[[lanes.<name>.classes]]``) reads the same,
    with a ``DeprecationWarning`` naming its lanes.
    """
    tables, arrays = _read_lanes(read_toml(path, "lanes"), str(path))
    if arrays:
        warn_array_shape(str(path), arrays, stacklevel=2)
    return tables


def parse_lanes(data: Mapping[str, Any], *, source: str = "lanes") -> dict[str, ClassTable]:
    """Lane tables from parsed TOML (a top-level ``lanes`` table); errors name the entry.

    Both shapes are read, and the array shape without a warning: ``load_lanes`` warns of
    a file's, here the caller knows where the data came from.
    """
    return _read_lanes(data, source)[0]


def _read_lanes(data: Mapping[str, Any], source: str) -> tuple[dict[str, ClassTable], list[str]]:
    """The lanes' tables, and the lanes that wrote their classes in the array shape."""
    extra = sorted(set(data) - {"lanes"})
    if extra:
        raise ConfigError(
            f"{source}: unknown top-level keys {extra}; lanes go under [lanes.<name>]"
        )
    lanes = data.get("lanes", {})
    if not isinstance(lanes, Mapping):
        raise ConfigError(f"{source}: 'lanes' must be a table of lanes")
    tables: dict[str, ClassTable] = {}
    arrays: list[str] = []
    for lane, body in lanes.items():
        where = f"{source}: lanes.{lane}"
        try:
            check_lane(lane)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if not isinstance(body, Mapping) or set(body) != {"classes"}:
            raise ConfigError(
                f"{where} must hold exactly one key, 'classes': a table per class "
                f"([lanes.{lane}.classes.<name>])"
            )
        entries = body["classes"]
        if isinstance(entries, list):
            tables[lane] = array_classes(entries, where)
            arrays.append(lane)
        elif isinstance(entries, Mapping):
            tables[lane] = read_classes(body, join_key("lanes", lane), source)
        else:
            raise ConfigError(
                f"{where}.classes must be a table per class ([lanes.{lane}.classes.<name>]), "
                f"or the deprecated array of tables ([[lanes.{lane}.classes]])"
            )
    return tables, arrays
