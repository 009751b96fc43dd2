"""Running a sync task function from a target path, in a thread or a child process.

A child process imports the task's module itself (``module:qualname``), so only
JSON bytes cross the pipe: arguments in, result out.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fairlane.codec import ArgsCodec

__all__ = ["invoke_sync", "target_of"]


def target_of(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__}:{fn.__qualname__}"


@lru_cache(maxsize=512)
def _resolve(target: str) -> tuple[Callable[..., Any], ArgsCodec]:
    module_name, _, qualname = target.partition(":")
    if module_name == "__main__" and "__mp_main__" in sys.modules:
        module: Any = sys.modules["__mp_main__"]
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = getattr(obj, "__wrapped__", obj)  # a registered Task wraps the plain function
    return fn, ArgsCodec(fn)


def invoke_sync(target: str, payload: bytes) -> bytes:
    """Decode ``payload`` for the function at ``target``, call it, encode its result."""
    fn, codec = _resolve(target)
    args, kwargs = codec.decode(payload)
    return codec.encode_result(fn(*args, **kwargs))
