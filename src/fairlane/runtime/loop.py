"""The event loop Fairlane's own processes run on: uvloop where installed, else asyncio's.

uvloop is a drop-in, faster implementation of the asyncio loop; a worker spends much
of each job in loop machinery (waking tasks, reading replies), so it shows directly
in throughput and wake-up latency. Code that embeds Fairlane in its own loop is
unaffected: only the ``fairlane`` command and its helpers start loops here.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["loop_factory", "run"]

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory when uvloop is installed, else None (asyncio's default)."""
    try:
        import uvloop  # noqa: PLC0415 - optional dependency, looked up when a loop starts
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


@functools.cache
def _freeze_what_was_built() -> None:
    # What a process built before its first loop (its imports, the app's declarations)
    # lives as long as it does: moved out of the collector's generations, no full
    # collection walks it again. A worker's start-up made about 400,000 such objects, and
    # the one full collection that fell in it (in uvloop's import, as it happened) walked
    # them all: about 27 ms of the start-up, and as much in each full collection after.
    # Not collected first: that would be the walk saved; what import left as garbage is a
    # few objects. Once a process: a later loop's objects are not all long-lived.
    gc.freeze()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new loop (uvloop if available)."""
    _freeze_what_was_built()
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
