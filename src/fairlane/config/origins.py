"""Which source set each setting: the answer behind ``fairlane config view`` and errors.

This module owns the origins of settings. Every source is evaluated on its own into a
``Layer`` (its raw values, and how to name it for one setting: ``argument``,
``env FAIRLANE_LEASE__DURATION``, ``fairlane.toml``, ``pyproject.toml [tool.fairlane]``);
the first layer, in precedence order, that holds a setting is where its value came from
(``SettingOrigin``), and a validation error names every layer that supplied the bad
value. The model and its loading are ``fairlane.config.settings``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgspec
from pydantic import BaseModel, ValidationError

from fairlane.config.sources import LoadContext, env_name, file_and_env_sources

__all__ = ["Layer", "SettingOrigin", "describe", "layers", "source_of"]


class SettingOrigin(msgspec.Struct, frozen=True):
    """Where one leaf setting's value came from."""

    key: str
    """Dotted setting name, e.g. ``"lease.duration"``."""
    value: object
    """The value in force."""
    source: str
    """``"default"``, ``"argument"``, ``"env FAIRLANE_..."``, ``"fairlane.toml"`` or
    ``"pyproject.toml [tool.fairlane]"``."""


class Layer(msgspec.Struct, frozen=True):
    """One source's raw values, with a way to name the origin of a path within it."""

    data: dict[str, Any]
    label: Callable[[tuple[str, ...]], str]


def _as_data(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {key: _as_data(item) for key, item in value.items()}
    return value


def layers(
    settings_cls: type[BaseModel], ctx: LoadContext, overrides: Mapping[str, Any]
) -> list[Layer]:
    """Every non-default source evaluated on its own, highest precedence first."""
    found = [Layer(_as_data(overrides), _constant("argument"))]
    for label, table in file_and_env_sources(settings_cls, ctx):
        if label == "env":
            found.append(Layer(table, lambda path: "env " + _env_var_for(path, ctx.environ)))
        else:
            found.append(Layer(table, _constant(label)))
    return found


def _constant(label: str) -> Callable[[tuple[str, ...]], str]:
    return lambda _path: label


def _env_var_for(path: tuple[str, ...], environ: Mapping[str, str]) -> str:
    """The variable that set ``path``: the most specific one present, e.g. X__Y before X."""
    actual = {name.upper(): name for name in environ}
    for end in range(len(path), 0, -1):
        name = env_name(path[:end])
        if name in actual:
            return actual[name]
    return env_name(path)


def _lookup(data: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Whether ``path`` is set in ``data``; a non-table value on the way covers the rest."""
    for key in path:
        if not isinstance(data, dict):
            return True, data
        if key not in data:
            return False, None
        data = data[key]
    return True, data


def source_of(path: tuple[str, ...], found: list[Layer]) -> str:
    """The source whose value of ``path`` is in force: the first layer holding it."""
    for layer in found:
        if _lookup(layer.data, path)[0]:
            return layer.label(path)
    return "default"


def _flatten(data: Any, parent: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _flatten(value, (*parent, str(key)))
    else:
        yield parent


def _origins_of(path: tuple[str, ...], found: list[Layer]) -> list[str]:
    """Sources that supplied the value at ``path`` (several if it is a merged table)."""
    named: list[str] = []
    for layer in found:
        present, value = _lookup(layer.data, path)
        if not present:
            continue
        if not isinstance(value, dict):
            return [*named, layer.label(path)]
        for leaf in _flatten(value, path):
            named.append(layer.label(leaf))
    return list(dict.fromkeys(named))


def describe(exc: ValidationError, found: list[Layer]) -> str:
    """Every problem of ``exc``, each with the setting, the value and its sources."""
    lines = ["invalid Fairlane settings:"]
    for error in exc.errors():
        path = tuple(str(part) for part in error["loc"])
        where = ".".join(path) or "settings"
        origins = _origins_of(path, found) if path else []
        source = f" (from {', '.join(origins)})" if origins else ""
        value = error.get("input")
        given = "" if isinstance(value, dict | BaseModel) else f", got {value!r}"
        lines.append(f"  {where}: {error['msg']}{given}{source}")
    return "\n".join(lines)
