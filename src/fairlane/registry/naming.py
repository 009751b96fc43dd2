"""The name a task gets when its declaration gives none: ``<module>.<qualname>``.

A task is found by name: the producer stores it with each job, the worker looks it up
in the tasks it imported. A function defined in a script run as ``python app.py`` has
``__module__ == "__main__"``, a name no worker importing ``app`` ever gives it, so every
job of ``__main__.send`` would wait for a worker that cannot exist. Such a task is named
after the module a worker would import instead (``app.send``, from the script's file;
``pkg.app.send`` under ``python -m pkg.app``), and a ``TaskNameWarning`` says so, with the
``name=`` that makes the name the same however the module is loaded. Only a session with
no file to go by (the interactive interpreter, ``python -c``, a notebook) keeps
``__main__``, warned about the same way.

Refusing the declaration instead would break the one-file script that enqueues and runs
its own worker, where every name agrees; a warning keeps it working and tells the user
before the first job is stored, when the fix is one argument.
"""

from __future__ import annotations

import keyword
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from fairlane.errors import TaskNameWarning

__all__ = ["default_name", "script_module"]

#: the names a script's own module has: run directly, or re-imported by a spawned child
_MAIN_NAMES = frozenset({"__main__", "__mp_main__"})


def script_module(main: ModuleType | None) -> str | None:
    """The module name a worker would import the script ``main`` as; None when unknown."""
    if main is None:
        return None
    spec = getattr(main, "__spec__", None)
    spec_name = getattr(spec, "name", None)
    if isinstance(spec_name, str) and spec_name and spec_name not in _MAIN_NAMES:
        return spec_name  # python -m pkg.app
    file = getattr(main, "__file__", None)
    if not isinstance(file, str):
        return None
    stem = Path(file).stem
    if not stem.isidentifier() or keyword.iskeyword(stem):
        return None  # `python my-app.py`: no import statement reaches it by that name
    return stem


def default_name(func: Callable[..., Any], decorator: str, prefix: str = "") -> str:
    """``prefix`` + ``<module>.<qualname>`` of ``func``; for a function of ``__main__``,
    the module a worker would import, with a ``TaskNameWarning`` (``decorator`` opens the
    declaration the fix shows, such as ``app.task(``)."""
    module, qualname = func.__module__, func.__qualname__
    if module not in _MAIN_NAMES:
        return f"{prefix}{module}.{qualname}"
    imported = script_module(sys.modules.get(module))
    name = f"{prefix}{imported or '__main__'}.{qualname}"
    if module == "__mp_main__":
        return name  # a spawned child of the script: the script itself warned already
    suggested = name if imported else f"{prefix}myapp.{qualname}"
    if imported:
        how = (
            f"named {name!r}, as a worker that imports module {imported!r} names it; a "
            "worker loading the module under another name would not find it"
        )
    else:
        how = f"named {name!r}, which no worker importing a module can find"
    warnings.warn(
        f"{qualname} is declared in __main__ without name=: {how}. Name it so that "
        f'producers and workers agree: @{decorator}name="{suggested}")',
        TaskNameWarning,
        stacklevel=_caller_level(),
    )
    return name


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside Fairlane: the user's declaration."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("fairlane."):
        frame = frame.f_back
        level += 1
    return level
