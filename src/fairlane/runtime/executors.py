"""Executors that run synchronous task functions on behalf of the async worker.

This module owns *where* sync task code runs, not what it means.  The worker hands an
executor an opaque ``(target, payload)`` pair and gets result bytes back; turning
arguments and results into bytes is the job of an *invoker* (``Invoker``), which runs
next to the task code.

``ThreadExecutor`` runs the invoker in a bounded thread pool.  ``ProcessExecutor`` keeps a
pool of kill-able child processes (``spawn`` or ``forkserver``, never ``fork``: the parent
is a threaded asyncio process).  Parent and child talk over two one-way pipes with
``Connection.send_bytes``/``recv_bytes`` and msgpack frames (``_Call`` requests, ``_Ok`` /
``_Err`` replies); nothing is pickled except the child's entry-point arguments.  A child
runs one call at a time.  A child that crashes, times out or whose caller is cancelled is
killed, reaped and replaced, and the parent is never affected.

``ProcessExecutor`` waits on pipes with ``loop.add_reader`` and therefore needs an asyncio
event loop (anyio on its asyncio backend is fine).  Once the first bytes of a reply are
readable the rest of that frame is read synchronously: the child writes a whole frame at
once, so this only blocks the loop for the time it takes to copy the reply.  Requests are
written synchronously for the same reason: the idle child is already blocked reading them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import enum
import functools
import importlib
import logging
import multiprocessing
import signal
import traceback
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import msgspec

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

Invoker = Callable[[str, bytes], bytes]
"""``(target, payload) -> result bytes``; runs in the worker thread or child process."""

_log = logging.getLogger(__name__)
_T = TypeVar("_T")

_CRASH_GRACE: Final = 1.0  # how long a child that closed its pipe gets to finish exiting
_EXIT_POLL: Final = 0.05  # fallback poll interval while waiting for a child to exit
_MAX_RESTART_DELAY: Final = 5.0


class ExecutorError(Exception):
    """Base class for failures of the executor itself rather than of the task."""


class ExecutorClosed(ExecutorError):
    """The executor was closed before or while the call ran."""


class ChildCrashed(ExecutorError):
    """The child process died during the call (segfault, ``os._exit``, SIGKILL/OOM)."""

    def __init__(self, exitcode: int | None) -> None:
        super().__init__(f"executor child died during the call (exit code {exitcode})")
        self.exitcode = exitcode  # negative: killed by that signal number


class ExecutionTimeout(ExecutorError):
    """The call exceeded its timeout (a process child has been killed and replaced)."""


class RemoteError(ExecutorError):
    """The invoker raised inside the child; the child stays alive."""

    def __init__(self, type_name: str, message: str, traceback: str) -> None:
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.message = message
        self.traceback = traceback


# --------------------------------------------------------------------------- wire format


class _Call(msgspec.Struct, array_like=True, frozen=True):
    target: str
    payload: bytes


class _Ok(msgspec.Struct, array_like=True, frozen=True, tag=0):
    result: bytes


class _Err(msgspec.Struct, array_like=True, frozen=True, tag=1):
    type_name: str
    message: str
    traceback: str


_encoder: Final = msgspec.msgpack.Encoder()
_call_decoder: Final = msgspec.msgpack.Decoder(_Call)
_reply_decoder: Final = msgspec.msgpack.Decoder(_Ok | _Err)


def _error_reply(exc: BaseException) -> _Err:
    cls = type(exc)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not take the child down
        message = f"<unprintable {name}>"
    return _Err(name, message, "".join(traceback.format_exception(exc)))


# --------------------------------------------------------------------------- child side


def _resolve_invoker(path: str) -> Invoker:
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"invoker {path!r} is not callable")
    invoker: Invoker = obj
    return invoker


def _child_main(invoker_path: str, requests: Connection, replies: Connection) -> None:
    """Entry point of a pool child: answer one call at a time until the request pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # The parent marks children daemonic so they die with it; clear the flag here so task
    # code may start its own processes (daemonic processes may not have children).
    multiprocessing.current_process().daemon = False
    try:
        invoker = _resolve_invoker(invoker_path)
    except Exception as exc:
        replies.send_bytes(_encoder.encode(_error_reply(exc)))
        return
    replies.send_bytes(_encoder.encode(_Ok(b"")))  # ready
    while True:
        try:
            frame = requests.recv_bytes()
        except EOFError:  # the parent asked us to stop, or is gone
            return
        reply: _Ok | _Err
        try:
            call = _call_decoder.decode(frame)
            result = invoker(call.target, call.payload)
            if not isinstance(result, bytes):
                raise TypeError(f"invoker returned {type(result).__name__}, expected bytes")
            reply = _Ok(result)
        except Exception as exc:
            reply = _error_reply(exc)
        try:
            replies.send_bytes(_encoder.encode(reply))
        except OSError:  # parent gone
            return


