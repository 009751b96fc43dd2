"""Where settings come from: the environment, ``fairlane.toml`` and ``pyproject.toml``.

This module owns the sources of Fairlane's settings besides keyword arguments, highest
precedence first: ``FAIRLANE_...`` environment variables (nested with ``__``, e.g.
``FAIRLANE_LEASE__DURATION=20``; a misspelt one is refused with the setting it was
probably meant to be), ``fairlane.toml`` in the project directory, and the
``[tool.fairlane]`` table of the project's ``pyproject.toml``. Each source reads into a
plain table; ``merged`` lays them over each other, table by table, and the model
validates the result once.

The environment is read as pydantic-settings reads it, whose conventions the settings
kept when its source classes were replaced by these (they cost a worker about a twentieth
of its start-up, in imports alone): names are case-insensitive; ``__`` nests into a
section, or into a table setting's keys; a value whose setting is a section, list or
table is JSON (``FAIRLANE_LEASE='{"duration": 20}'``) unless the setting is marked
``NoDecode``, and the nested variables of a section win over its JSON.

Which project directory and environment a load reads is a ``LoadContext``, set for the
duration of one load (``loading``) so that the model's own hooks -- reading the sources
when it is built alone, and anchoring a relative ``lanes_file`` to the project -- see
the same one.
"""

from __future__ import annotations

import json
import os
import types
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from fairlane.config.files import ConfigError, read_toml

__all__ = [
    "ENV_NESTED_DELIMITER",
    "ENV_PREFIX",
    "PYPROJECT_LABEL",
    "TOML_FILE",
    "LoadContext",
    "NoDecode",
    "current_context",
    "env_name",
    "file_and_env_sources",
    "leaf_paths",
    "load_context",
    "loading",
    "merged",
]

ENV_PREFIX = "FAIRLANE_"
ENV_NESTED_DELIMITER = "__"
TOML_FILE = "fairlane.toml"
PYPROJECT_FILE = "pyproject.toml"
PYPROJECT_TABLE = ("tool", "fairlane")
_PYPROJECT_HEADER = f"[{'.'.join(PYPROJECT_TABLE)}]"
PYPROJECT_LABEL = f"{PYPROJECT_FILE} {_PYPROJECT_HEADER}"


class NoDecode:
    """Marks a list or table setting whose variable is not JSON: its own validator reads
    the text (``Annotated[list[str], NoDecode]``)."""


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


# -- the sources ------------------------------------------------------------------------


def file_and_env_sources(
    model: type[BaseModel], ctx: LoadContext
) -> list[tuple[str, dict[str, Any]]]:
    """What the env and file sources hold, highest precedence first, each with its label."""
    return [
        ("env", env_values(model, ctx.environ)),
        (TOML_FILE, _toml_values(ctx.project_dir / TOML_FILE)),
        (PYPROJECT_LABEL, _pyproject_values(ctx.project_dir / PYPROJECT_FILE)),
    ]


