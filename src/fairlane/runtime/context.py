"""A workflow run's ``Context``: replay of checkpoints, new steps, durable waits, children.

A run executes its function from the top in every slice. Each operation it asks for
(a step, a sleep, a wait for a signal, a wait for children) has a place in the run's
history. While the history has an entry for that place, the operation is *replayed*:
the checkpointed result is returned and nothing runs. Past the end of the history the
operation runs for real and is checkpointed, fenced by the run's lease, before the
function goes on. An operation that does not match the history's entry at its place
means the code took another path than it did before: the run fails with
``NonDeterminismError`` instead of silently diverging.

A slice ends when the run finishes, when a wait cannot be satisfied yet (the run
suspends and holds nothing while it waits), or when the slice's budget of new steps
or seconds is spent (the run yields its slot and re-enters fair dispatch).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, overload

import msgspec

from fairlane.codec import ArgsCodec, decode_error
from fairlane.config.settings import DurabilitySettings
from fairlane.errors import FairlaneError, TaskFailed
from fairlane.policy.slicing import SliceBudget
from fairlane.registry import TaskDefinition
from fairlane.runtime.checkpoints import codec_of, decode_as, decode_result, unpack_results
from fairlane.runtime.children import ChildCall, start_children
from fairlane.runtime.hooks import WorkerHooks
from fairlane.runtime.steps import (
    ProcessPool,
    StepExecutor,
    StepInfo,
    current_step,
    execute_step,
)
from fairlane.store.runs import Checkpoint, CorruptRunHistory

if TYPE_CHECKING:
    from fairlane.store.api import Store

__all__ = [
    "ChildCall",
    "ChildFailed",
    "Context",
    "NonDeterminismError",
    "ProcessPool",
    "StepInfo",
    "current_step",
]

T = TypeVar("T")


class NonDeterminismError(FairlaneError):
    """The workflow asked for other operations than its history holds."""


class ChildFailed(TaskFailed):
    """A child job of the run did not complete."""


class Suspend(BaseException):
    """Ends the slice: the run waits (``wait``) for at most ``delay_ms``.

    A ``BaseException``, so that a workflow's own ``except Exception`` cannot swallow
    the end of its slice.
    """

    def __init__(self, wait: str, delay_ms: int) -> None:
        super().__init__(wait)
        self.wait = wait
        self.delay_ms = delay_ms


class LeaseLost(BaseException):
    """A checkpoint was fenced: another worker may own the run now; stop writing."""


class Diverged(BaseException):
    """Carries a ``NonDeterminismError`` (or a corrupt history) out past the workflow's
    own handlers."""

    def __init__(self, error: NonDeterminismError | CorruptRunHistory) -> None:
        super().__init__(str(error))
        self.error = error


class Context:
    """What a workflow function receives: its run, and the durable operations."""

    def __init__(
        self,
        *,
        store: Store,
        run_id: str,
        token: str,
        tenant: str,
        service_class: str,
        worker: str,
        fairness_key: str = "",
        history: Sequence[Checkpoint],
        failures: dict[str, int],
        budget: SliceBudget,
        max_children: int,
        process_pool: ProcessPool,
        durability: DurabilitySettings,
        hooks: WorkerHooks,
    ) -> None:
        self.run_id = run_id
        self.tenant = tenant
        self.fairness_key = fairness_key  # the run's own ('' none): its children inherit it
        self.service_class = service_class
        self._store = store
        self._token = token
        self._worker = worker
        self._history = list(history)
        self._failures = dict(failures)
        self._budget = budget
        self._max_children = max_children
        self._process_pool = process_pool
        self._durability = durability
        self._hooks = hooks
        self._seq = 0
        self._names: set[str] = set()

    @property
    def replaying(self) -> bool:
        """True while the run re-reads its history (no operation runs for real)."""
        return self._seq < len(self._history)

    @property
    def checkpoints_read(self) -> int:
        """Operations done so far in this slice, replayed or new."""
        return self._seq

    def step_key(self, name: str) -> str:
        """The idempotency key step ``name`` has in its current attempt."""
        return StepInfo(self.run_id, name, self._failures.get(name, 0) + 1).key

    # -- history ---------------------------------------------------------------------

    def _replay(self, kind: str, name: str) -> Checkpoint | None:
        """The checkpoint at the next place, checked against what the code asks for."""
        if self._seq >= len(self._history):
            return None
        entry = self._history[self._seq]
        if entry.kind != kind or entry.name != name:
            raise Diverged(
                NonDeterminismError(
                    f"run {self.run_id}: operation {self._seq} was {entry.kind} {entry.name!r} "
                    f"when the run was checkpointed, but the code now asks for {kind} {name!r}; "
                    "a workflow must make the same operations in the same order on every replay"
                )
            )
        self._seq += 1
        return entry

    def _replayed(self, codec: ArgsCodec, entry: Checkpoint) -> Any:
        """A replayed step's result; a checkpoint that is not JSON at all is corrupt."""
        try:
            return decode_result(codec, entry.value)
        except msgspec.ValidationError as exc:
            raise Diverged(
                NonDeterminismError(
                    f"run {self.run_id}: the checkpointed result of step {entry.name!r} no "
                    f"longer fits the step's return type (its code changed?): {exc}"
                )
            ) from None
        except msgspec.DecodeError as exc:
            raise Diverged(
                CorruptRunHistory(
                    f"run {self.run_id}: the checkpointed result of step {entry.name!r} "
                    f"in its history is corrupt: {exc}"
                )
            ) from None

    def _claim(self, name: str) -> None:
        if name in self._names:
            raise ValueError(
                f"operation name {name!r} is used twice in run {self.run_id}: names must be "
                "unique within a run (they key its checkpoints and idempotency keys)"
            )
        self._names.add(name)

    def _fenced(self, written: int) -> None:
        if written == 0:
            raise LeaseLost(self.run_id)
        if written < 0:
            raise Diverged(
                NonDeterminismError(f"run {self.run_id}: checkpoint {self._seq} is out of order")
            )

    # -- steps -----------------------------------------------------------------------

    # two overloads: with the union alone, mypy cannot solve T for a coroutine function
    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        executor: StepExecutor | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[..., T],
        *args: Any,
        executor: StepExecutor | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[..., Awaitable[T]] | Callable[..., T],
        *args: Any,
        executor: StepExecutor | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` once for the run, checkpointing its result.

        Replayed, it returns the checkpointed result without calling ``fn``. The result
        is JSON-encoded and decoded as ``fn``'s return annotation, on both paths, so a
        replay returns what the first run returned. ``executor`` is ``async`` for a
        coroutine function, else ``thread`` by default; ``process`` runs a module-level
        function in a kill-able child process (CPU-bound work).
        """
        self._claim(name)
        codec = codec_of(fn)
        done = self._replay("step", name)
        if done is not None:
            return self._replayed(codec, done)  # type: ignore[no-any-return]
        if self._budget.spent(time.monotonic()):
            raise Suspend("yield", 0)
        info = StepInfo(self.run_id, name, self._failures.get(name, 0) + 1)
        started = time.monotonic()
        # only a step that runs has a span: a replayed one returned above
        with self._hooks.step(info):
            try:
                blob = await execute_step(
                    fn, codec, info, executor, timeout, args, kwargs, self._process_pool
                )
            except Exception:
                self._failures[name] = info.attempt
                self._fenced(await self._store.runs.step_failed(self.run_id, self._token, name))
                raise
            ms = round((time.monotonic() - started) * 1000)
            written = await self._store.runs.checkpoint(
                self.run_id, self._token, self._seq, "step", name, blob.decode(), ms, self._worker
            )
            self._fenced(written)
        self._seq += 1
        self._budget.step_done()
        return decode_result(codec, blob)  # type: ignore[no-any-return]

    # -- durable waits ---------------------------------------------------------------

    async def sleep(self, seconds: float) -> None:
        """Sleep durably: the run holds no slot, and wakes on any worker."""
        await self._sleep(f"sleep:{self._seq}", round(max(0.0, seconds) * 1000), absolute=False)

    async def sleep_until(self, when: datetime | float) -> None:
        """Sleep until ``when`` (an aware datetime, or a Unix time in seconds)."""
        moment = when.timestamp() if isinstance(when, datetime) else float(when)
        await self._sleep(f"sleep:{self._seq}", round(moment * 1000), absolute=True)

    async def _sleep(self, name: str, ms: int, *, absolute: bool) -> None:
        if self._replay("sleep", name) is not None:
            return
        answer = await self._store.runs.wait(
            self.run_id, self._token, self._seq, "sleep", name, ms, self._worker, absolute=absolute
        )
        if answer.kind == "fenced":
            raise LeaseLost(self.run_id)
        if answer.kind == "wait":
            raise Suspend("sleep", answer.ms)
        self._seq += 1

    @overload
    async def wait_for_signal(self, name: str, timeout: float | None = None) -> Any: ...

    @overload
    async def wait_for_signal(
        self, name: str, timeout: float | None = None, *, type: type[T]
    ) -> T | None: ...

    async def wait_for_signal(
        self, name: str, timeout: float | None = None, *, type: Any = Any
    ) -> Any:
        """Wait for the signal ``name`` (``app.signal``), holding no slot meanwhile.

        Returns its payload, decoded as ``type``, or None when ``timeout`` seconds
        pass first. A signal sent before the run waits is kept for the wait; signals of
        one name are taken oldest first, one per wait.
        """
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
        op = f"signal:{name}"
        done = self._replay("signal", name)
        if done is not None:
            return None if done.status == "timeout" else decode_as(type, done.value)
        ms = round(timeout * 1000) if timeout is not None else _FOREVER_MS
        answer = await self._store.runs.wait(
            self.run_id, self._token, self._seq, "signal", name, ms, self._worker
        )
        if answer.kind == "fenced":
            raise LeaseLost(self.run_id)
        if answer.kind == "wait":
            raise Suspend(op, answer.ms)
        self._seq += 1
        return None if answer.kind == "done" else decode_as(type, answer.payload)

    # -- children --------------------------------------------------------------------

    def call(self, task: TaskDefinition[Any, Any], /, *args: Any, **kwargs: Any) -> ChildCall:
        """A child call for ``gather``; nothing starts until it is gathered."""
        task.codec.encode(args, kwargs)  # a wrong call fails here, in the workflow
        return ChildCall(task, args, kwargs)

    async def run(self, task: TaskDefinition[Any, T], /, *args: Any, **kwargs: Any) -> T:
        """Run ``task`` as a child job of this run's tenant and wait for its result."""
        (result,) = await self.gather(self.call(task, *args, **kwargs))
        return result  # type: ignore[no-any-return]

    async def gather(self, *calls: ChildCall) -> list[Any]:
        """Run child jobs (at most the workflow's ``max_children`` at once) and wait,
        holding no slot, until all have settled; their results in order. A child that
        failed raises ``ChildFailed`` here (after all have settled)."""
        if not calls:
            return []
        name = ",".join(c.task.name for c in calls)
        done = self._replay("children", name)
        if done is not None:
            return await _child_results(calls, unpack_results(done.value), self.run_id, self._seq)
        if self._budget.spent(time.monotonic()):
            raise Suspend("yield", 0)
        ids = [f"{self.run_id}.{self._seq}.{i}" for i in range(len(calls))]
        runs = self._store.runs
        state, found = await runs.children(
            self.run_id, self._token, self._seq, name, ids, self._worker
        )
        if state == "wait":
            settled = set(found)
            await start_children(
                self._store,
                self.run_id,
                self.tenant,
                self.fairness_key,
                self.service_class,
                self._max_children,
                [(cid, c) for cid, c in zip(ids, calls, strict=True) if cid not in settled],
                self._durability,
                self._hooks,
            )
            raise Suspend("children", _FOREVER_MS)
        if state == "fenced":
            raise LeaseLost(self.run_id)
        self._seq += 1
        return await _child_results(calls, found, self.run_id, self._seq - 1)


_FOREVER_MS = 100 * 365 * 86_400_000  # a wait with no timeout: a century of server ms


async def _child_results(
    calls: Sequence[ChildCall], results: list[Any], run_id: str, seq: int
) -> list[Any]:
    out: list[Any] = []
    for i, (call, (status, payload)) in enumerate(zip(calls, results, strict=True)):
        status_text = status.decode() if isinstance(status, bytes) else str(status)
        blob = payload if isinstance(payload, bytes) else str(payload).encode()
        if status_text != "completed":
            info = decode_error(blob)
            raise ChildFailed(f"{run_id}.{seq}.{i}", info.type, info.message, info.traceback)
        payloads = call.task.factory.payloads
        if payloads is not None:  # a large result waits in the payload store
            blob = await payloads.resolve(blob)
        out.append(call.task.codec.decode_result(blob))
    return out
