"""Reading configuration files: the one TOML reader and typed reads of its tables.

This module owns how every configuration file of Fairlane is read -- settings
(``fairlane.toml``, ``pyproject.toml``), lanes files, config files of pools, retry and
estimation, and the simulator's scenarios: ``read_toml`` parses a file and names it in
any error, ``ConfigError`` is the one error a bad file, variable or value raises, and
``TableReader`` reads typed values from one table, naming the file and the key path
(``pools.agent-shared.classes.guaranteed.max_queue``) in every error so that the path
can be pasted back into the file. It imports nothing of the project.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["MAX_COUNT", "ConfigError", "TableReader", "join_key", "read_toml", "unknown_key"]

#: Counts travel through Lua numbers and msgpack; this keeps them exact and encodable.
MAX_COUNT = 2**31 - 1
_T = TypeVar("_T")


class ConfigError(ValueError):
    """Settings could not be loaded: a file, an environment variable or a value is invalid."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.config"


def read_toml(path: Path | str, what: str | None = None) -> dict[str, Any]:
    """A TOML file's contents; ``ConfigError`` naming the file (a ``what`` file) if unreadable."""
    import tomllib  # noqa: PLC0415 - a worker with no files to read skips its 2 ms import

    try:
        with Path(path).open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML in {path}: {exc}") from exc
    except OSError as exc:
        named = f"{what} file {path}" if what else str(path)
        raise ConfigError(f"cannot read {named}: {exc}") from exc


def join_key(path: str, key: str) -> str:
    """``path.key``, quoting a key TOML would quote, so the path can be pasted back."""
    bare = bool(key) and all(c.isalnum() or c in "-_" for c in key)
    part = key if bare else f'"{key}"'
    return f"{path}.{part}" if path else part


def unknown_key(key: str, keys: tuple[str, ...]) -> str:
    """What to say of a key that is not one of ``keys``: the nearest one, and all of them."""
    import difflib  # noqa: PLC0415 - only for a key that is wrong, off a worker's start-up

    close = difflib.get_close_matches(key, list(keys), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (keys: {', '.join(keys)})"


class TableReader:
    """Typed reads from one table, naming ``source`` and the key path in every error."""

    def __init__(self, data: object, path: str, source: str, keys: tuple[str, ...]) -> None:
        self.source = source
        self.path = path
        if not isinstance(data, Mapping):
            raise self.error(path, f"must be a table, got {data!r}")
        for key in data:
            if key not in keys:
                raise self.error(self.at(str(key)), unknown_key(str(key), keys))
        self.data: Mapping[str, Any] = data

    def at(self, key: str) -> str:
        return join_key(self.path, key)

    def error(self, path: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {path}: {message}")

    def number(self, key: str, default: float, *, positive: bool = False) -> float:
        value = self.data.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or value < 0 or (positive and value == 0):
            wanted = "> 0" if positive else ">= 0"
            raise self.error(self.at(key), f"must be a finite number {wanted}, got {value!r}")
        return float(value)

    def optional_number(self, key: str) -> float | None:
        return self.number(key, 0.0) if key in self.data else None

    def count(self, key: str, default: int, *, low: int = 0) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_COUNT:
            raise self.error(self.at(key), f"must be an int >= {low}, got {value!r}")
        return value

    def optional_count(self, key: str) -> int | None:
        return self.count(key, 0) if key in self.data else None

    def flag(self, key: str) -> bool:
        value = self.data.get(key, False)
        if not isinstance(value, bool):
            raise self.error(self.at(key), f"must be true or false, got {value!r}")
        return value

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.data.get(key, default)
        if value not in choices:
            raise self.error(self.at(key), f"must be one of {', '.join(choices)}, got {value!r}")
        return str(value)

    def table(self, key: str, keys: tuple[str, ...]) -> TableReader:
        return TableReader(self.data.get(key, {}), self.at(key), self.source, keys)

    def build(self, make: Callable[..., _T], path: str, **kwargs: Any) -> _T:
        """``make(**kwargs)``, its own checks reported at ``path``."""
        try:
            return make(**kwargs)
        except (TypeError, ValueError) as exc:
            raise self.error(path, str(exc)) from None
