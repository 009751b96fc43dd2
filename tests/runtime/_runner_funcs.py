"""Task functions the runner tests declare with the process executor.

A process task runs in a child that imports its function by path (``module:qualname``),
so these live at module level, where the children can import them as
``tests.runtime._runner_funcs``.
"""

from __future__ import annotations

import os


class Refused(Exception):
    """A failure a task's ``retry_on`` may or may not name."""


def square(n: int) -> int:
    return n * n


def refuse(reason: str) -> None:
    raise Refused(reason)


def crash(code: int) -> None:
    os._exit(code)  # the child dies without an answer: the executor reports a crash
