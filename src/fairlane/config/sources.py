"""Where settings come from: the environment, ``fairlane.toml`` and ``pyproject.toml``.

This module owns the sources of Fairlane's settings besides keyword arguments, highest
precedence first: ``FAIRLANE_...`` environment variables (nested with ``__``, e.g.
``FAIRLANE_LEASE__DURATION=20``; a misspelt one is refused with the setting it was
probably meant to be), ``fairlane.toml`` in the project directory, and the
``[tool.fairlane]`` table of the project's ``pyproject.toml``. They are
pydantic-settings sources reading files through ``fairlane.config.files.read_toml``.

Which project directory and environment a load reads is a ``LoadContext``, set for the
duration of one load (``loading``) so that the model's own hooks -- the source list, and
anchoring a relative ``lanes_file`` to the project -- see the same one.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import msgspec
from pydantic import BaseModel
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    PyprojectTomlConfigSettingsSource,
    TomlConfigSettingsSource,
)

from fairlane.config.files import ConfigError, read_toml

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "PYPROJECT_LABEL",
    "TOML_FILE",
    "LoadContext",
    "current_context",
    "env_name",
    "file_and_env_sources",
    "leaf_paths",
    "load_context",
    "loading",
]

ENV_PREFIX = "FAIRLANE_"
ENV_NESTED_DELIMITER = "__"
TOML_FILE = "fairlane.toml"
PYPROJECT_FILE = "pyproject.toml"
PYPROJECT_LABEL = "pyproject.toml [tool.fairlane]"


class LoadContext(msgspec.Struct, frozen=True):
    """The project directory and the environment one load of the settings reads."""

    project_dir: Path
    environ: Mapping[str, str]


_CONTEXT: ContextVar[LoadContext | None] = ContextVar("fairlane_config_context", default=None)


def current_context() -> LoadContext:
    """The context of the load under way; outside one, the working directory and env."""
    return _CONTEXT.get() or LoadContext(Path.cwd(), os.environ)


def load_context(project_dir: Path | str | None, environ: Mapping[str, str] | None) -> LoadContext:
    """The context a load asks for, the current one filling what it leaves out."""
    base = current_context()
    return LoadContext(
        Path(project_dir) if project_dir is not None else base.project_dir,
        environ if environ is not None else base.environ,
    )


@contextmanager
def loading(ctx: LoadContext) -> Iterator[None]:
    """Make ``ctx`` the current context while the settings model is built."""
    token = _CONTEXT.set(ctx)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class _FairlaneEnvSource(EnvSettingsSource):
    """The standard env source, reading a given mapping and refusing misspelt variables."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {(k if self.case_sensitive else k.lower()): v for k, v in self._environ.items()}

    def __call__(self) -> dict[str, Any]:
        _reject_misspelt_env(self.settings_cls, self._environ)
        return super().__call__()


class _TomlSource(TomlConfigSettingsSource):
    """``fairlane.toml``: its top-level table is the settings."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        return read_toml(file_path)


class _PyprojectSource(PyprojectTomlConfigSettingsSource):
    """The ``[tool.fairlane]`` table of ``pyproject.toml``."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        data = read_toml(file_path)
        node: Any = data
        for key in self.toml_table_header:
            node = node.get(key, {})
            if not isinstance(node, dict):
                header = ".".join(self.toml_table_header)
                raise ConfigError(f"[{header}] in {file_path} must be a table")
        return data


def file_and_env_sources(
    settings_cls: type[BaseSettings], ctx: LoadContext
) -> list[tuple[str, PydanticBaseSettingsSource]]:
    """The env and file sources, highest precedence first, each with its label."""
    return [
        ("env", _FairlaneEnvSource(settings_cls, ctx.environ)),
        (TOML_FILE, _TomlSource(settings_cls, toml_file=ctx.project_dir / TOML_FILE)),
        (PYPROJECT_LABEL, _PyprojectSource(settings_cls, ctx.project_dir / PYPROJECT_FILE)),
    ]


def leaf_paths(model: type[BaseModel], parent: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every leaf setting of ``model``, in model order, as a path of field names."""
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from leaf_paths(annotation, (*parent, name))
        else:
            yield (*parent, name)


def env_name(path: tuple[str, ...]) -> str:
    """The variable that sets the setting at ``path``: ``FAIRLANE_LEASE__DURATION``."""
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(path).upper()


def _reject_misspelt_env(settings_cls: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Raise for ``FAIRLANE_`` variables that look like a setting but match none.

    Unknown keys under a known section (``FAIRLANE_LEASE__DURATON``) are left to pydantic's
    ``extra="forbid"``; this catches unknown sections and near misses at the top level.
    """
    top = {name.upper() for name in settings_cls.model_fields}
    spellings: dict[str, str] = {}
    for path in leaf_paths(settings_cls):
        correct = env_name(path)
        for spelling in ("_".join(path), path[-1], ENV_NESTED_DELIMITER.join(path)):
            spellings.setdefault(spelling.upper(), correct)
    for name in environ:
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX):
            continue
        rest = upper[len(ENV_PREFIX) :]
        if rest.split(ENV_NESTED_DELIMITER)[0] in top:
            continue
        close = difflib.get_close_matches(rest, list(spellings), n=1, cutoff=0.8)
        if close or ENV_NESTED_DELIMITER in rest:
            hint = f"; did you mean {spellings[close[0]]}?" if close else ""
            raise ConfigError(f"environment variable {name} is not a Fairlane setting{hint}")
