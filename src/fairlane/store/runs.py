"""The store's side of durable workflow runs: typed calls to the run scripts.

Each call is one script (``lua/workflows.lua``), fenced by the run's lease token
where it writes: a worker that lost its lease changes nothing. Checkpoints are
msgpack arrays ``[kind, name, status, value, ms, worker, end ms]`` (server time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec
from redis.exceptions import ResponseError

from fairlane.store.argv import (
    SignalArg,
    WfChildrenArg,
    WfLoadArg,
    WfStepArg,
    WfWaitArg,
    argv,
)
from fairlane.store.base import StoreBase
from fairlane.store.wire import LoadReply, at

__all__ = [
    "Checkpoint",
    "CorruptRunHistory",
    "LogEvent",
    "RunHistory",
    "RunStore",
    "SliceStart",
    "WaitAnswer",
]

_UNPACK = msgspec.msgpack.Decoder()
_PACK = msgspec.msgpack.Encoder()


class CorruptRunHistory(Exception):
    """A run's stored history cannot be read, so it cannot be replayed; no retry can help."""


class Checkpoint(msgspec.Struct, array_like=True, frozen=True):
    """One completed operation of a run, as replay reads it."""

    kind: str  # step | sleep | signal | children
    name: str
    status: str  # ok | timeout
    value: str | bytes  # JSON text (step, signal) or msgpack (children)
    ms: int  # how long it took (a step's run, a wait's wait)
    worker: str
    ended_ms: int


class SliceStart(msgspec.Struct, frozen=True):
    """What a worker needs to resume a run."""

    service_class: str
    steps: list[Checkpoint]
    failures: dict[str, int]  # step name -> failed attempts so far


class WaitAnswer(msgspec.Struct, frozen=True):
    """The store's answer to a durable wait: taken, over, or wait ``ms`` more."""

    kind: Literal["signal", "done", "wait", "fenced"]
    payload: str = ""
    ms: int = 0


class LogEvent(msgspec.Struct, frozen=True):
    """One entry of a run's log: a slice began, the run suspended, or it ended."""

    kind: str  # slice | suspend | end
    detail: str  # the worker, what it waits for, or the final status
    at_ms: int
    extra: int  # the attempt, the wake time, or 0


class RunHistory(msgspec.Struct, frozen=True):
    """A run's checkpoints and log, for inspection."""

    steps: list[Checkpoint]
    log: list[LogEvent]
    pending_signals: int


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _checkpoint(raw: bytes) -> Checkpoint:
    kind, name, status, value, ms, worker, ended = _UNPACK.decode(raw)
    return Checkpoint(
        _text(kind), _text(name), _text(status), value, int(ms), _text(worker), int(ended)
    )


class RunStore:
    """Run checkpoints, waits, children and signals on one store."""

    def __init__(self, store: StoreBase) -> None:
        self.store = store

    async def _call(self, name: str, args: Sequence[Any]) -> Any:
        return await self.store.fcall(name, self.store.keys.common(), args)

    async def load(self, run_id: str, token: str, worker: str) -> SliceStart | None:
        """Begin a slice: the history to replay; None when the lease is not ours."""
        try:
            reply = await self._call(
                "wf_load", argv(WfLoadArg, run=run_id, token=token, worker=worker)
            )
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            raise CorruptRunHistory(
                f"run {run_id}: a key of its history is corrupt: {exc}"
            ) from None
        if int(at(reply, LoadReply.HELD)) != 1:
            return None
        try:
            fails = at(reply, LoadReply.FAILURES)
            failures = {_text(fails[i]): int(fails[i + 1]) for i in range(0, len(fails), 2)}
            steps = [_checkpoint(r) for r in at(reply, LoadReply.STEPS)]
            return SliceStart(_text(at(reply, LoadReply.SERVICE_CLASS)), steps, failures)
        except (msgspec.DecodeError, ValueError, TypeError, IndexError) as exc:
            # anything but what wf_step wrote: replaying it could only go wrong
            raise CorruptRunHistory(f"run {run_id}: its stored history is corrupt: {exc}") from None

    async def checkpoint(  # noqa: PLR0917 - the checkpoint's own fields
        self,
        run_id: str,
        token: str,
        seq: int,
        kind: str,
        name: str,
        value: str,
        ms: int,
        worker: str,
    ) -> int:
        """Checkpoint operation ``seq``: 1 done, 0 the lease is lost, -1 out of order."""
        args = argv(
            WfStepArg,
            run=run_id,
            token=token,
            seq=seq,
            kind=kind,
            name=name,
            status="ok",
            value=value,
            ms=ms,
            worker=worker,
        )
        return int(await self._call("wf_step", args))

    async def step_failed(self, run_id: str, token: str, name: str) -> int:
        """Count a failed attempt of step ``name`` (its next attempt gets a new key)."""
        args = argv(
            WfStepArg,
            run=run_id,
            token=token,
            seq=0,
            kind="step",
            name=name,
            status="failed",
            value="",
            ms=0,
            worker="",
        )
        return int(await self._call("wf_step", args))

    async def wait(  # noqa: PLR0917 - the wait's own fields
        self,
        run_id: str,
        token: str,
        seq: int,
        kind: Literal["sleep", "signal"],
        name: str,
        ms: int,
        worker: str,
        *,
        absolute: bool = False,
    ) -> WaitAnswer:
        args = argv(
            WfWaitArg,
            run=run_id,
            token=token,
            seq=seq,
            kind=kind,
            name=name,
            ms=ms,
            absolute="1" if absolute else "0",
            worker=worker,
        )
        reply = await self._call("wf_wait", args)
        what = _text(reply[0])
        if what == "signal":
            return WaitAnswer("signal", _text(reply[1]))
        if what == "wait":
            return WaitAnswer("wait", ms=int(reply[1]))
        return WaitAnswer("done" if what == "done" else "fenced")

    async def children(  # noqa: PLR0917 - the wait's own fields
        self, run_id: str, token: str, seq: int, name: str, ids: Sequence[str], worker: str
    ) -> tuple[str, list[Any]]:
        """Operation ``seq`` waits for ``ids``: ('done', [[status, payload], ..]),
        ('wait', ids already settled) or ('fenced', [])."""
        args = argv(
            WfChildrenArg,
            run=run_id,
            token=token,
            seq=seq,
            name=name,
            children=_PACK.encode(list(ids)),
            worker=worker,
        )
        reply = await self._call("wf_children", args)
        what = _text(reply[0])
        if what == "done":
            return what, [_UNPACK.decode(r) for r in reply[1:]]
        return what, [_text(r) for r in reply[1:]]

    async def signal(self, run_id: str, name: str, payload: str, signal_id: str = "") -> int:
        """1 delivered, 2 a duplicate id, 0 the run has finished, -1 no such run."""
        args = argv(SignalArg, run=run_id, name=name, payload=payload, signal_id=signal_id)
        return int(await self._call("signal", args))

    async def history(self, run_id: str) -> RunHistory:
        client, keys = self.store.client, self.store.keys
        async with client.pipeline(transaction=False) as pipe:
            pipe.lrange(keys.run(run_id, "steps"), 0, -1)
            pipe.lrange(keys.run(run_id, "log"), 0, -1)
            pipe.llen(keys.run(run_id, "sig"))
            steps, log, pending = await self.store._call(pipe.execute)
        events = []
        for raw in log:
            kind, detail, at, *rest = _UNPACK.decode(raw)
            events.append(
                LogEvent(_text(kind), _text(detail), int(at), int(rest[0]) if rest else 0)
            )
        return RunHistory([_checkpoint(r) for r in steps], events, int(pending))