def merged(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """``layers`` laid over each other, the first on top: tables merge key by key, any
    other value replaces what lies under it."""
    out: dict[str, Any] = {}
    for layer in reversed(layers):
        _lay(out, layer)
    return out


def _lay(under: dict[str, Any], over: Mapping[str, Any]) -> None:
    for key, value in over.items():
        below = under.get(key)
        if isinstance(below, dict) and isinstance(value, Mapping):
            below = dict(below)
            _lay(below, value)
            under[key] = below
        else:
            under[key] = dict(value) if isinstance(value, Mapping) else value


def _toml_values(path: Path) -> dict[str, Any]:
    """``fairlane.toml``: its top-level table is the settings."""
    return read_toml(path) if path.is_file() else {}


def _pyproject_values(path: Path) -> dict[str, Any]:
    """The ``[tool.fairlane]`` table of ``pyproject.toml``."""
    if not path.is_file():
        return {}
    node: Any = read_toml(path)
    for key in PYPROJECT_TABLE:
        node = node.get(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{_PYPROJECT_HEADER} in {path} must be a table")
    return dict(node)


def env_values(model: type[BaseModel], environ: Mapping[str, str]) -> dict[str, Any]:
    """The settings the ``FAIRLANE_`` variables of ``environ`` give, as a table."""
    _reject_misspelt_env(model, environ)
    fields = model.model_fields
    found: dict[str, tuple[str, str]] = {}  # the lowered name after the prefix: (name, value)
    for name, value in environ.items():
        lower = name.lower()
        if lower.startswith(ENV_PREFIX.lower()):
            found[lower[len(ENV_PREFIX) :]] = (name, value)
    whole: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for rest in sorted(found):
        path = rest.split(ENV_NESTED_DELIMITER)
        field = fields.get(path[0])
        if field is None or any(not part for part in path):
            continue  # not a setting's variable (a near miss was refused above)
        if len(path) == 1:
            whole[rest] = _decoded(found[rest], rest, field.annotation, list(field.metadata))
        elif _is_complex(field.annotation, list(field.metadata)):
            _place(nested, path, found[rest], field)
    return merged(nested, whole)


def _place(
    table: dict[str, Any], path: list[str], variable: tuple[str, str], field: FieldInfo
) -> None:
    """Put a nested variable's value at ``path`` in ``table``, decoded as its setting's."""
    annotation: Any = field.annotation
    metadata: list[Any] = list(field.metadata)
    for key in path[1:]:
        annotation, metadata = _inner(annotation, key)
    node = table
    for key in path[:-1]:
        below = node.get(key)
        if not isinstance(below, dict):
            below = node[key] = {}
        node = below
    node[path[-1]] = _decoded(variable, ".".join(path), annotation, metadata)


def _inner(annotation: Any, key: str) -> tuple[Any, list[Any]]:
    """The annotation of ``key`` within a section or table of ``annotation`` (None: not
    known, the value is left as text)."""
    for member in _members(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            field = member.model_fields.get(key)
            if field is not None:
                return field.annotation, list(field.metadata)
        elif get_origin(member) in (dict, Mapping) and len(get_args(member)) == 2:
            return _split_annotated(get_args(member)[1])
    return None, []


def _decoded(variable: tuple[str, str], setting: str, annotation: Any, metadata: list[Any]) -> Any:
    """A variable's value as its setting takes it: the text, or JSON for a complex one."""
    name, raw = variable
    if not _is_complex(annotation, metadata):
        return raw
    try:
        return json.loads(raw)
    except ValueError as exc:
        if any(not _complex_member(m) for m in _members(annotation)):
            return raw  # a setting that may also be a plain value, which its validator reads
        raise ConfigError(
            f"invalid Fairlane settings: {setting}: environment variable {name} is not "
            f"valid JSON (the setting is a section, list or table): {exc}"
        ) from None


def _is_complex(annotation: Any, metadata: list[Any]) -> bool:
    annotation, more = _split_annotated(annotation)
    if any(m is NoDecode or isinstance(m, NoDecode) for m in (*metadata, *more)):
        return False
    return any(_complex_member(m) for m in _members(annotation))


def _complex_member(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    origin = get_origin(annotation) or annotation
    return origin in (dict, list, set, frozenset, tuple, Mapping)


def _members(annotation: Any) -> tuple[Any, ...]:
    annotation, _ = _split_annotated(annotation)
    if get_origin(annotation) in (Union, types.UnionType):
        return tuple(a for a in get_args(annotation) if a is not type(None))
    return (annotation,)


def _split_annotated(annotation: Any) -> tuple[Any, list[Any]]:
    if get_origin(annotation) is Annotated:
        inner, *metadata = get_args(annotation)
        return inner, metadata
    return annotation, []


# -- the model's names ------------------------------------------------------------------


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
        import difflib  # noqa: PLC0415 - only for a variable that is no setting

        close = difflib.get_close_matches(rest, list(spellings), n=1, cutoff=0.8)
        if close or ENV_NESTED_DELIMITER in rest:
            hint = f"; did you mean {spellings[close[0]]}?" if close else ""
            raise ConfigError(f"environment variable {name} is not a Fairlane setting{hint}")
