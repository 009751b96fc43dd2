"""What every executor shares: the shape of an invoker, and the executor's own errors.

An executor runs an *invoker* -- ``(target, payload) -> result bytes`` -- somewhere
other than the event loop. The errors here are failures of the executor itself (closed,
a child that died, a timeout, an invoker that raised inside a child), never a task's.
The package exports every name here.
"""

from __future__ import annotations

from collections.abc import Callable

Invoker = Callable[[str, bytes], bytes]
"""``(target, payload) -> result bytes``; runs in the worker thread or child process."""


class ExecutorError(Exception):
    """Base class for failures of the executor itself rather than of the task."""

    # the type name jobs record and users match on (codec.encode_error), of every error
    # here: as before the move
    __module__ = "fairlane.runtime.executors"


class ExecutorClosed(ExecutorError):
    """The executor was closed before or while the call ran."""

    __module__ = "fairlane.runtime.executors"


class ChildCrashed(ExecutorError):
    """The child process died during the call (segfault, ``os._exit``, SIGKILL/OOM)."""

    __module__ = "fairlane.runtime.executors"

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"executor child died during the call (exit code {exitcode})")
        self.exitcode = exitcode  # negative: killed by that signal number


class ExecutionTimeout(ExecutorError):
    """The call exceeded its timeout (a process child has been killed and replaced)."""

    __module__ = "fairlane.runtime.executors"


class RemoteError(ExecutorError):
    """The invoker raised inside the child; the child stays alive."""

    __module__ = "fairlane.runtime.executors"

    def __init__(self, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback = traceback
