"""Typed reads from the tables of a scenario file, with errors that name the key path.

An error reads ``<source>: <key path>: <problem>`` (``scenario.toml: tenants[2].rate:
must be a number >= 0, finite, got -1``); an unknown key is refused with the closest
known one.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

from fairlane.config.settings import ConfigError

__all__ = ["Table"]


class Table:
    """Typed reads from one TOML table; errors read ``<source>: <key path>: <problem>``."""

    def __init__(self, data: object, path: str, source: str, keys: tuple[str, ...]) -> None:
        self.path, self.source = path, source
        if not isinstance(data, Mapping):
            raise self.error("", f"must be a table, got {data!r}")
        for key in data:
            if key not in keys:
                close = difflib.get_close_matches(str(key), list(keys), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise self.error(str(key), f"unknown key{hint} (keys: {', '.join(keys)})")
        self.data: Mapping[str, Any] = data

    def at(self, key: str) -> str:
        if not key:
            return self.path or "(top level)"
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.at(key)}: {message}")

    def number(
        self, key: str, default: float, *, positive: bool = False, infinite: bool = False
    ) -> float:
        value = self.data.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if ok and (math.isnan(value) or value < 0 or (positive and value == 0)):
            ok = False
        if not ok or (math.isinf(value) and not infinite):
            wanted = ("> 0" if positive else ">= 0") + (" (or inf)" if infinite else ", finite")
            raise self.error(key, f"must be a number {wanted}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int, *, low: int = 0, high: int = 2**31 - 1) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.error(key, f"must be an integer within [{low}, {high}], got {value!r}")
        return value

    def string(self, key: str, default: str | None = None) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str) or not value:
            what = "is required" if value is None else f"must be a non-empty string, got {value!r}"
            raise self.error(key, what)
        return value

    def array(self, key: str) -> list[Any]:
        value = self.data.get(key, [])
        if not isinstance(value, list):
            raise self.error(key, f"must be an array, got {value!r}")
        return value
