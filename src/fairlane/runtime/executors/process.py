"""The process pool: kill-able children that run sync task code one call at a time.

``ProcessExecutor`` keeps ``size`` children (``spawn`` or ``forkserver``, never
``fork``: the parent is a threaded asyncio process), hands each call to an idle one and
queues callers while none is. A child that crashes, times out or whose caller is
cancelled is killed, reaped and replaced, and the parent is never affected. One child
and its protocol are ``child.py``'s; this module owns the pool's bookkeeping: idle and
busy children, waiting callers, replacements with backoff, and closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
from collections import deque
from collections.abc import Coroutine
from multiprocessing.context import ForkServerContext, SpawnContext
from types import TracebackType
from typing import Any, Final, Self, TypeVar

import msgspec

from fairlane.runtime.executors.base import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorClosed,
    ExecutorError,
)
from fairlane.runtime.executors.child import Child, Fault, pack_call, spawn_child, unpack_reply

__all__ = ["ProcessExecutor", "ProcessPoolStats"]

_log = logging.getLogger("fairlane.runtime.executors")
_T = TypeVar("_T")

_CRASH_GRACE: Final = 1.0  # how long a child that closed its pipe gets to finish exiting
_MAX_RESTART_DELAY: Final = 5.0


class ProcessPoolStats(msgspec.Struct, frozen=True):
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
        self._children: set[Child] = set()  # every child not yet reaped
        self._idle: deque[Child] = deque()
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
            if isinstance(result, Child):
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
        request = pack_call(target, payload)
        child = await self._acquire()
        try:
            outcome = await child.call(request, timeout)
        except BaseException:  # cancelled: the work is abandoned with its child
            self._retire(child, kill=True, replace=True)
            self._unbusy()
            raise
        self._unbusy()
        if outcome is Fault.TIMED_OUT:
            self._timeouts += 1
            await asyncio.shield(self._retire(child, kill=True, replace=True))
            raise ExecutionTimeout(f"call to {target!r} exceeded its {timeout}s timeout")
        if outcome is Fault.CRASHED:
            closing = self._closing
            if not closing:
                self._crashes += 1
            exitcode = await asyncio.shield(self._retire(child, kill=False, replace=True))
            if closing:
                raise ExecutorClosed("executor closed while the call was running")
            raise ChildCrashed(exitcode)
        self._release(child)
        return unpack_reply(outcome)

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
                child.kill()
            await self._settled.wait()
            await asyncio.gather(*self._starters, *self._reapers, return_exceptions=True)
        except BaseException:
            for child in self._children:
                child.kill()
            raise

    # -- pool bookkeeping ------------------------------------------------------------------

    async def _acquire(self) -> Child:
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

    def _release(self, child: Child) -> None:
        if self._closing:
            self._retire(child, kill=False, replace=False)
            return
        self._idle.append(child)
        self._wake_one()

    def _retire(
        self, child: Child, *, kill: bool, replace: bool, grace: float = _CRASH_GRACE
    ) -> asyncio.Task[int | None]:
        """Stop ``child`` (synchronously SIGKILL it if ``kill``) and reap it in a task."""
        if kill:
            child.kill()
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

    async def _reap(self, child: Child, grace: float) -> int | None:
        try:
            return await child.stop(grace)
        finally:
            if child.release():
                self._children.discard(child)
                self._update_settled()

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

    async def _start_child(self) -> Child:
        child = spawn_child(self._ctx, self._invoker)
        self._children.add(child)
        self._settled.clear()
        failure: str | None = "cancelled during start-up"
        try:
            failure = await child.handshake(self._invoker, self._start_timeout)
        finally:
            if failure is not None:
                self._retire(child, kill=True, replace=False)
        if failure is not None:
            raise ExecutorError(failure)
        return child
