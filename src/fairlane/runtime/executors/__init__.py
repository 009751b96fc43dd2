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

from fairlane.runtime.executors.base import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorClosed,
    ExecutorError,
    Invoker,
    RemoteError,
)
from fairlane.runtime.executors.process import ProcessExecutor, ProcessPoolStats
from fairlane.runtime.executors.threads import ThreadExecutor

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
