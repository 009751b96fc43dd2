"""The event loop Fairlane's own processes run on: uvloop where installed, else asyncio's.

uvloop is a drop-in, faster implementation of the asyncio loop; a worker spends much
of each job in loop machinery (waking tasks, reading replies), so it shows directly
in throughput and wake-up latency. Code that embeds Fairlane in its own loop is
unaffected: only the ``fairlane`` command and its helpers start loops here.
"""

from __future__ import annotations

import asyncio
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


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion on a new loop (uvloop if available)."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(coro)
