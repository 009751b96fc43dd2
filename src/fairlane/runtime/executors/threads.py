"""The thread executor: sync task code in a bounded pool of the worker's own threads."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools

from fairlane.runtime.executors.base import ExecutionTimeout, ExecutorClosed, Invoker

__all__ = ["ThreadExecutor"]


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
