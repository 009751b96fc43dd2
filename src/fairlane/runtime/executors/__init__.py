"""Executors that run synchronous task functions on behalf of the async worker.

This package owns *where* sync task code runs, not what it means. The worker hands an
executor an opaque ``(target, payload)`` pair and gets result bytes back; turning
arguments and results into bytes is the job of an *invoker* (``Invoker``), which runs
next to the task code.

- ``base``: the ``Invoker`` shape and the executors' errors.
- ``threads``: ``ThreadExecutor``, a bounded thread pool.
- ``process``: ``ProcessExecutor``, a pool of kill-able child processes, and its
  ``ProcessPoolStats``.
- ``child``: one pool child and the pipe protocol between it and the parent.
"""

from importlib import import_module
from typing import TYPE_CHECKING

from fairlane.runtime.executors.base import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorClosed,
    ExecutorError,
    Invoker,
    RemoteError,
)
from fairlane.runtime.executors.threads import ThreadExecutor

if TYPE_CHECKING:
    from fairlane.runtime.executors.process import ProcessExecutor, ProcessPoolStats

__all__ = [
    "ChildCrashed",
    "ExecutionTimeout",
    "ExecutorClosed",
    "ExecutorError",
    "Invoker",
    "ProcessExecutor",
    "ProcessPoolStats",
    "RemoteError",
    "ThreadExecutor",
]


def __getattr__(name: str) -> object:
    # the process pool (and multiprocessing with it) is imported when first named: a
    # worker whose tasks are not kill-able never starts one
    if name in {"ProcessExecutor", "ProcessPoolStats"}:
        return getattr(import_module(f"{__name__}.process"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
