"""One process-pool child and the protocol between it and the parent.

Parent and child talk over two one-way pipes with ``Connection.send_bytes`` /
``recv_bytes`` and msgpack frames (``_Call`` requests, ``_Ok`` / ``_Err`` replies);
nothing is pickled except the child's entry-point arguments. The child first answers
an empty ``_Ok`` once it has imported its invoker (or an ``_Err`` saying why it could
not), then runs one call at a time until its request pipe closes.

The parent's side waits on the pipes with ``loop.add_reader`` and therefore needs an
asyncio event loop. Once the first bytes of a reply are readable the rest of that frame
is read synchronously: the child writes a whole frame at once, so this only blocks the
loop for the time it takes to copy the reply. Requests are written synchronously for
the same reason: the idle child is already blocked reading them.

This module owns a single child: starting it, the hand-shake, one call, and stopping
and reaping it. Which child runs which call, and replacing the ones that fail, is the
pool's (``process.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib
import multiprocessing
import signal
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any, Final

import msgspec

from fairlane.runtime.executors.base import ExecutorError, Invoker, RemoteError

__all__ = ["Child", "Fault", "child_main", "pack_call", "spawn_child", "unpack_reply"]

_EXIT_POLL: Final = 0.05  # fallback poll interval while waiting for a child to exit


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


def pack_call(target: str, payload: bytes) -> bytes:
    """The request frame of one call."""
    return _encoder.encode(_Call(target, payload))


def unpack_reply(frame: bytes) -> bytes:
    """The result bytes of a reply frame; ``RemoteError`` if the invoker raised."""
    try:
        # msgspec 0.19 types the decoder of a union as a decoder of Any
        reply: _Ok | _Err = _reply_decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise ExecutorError(f"malformed reply from executor child: {exc}") from None
    if isinstance(reply, _Err):
        raise RemoteError(reply.type_name, reply.message, reply.traceback)
    return reply.result


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


def child_main(invoker_path: str, requests: Connection, replies: Connection) -> None:
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


class Fault(enum.Enum):
    """How a call ended without a reply."""

    CRASHED = enum.auto()
    TIMED_OUT = enum.auto()


class Child(msgspec.Struct, eq=False):
    """A started child process and the parent's ends of its two pipes."""

    process: BaseProcess
    requests: Connection  # parent -> child
    replies: Connection  # child -> parent

    def kill(self) -> None:
        self.process.kill()

    async def handshake(self, invoker: str, limit: float) -> str | None:
        """Wait for the child to have imported its invoker; None once it is ready, else
        why it is not (the caller then retires it)."""
        hello: _Ok | _Err | None = None
        ready = await _wait_readable((self.replies.fileno(), self.process.sentinel), limit)
        if ready is not None:
            with contextlib.suppress(EOFError, OSError, msgspec.DecodeError):
                if self.replies.poll(0):
                    hello = _reply_decoder.decode(self.replies.recv_bytes())
        if isinstance(hello, _Ok):
            return None
        if isinstance(hello, _Err):
            return (
                f"executor child could not load invoker {invoker!r}: "
                f"{hello.type_name}: {hello.message}\n{hello.traceback}"
            )
        if ready is None:
            return f"executor child did not become ready within {limit}s"
        return "executor child exited during start-up (see its stderr)"

    async def call(self, request: bytes, limit: float | None) -> bytes | Fault:
        """Send one request frame and wait up to ``limit``s for the reply frame."""
        try:
            self.requests.send_bytes(request)
        except OSError:
            return Fault.CRASHED
        ready = await _wait_readable((self.replies.fileno(), self.process.sentinel), limit)
        if ready is None:
            return Fault.TIMED_OUT
        try:
            # Prefer a complete reply even if the child exited right after sending it.
            if self.replies.poll(0):
                return self.replies.recv_bytes()
        except (EOFError, OSError):
            pass
        return Fault.CRASHED

    async def stop(self, grace: float) -> int | None:
        """Ask the child to exit (EOF on its requests), SIGKILL it after ``grace``s, and
        wait until it is reaped; its exit code."""
        self.requests.close()  # EOF asks a healthy child to exit
        if not await _wait_exit(self.process, grace):
            self.process.kill()
            await _wait_exit(self.process, None)
        return self.process.exitcode

    def release(self) -> bool:
        """Let go of the child's handles after ``stop`` (which a loop's teardown may have
        cut short: the child is then killed and joined here); True once it has exited."""
        if self.process.exitcode is None:  # cancelled at loop teardown
            self.process.kill()
            self.process.join(1.0)
        self.replies.close()
        if self.process.exitcode is None:
            return False
        self.process.close()
        return True


def spawn_child(ctx: SpawnContext | ForkServerContext, invoker: str) -> Child:
    """Start a child that will import ``invoker``; its hand-shake is still to come."""
    req_r, req_w = ctx.Pipe(duplex=False)
    rep_r, rep_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=child_main,
        args=(invoker, req_r, rep_w),
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
    return Child(process, req_w, rep_r)