# --------------------------------------------------------------------------- parent side


async def _wait_readable(fds: Sequence[int], limit: float | None) -> int | None:
    """Wait until one of ``fds`` is readable (or at EOF); return it, or None after ``limit``s.

    Only one coroutine may wait on a given fd at a time (``add_reader`` replaces callbacks).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int | None] = loop.create_future()

    def wake(value: int | None) -> None:
        if not fut.done():
            fut.set_result(value)

    for fd in fds:
        loop.add_reader(fd, wake, fd)
    handle = loop.call_later(limit, wake, None) if limit is not None else None
    try:
        return await fut
    finally:
        for fd in fds:
            loop.remove_reader(fd)
        if handle is not None:
            handle.cancel()


async def _wait_exit(process: BaseProcess, limit: float | None) -> bool:
    """Wait until ``process`` has exited and been reaped; False if ``limit``s ran out."""
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    while process.exitcode is None:  # polls waitpid(WNOHANG)
        step = _EXIT_POLL
        if deadline is not None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            step = min(step, remaining)
        if await _wait_readable([process.sentinel], step) is not None:
            # The sentinel closes a moment before the child becomes reapable.
            await asyncio.sleep(0.001)
    return True


@dataclass(eq=False)
class _Child:
    process: BaseProcess
    requests: Connection  # parent -> child
    replies: Connection  # child -> parent


class _Fault(enum.Enum):
    CRASHED = enum.auto()
    TIMED_OUT = enum.auto()


@dataclass(frozen=True)
class ProcessPoolStats:
    """A snapshot of a ``ProcessExecutor``; ``restarts`` counts replacement children."""

    size: int
    busy: int
    idle: int
    restarts: int
    crashes: int
    timeouts: int


class ProcessExecutor:
    """A pool of ``size`` child processes, each running one call at a time.

    ``invoker`` is the ``"package.module:function"`` import path of an ``Invoker``; it is
    imported in every child at start-up, and ``start`` fails if that import fails.
    """

    def __init__(
        self,
        size: int,
        invoker: str,
        *,
        start_method: str = "spawn",
        start_timeout: float = 60.0,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        if start_method not in ("spawn", "forkserver"):
            raise ValueError(f"start_method must be 'spawn' or 'forkserver', not {start_method!r}")
        if ":" not in invoker:
            raise ValueError(f"invoker must look like 'package.module:function', not {invoker!r}")
        self._size = size
        self._invoker = invoker
        self._ctx: SpawnContext | ForkServerContext = (
            multiprocessing.get_context("spawn")
            if start_method == "spawn"
            else multiprocessing.get_context("forkserver")
        )
        self._start_timeout = start_timeout
        self._children: set[_Child] = set()  # every child not yet reaped
        self._idle: deque[_Child] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._busy = 0
        self._settled = asyncio.Event()  # set while no child is alive or busy
        self._settled.set()
        self._reapers: set[asyncio.Task[int | None]] = set()
        self._starters: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._restarts = self._crashes = self._timeouts = 0

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def statistics(self) -> ProcessPoolStats:
        return ProcessPoolStats(
            size=self._size,
            busy=self._busy,
            idle=len(self._idle),
            restarts=self._restarts,
            crashes=self._crashes,
            timeouts=self._timeouts,
        )

    async def start(self) -> None:
        """Start all children and wait until each has imported the invoker."""
        if self._started:
            raise ExecutorError("executor already started")
        self._started = True
        results = await asyncio.gather(
            *(self._start_child() for _ in range(self._size)), return_exceptions=True
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        for result in results:
            if isinstance(result, _Child):
                if failures:
                    self._retire(result, kill=True, replace=False)
                else:
                    self._idle.append(result)
        if failures:
            await self.aclose(grace=0)
            raise failures[0]

    async def run(self, target: str, payload: bytes, timeout: float | None) -> bytes:
        """Run ``invoker(target, payload)`` in a free child and return its result bytes.

        Waits for a free child for as long as the caller lets it (cancel to bound it); the
        timeout only covers the call itself.  Cancelling the call kills its child.
        """
        if not self._started:
            raise ExecutorError("executor not started")
        request = _encoder.encode(_Call(target, payload))
        child = await self._acquire()
        try:
            outcome = await self._exchange(child, request, timeout)
        except BaseException:  # cancelled: the work is abandoned with its child
            self._retire(child, kill=True, replace=True)
            self._unbusy()
            raise
        self._unbusy()
        if outcome is _Fault.TIMED_OUT:
            self._timeouts += 1
            await asyncio.shield(self._retire(child, kill=True, replace=True))
            raise ExecutionTimeout(f"call to {target!r} exceeded its {timeout}s timeout")
        if outcome is _Fault.CRASHED:
            closing = self._closing
            if not closing:
                self._crashes += 1
            exitcode = await asyncio.shield(self._retire(child, kill=False, replace=True))
            if closing:
                raise ExecutorClosed("executor closed while the call was running")
            raise ChildCrashed(exitcode)
        self._release(child)
        try:
            reply = _reply_decoder.decode(outcome)
        except msgspec.DecodeError as exc:
            raise ExecutorError(f"malformed reply from executor child: {exc}") from None
        if isinstance(reply, _Err):
            raise RemoteError(reply.type_name, reply.message, reply.traceback)
        return reply.result

    async def aclose(self, grace: float = 5.0) -> None:
        """Stop all children and reap them.

        Idle children are asked to exit (their request pipe is closed); running calls get
        up to ``grace`` seconds to finish.  Anything still alive then is SIGKILLed, and its
        caller gets ``ExecutorClosed``.
        """
        deadline = asyncio.get_running_loop().time() + grace
        self._closing = True
        try:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            for starter in self._starters:
                starter.cancel()
            while self._idle:
                self._retire(self._idle.popleft(), kill=False, replace=False, grace=grace)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await self._settled.wait()
            for child in self._children:  # incl. busy ones: their callers see the exit
                child.process.kill()
            await self._settled.wait()
            await asyncio.gather(*self._starters, *self._reapers, return_exceptions=True)
        except BaseException:
            for child in self._children:
                child.process.kill()
            raise

    # -- pool bookkeeping ------------------------------------------------------------------

    async def _acquire(self) -> _Child:
        loop = asyncio.get_running_loop()
        while True:
            if self._closing:
                raise ExecutorClosed("executor is closed")
            if self._idle:
                child = self._idle.popleft()
                if child.process.exitcode is not None:  # died while idle
                    self._crashes += 1
                    self._retire(child, kill=False, replace=True)
                    continue
                self._busy += 1
                self._settled.clear()
                return child
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # pass our wake-up on to the next waiter
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
                raise

    def _unbusy(self) -> None:
        self._busy -= 1
        self._update_settled()

    def _update_settled(self) -> None:
        if self._busy or self._children:
            self._settled.clear()
        else:
            self._settled.set()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _release(self, child: _Child) -> None:
        if self._closing:
            self._retire(child, kill=False, replace=False)
            return
        self._idle.append(child)
        self._wake_one()

    def _retire(
        self, child: _Child, *, kill: bool, replace: bool, grace: float = _CRASH_GRACE
    ) -> asyncio.Task[int | None]:
        """Stop ``child`` (synchronously SIGKILL it if ``kill``) and reap it in a task."""
        if kill:
            child.process.kill()
        if replace and not self._closing:
            self._restarts += 1
            self._track(self._starters, self._replace())
        return self._track(self._reapers, self._reap(child, grace))

    def _track(
        self, tasks: set[asyncio.Task[_T]], coro: Coroutine[Any, Any, _T]
    ) -> asyncio.Task[_T]:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def _reap(self, child: _Child, grace: float) -> int | None:
        try:
            child.requests.close()  # EOF asks a healthy child to exit
            if not await _wait_exit(child.process, grace):
                child.process.kill()
                await _wait_exit(child.process, None)
            return child.process.exitcode
        finally:
            if child.process.exitcode is None:  # cancelled at loop teardown
                child.process.kill()
                child.process.join(1.0)
            child.replies.close()
            if child.process.exitcode is not None:
                self._children.discard(child)
                self._update_settled()
                child.process.close()

    async def _replace(self) -> None:
        delay = 0.1
        while not self._closing:
            try:
                child = await self._start_child()
            except (ExecutorError, OSError) as exc:
                _log.warning("could not start a replacement executor child: %s", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_RESTART_DELAY)
                continue
            self._release(child)
            return

    async def _start_child(self) -> _Child:
        req_r, req_w = self._ctx.Pipe(duplex=False)
        rep_r, rep_w = self._ctx.Pipe(duplex=False)
        process = self._ctx.Process(
            target=_child_main,
            args=(self._invoker, req_r, rep_w),
            name="fairlane-executor-child",
            daemon=True,
        )
        try:
            process.start()
        except BaseException:
            req_w.close()
            rep_r.close()
            raise
        finally:
            req_r.close()  # the child has its own copies now
            rep_w.close()
        child = _Child(process, req_w, rep_r)
        self._children.add(child)
        self._settled.clear()
        hello: _Ok | _Err | None = None
        try:
            ready = await _wait_readable((rep_r.fileno(), process.sentinel), self._start_timeout)
            if ready is not None:
                with contextlib.suppress(EOFError, OSError, msgspec.DecodeError):
                    if rep_r.poll(0):
                        hello = _reply_decoder.decode(rep_r.recv_bytes())
        finally:
            if not isinstance(hello, _Ok):
                self._retire(child, kill=True, replace=False)
        if isinstance(hello, _Ok):
            return child
        if isinstance(hello, _Err):
            raise ExecutorError(
                f"executor child could not load invoker {self._invoker!r}: "
                f"{hello.type_name}: {hello.message}\n{hello.traceback}"
            )
        if ready is None:
            raise ExecutorError(
                f"executor child did not become ready within {self._start_timeout}s"
            )
        raise ExecutorError("executor child exited during start-up (see its stderr)")

    async def _exchange(self, child: _Child, request: bytes, limit: float | None) -> bytes | _Fault:
        try:
            child.requests.send_bytes(request)
        except OSError:
            return _Fault.CRASHED
        ready = await _wait_readable((child.replies.fileno(), child.process.sentinel), limit)
        if ready is None:
            return _Fault.TIMED_OUT
        try:
            # Prefer a complete reply even if the child exited right after sending it.
            if child.replies.poll(0):
                return child.replies.recv_bytes()
        except (EOFError, OSError):
            pass
        return _Fault.CRASHED


# --------------------------------------------------------------------------- threads


class ThreadExecutor:
    """Runs invokers in at most ``size`` threads.

    A thread cannot be killed: on timeout the caller gets ``ExecutionTimeout`` at once, the
    thread runs on and its result is discarded, and its slot stays taken until it returns.
    Exceptions raised by the invoker propagate unchanged.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=size, thread_name_prefix="fairlane-sync"
        )
        self._slots = asyncio.Semaphore(size)
        self._running: set[concurrent.futures.Future[bytes]] = set()
        self._closed = False

    async def run(
        self,
        invoker: Invoker,
        target: str,
        payload: bytes,
        timeout: float | None,
    ) -> bytes:
        """Run ``invoker(target, payload)`` in a thread; the timeout excludes waiting for one."""
        loop = asyncio.get_running_loop()
        await self._slots.acquire()
        try:
            if self._closed:
                raise ExecutorClosed("executor is closed")
            call = functools.partial(contextvars.copy_context().run, invoker, target, payload)
            future = self._pool.submit(call)
        except BaseException:
            self._slots.release()
            raise
        self._running.add(future)
        future.add_done_callback(functools.partial(self._finished, loop))
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if deadline.expired():
                raise ExecutionTimeout(
                    f"call to {target!r} exceeded its {timeout}s timeout (thread left running)"
                ) from None
            raise

    def _finished(
        self, loop: asyncio.AbstractEventLoop, future: concurrent.futures.Future[bytes]
    ) -> None:
        # Runs in the worker thread (or wherever the future was cancelled).
        def release() -> None:
            self._running.discard(future)
            self._slots.release()

        with contextlib.suppress(RuntimeError):  # loop closed: nobody waits for the slot
            loop.call_soon_threadsafe(release)

    async def aclose(self, grace: float = 5.0) -> None:
        """Refuse new calls, drop queued ones, and wait up to ``grace`` for running threads."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._running:
            await asyncio.wait([asyncio.wrap_future(f) for f in self._running], timeout=grace)
