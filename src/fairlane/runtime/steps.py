"""A workflow step: which one is running (``StepInfo``, ``current_step()``), and running it.

A step's ``key`` is stable across re-executions of one attempt of it, so a step can use
it as the idempotency key of what it does outside (a payment, an email). It is set
while an async or thread step runs; a process step runs in another process, where it
is not set (pass it ``ctx.step_key(name)`` as an argument instead).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from fairlane.codec import ArgsCodec
from fairlane.runtime.invoke import target_of

if TYPE_CHECKING:
    from fairlane.runtime.executors import ProcessExecutor

__all__ = [
    "ProcessPool",
    "StepExecutor",
    "StepInfo",
    "current_step",
    "execute_step",
    "running_step",
]

StepExecutor = Literal["async", "thread", "process"]
#: the worker's kill-able process pool, started on first use
ProcessPool = Callable[[], Awaitable["ProcessExecutor"]]


@dataclass(frozen=True, slots=True)
class StepInfo:
    """The step running now: ``key`` is stable across re-executions of one attempt."""

    run_id: str
    name: str
    attempt: int

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.name}:{self.attempt}"


#: set by the context around a step that runs, in the step's own task or thread
running_step: contextvars.ContextVar[StepInfo | None] = contextvars.ContextVar(
    "fairlane_step", default=None
)


def current_step() -> StepInfo:
    """The step being executed (in an async or thread step); its ``key`` is the step's
    idempotency key. A process step runs in another process, where this is not set:
    pass it ``ctx.step_key(name)`` as an argument."""
    info = running_step.get()
    if info is None:
        raise RuntimeError("current_step() is only available inside a workflow step")
    return info


async def execute_step(  # noqa: PLR0917 - one call's parts
    fn: Callable[..., Any],
    codec: ArgsCodec,
    info: StepInfo,
    executor: StepExecutor | None,
    timeout: float | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    process_pool: ProcessPool,
) -> bytes:
    """Run a step's function as ``executor`` says (``async`` for a coroutine function,
    else ``thread`` by default), bounded by ``timeout``; its result encoded."""
    kind = executor or ("async" if inspect.iscoroutinefunction(fn) else "thread")
    reset = running_step.set(info)
    try:
        if kind == "async":
            async with asyncio.timeout(timeout):
                value = await fn(*args, **kwargs)
        elif kind == "thread":
            async with asyncio.timeout(timeout):
                value = await asyncio.to_thread(fn, *args, **kwargs)
        else:
            pool = await process_pool()
            payload = codec.encode(args, kwargs)
            return await pool.run(target_of(fn), payload, timeout)
    finally:
        running_step.reset(reset)
    return codec.encode_result(value)
