"""Reads written once for both clients: a read model's commands, and how they run.

A read model (``fairlane.store.views``) reads as a *plan*: a generator that yields a
batch of commands -- one pipelined round trip -- receives their replies in order, and
may yield again with commands that depend on them, until it returns its snapshot. The
plan holds every key, field and parser; the runners only send commands:
:func:`run_async` on the asyncio client (the dashboard, the command line, the demo),
:func:`run_sync` on a synchronous one (the metrics scrape runs in a thread). So one
parser serves both, and a plan can be tested by handing it replies, with no server.

Two commands are not pipelined: ``TIME`` (a cluster pipeline refuses a command that
names no key; it is sent on its own to the node holding the key it is given, whose
clock the scripts that wrote that shard used) and a whole ``HSCAN`` (a cursor loop,
its reply the matching fields as a dict). They run after the batch's pipeline, and
their replies take their places in the batch's order. An empty batch costs nothing.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final, TypeVar

import msgspec

from fairlane.store.connection import (
    AsyncClient,
    SyncClient,
    server_time_ms,
    sync_server_time_ms,
)

__all__ = ["Cmd", "Plan", "cmd", "run_async", "run_sync", "scan_fields", "server_time"]

T = TypeVar("T")

_TIME: Final = "time"
_HSCAN: Final = "hscan"


class Cmd(msgspec.Struct, frozen=True):
    """One command: a client method's name and its arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = msgspec.field(default_factory=dict)


def cmd(name: str, *args: Any, **kwargs: Any) -> Cmd:
    return Cmd(name, args, kwargs)


def server_time(key: str) -> Cmd:
    """The server's clock in ms, read on the node holding ``key``'s slot."""
    return Cmd(_TIME, (key,))


def scan_fields(key: str, match: str) -> Cmd:
    """Every field of hash ``key`` matching ``match`` with its value (HSCAN to the end)."""
    return Cmd(_HSCAN, (key, match))


#: a read: yields batches of commands, is sent their replies, returns its snapshot
Plan = Generator[list[Cmd], list[Any], T]

_SPECIAL: Final = frozenset({_TIME, _HSCAN})


class _Done(msgspec.Struct, frozen=True):
    value: Any


def _step(plan: Plan[Any], replies: list[Any] | None) -> list[Cmd] | _Done:
    """The plan's next batch, given the last one's replies; ``_Done`` once it returns."""
    try:
        return next(plan) if replies is None else plan.send(replies)
    except StopIteration as done:
        return _Done(done.value)


def _pipeline(client: Any, batch: list[Cmd]) -> Any:
    pipe = client.pipeline(transaction=False)
    for c in batch:
        if c.name not in _SPECIAL:
            getattr(pipe, c.name)(*c.args, **c.kwargs)
    return pipe


def _piped(batch: list[Cmd]) -> bool:
    return any(c.name not in _SPECIAL for c in batch)


def _merged(batch: list[Cmd], piped: list[Any], special: list[Any]) -> list[Any]:
    """The replies in the batch's order: the pipeline's, and the others' in their places."""
    pipe_replies, other = iter(piped), iter(special)
    return [next(other) if c.name in _SPECIAL else next(pipe_replies) for c in batch]


async def _special_async(client: AsyncClient, c: Cmd) -> Any:
    if c.name == _HSCAN:
        key, match = c.args
        return {k: v async for k, v in client.hscan_iter(key, match=match, count=500)}
    return await server_time_ms(client, c.args[0])  # the key's own node, and its clock


def _special_sync(client: SyncClient, c: Cmd) -> Any:
    if c.name == _HSCAN:
        key, match = c.args
        return dict(client.hscan_iter(key, match=match, count=500))
    return sync_server_time_ms(client, c.args[0])


async def _batch_async(client: AsyncClient, batch: list[Cmd]) -> list[Any]:
    piped = await _pipeline(client, batch).execute() if _piped(batch) else []
    special = [await _special_async(client, c) for c in batch if c.name in _SPECIAL]
    return _merged(batch, piped, special)


def _batch_sync(client: SyncClient, batch: list[Cmd]) -> list[Any]:
    piped = _pipeline(client, batch).execute() if _piped(batch) else []
    special = [_special_sync(client, c) for c in batch if c.name in _SPECIAL]
    return _merged(batch, piped, special)


async def run_async(client: AsyncClient, plan: Plan[T]) -> T:
    """Run ``plan`` on an asyncio client, one round trip per batch it yields."""
    step = _step(plan, None)
    while not isinstance(step, _Done):
        step = _step(plan, await _batch_async(client, step))
    result: T = step.value
    return result


def run_sync(client: SyncClient, plan: Plan[T]) -> T:
    """Run ``plan`` on a synchronous client, one round trip per batch it yields."""
    step = _step(plan, None)
    while not isinstance(step, _Done):
        step = _step(plan, _batch_sync(client, step))
    result: T = step.value
    return result
