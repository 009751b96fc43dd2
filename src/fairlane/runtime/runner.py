"""Running one attempt of a job and turning what happened into an ``Outcome``.

Whatever the task does -- return, raise, time out, crash its child process, be
cancelled -- the runner returns an outcome; nothing a task does can take the
worker down. Retry or dead-letter is decided by ``fairlane.policy.retry``.

A job this worker cannot run at all -- its task unknown here, or its stored arguments
not fitting the task's signature here -- is not the task's failure: while a deploy
rolls out, a producer and a worker on different versions meet, and another worker may
run it. It is handed back (outcome ``handback``): due again ``worker.handback_delay``
later, its attempt given back, counted apart from failures (``handed_back``), until
``worker.deploy_window`` after its first hand-back; then the store dead-letters it as
``UnknownTask`` or ``MalformedArguments``, saying no worker ran it within the window.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from fairlane.codec import Call, PayloadTooLarge, Unbound, encode_error
from fairlane.codec.refs import MalformedReference, is_ref
from fairlane.errors import Throttled
from fairlane.payloads import PayloadMissing
from fairlane.policy.backoff import Backoff
from fairlane.policy.retry import after_failure
from fairlane.registry import Registry, TaskDefinition
from fairlane.runtime import usage
from fairlane.runtime.context import LeaseLost, NonDeterminismError, Suspend
from fairlane.runtime.executors import (
    ChildCrashed,
    ExecutionTimeout,
    ExecutorError,
    RemoteError,
    ThreadExecutor,
)
from fairlane.runtime.hooks import WorkerHooks
from fairlane.runtime.invoke import target_of
from fairlane.runtime.slices import run_slice
from fairlane.runtime.usage import JobContext, reported_ms
from fairlane.store.runs import CorruptRunHistory
from fairlane.store.shards import ShardedStores
from fairlane.store.wire import (
    FetchedJob,
    Outcome,
    OutcomeKind,
    handback_payload,
    pushback_payload,
)

if TYPE_CHECKING:
    from fairlane.runtime.executors.process import ProcessExecutor

__all__ = ["CancelReason", "Runner"]

log = logging.getLogger("fairlane.worker")


class CancelReason:
    """Why the worker cancelled a running attempt."""

    SHUTDOWN = "shutdown"  # grace period over: hand the job back
    TIMEOUT = "timeout"  # an async attempt ran past its timeout
    DEADLINE = "deadline"  # an attempt ran past its job's deadline: the job expires
    CANCELLED = "cancelled"  # the user cancelled the job
    LEASE_LOST = "lease_lost"  # another worker may own it now; our writes would be fenced


class _Failure(Exception):
    """A failed attempt whose error is already encoded."""

    def __init__(self, payload: bytes, *, retryable: bool) -> None:
        self.payload = payload
        self.retryable = retryable


class _Pushback(Exception):
    """A task raised ``Throttled``: its key is paused, the job handed back for later."""

    def __init__(self, exc: Throttled) -> None:
        self.key = exc.key
        self.delay_ms = math.ceil(exc.retry_after * 1000)
        self.payload = encode_error(exc)


class _HandBack(Exception):
    """This worker cannot run the job; another may (see the module docstring)."""

    def __init__(self, type_name: str, reason: str, advice: str = "") -> None:
        super().__init__(reason)
        self.type_name = type_name
        self.reason = reason
        #: added to the dead letter's message: what would have let a worker run it
        self.advice = advice


class Runner:
    """Executes attempts for one worker, with its thread and process executors."""

    def __init__(  # noqa: PLR0917 - the runner's parts
        self,
        registry: Registry,
        stores: ShardedStores,
        threads: ThreadExecutor,
        processes: ProcessExecutor | None,
        worker_id: str = "",
        hooks: WorkerHooks | None = None,
    ) -> None:
        self.registry = registry
        self.stores = stores
        self.threads = threads
        self.processes = processes
        self.worker_id = worker_id
        self.hooks = hooks or WorkerHooks()
        self.max_result = registry.settings.max_payload_bytes
        # what has been logged of jobs this worker handed back or ran without arguments
        # it does not take: once per task and cause, not once per job
        self._told: set[tuple[str, str]] = set()
        self._own_processes = False
        self._process_start = asyncio.Lock()

    async def process_pool(self) -> ProcessExecutor:
        """The kill-able process pool, started on first use (a workflow's process step)."""
        async with self._process_start:
            if self.processes is None:
                settings = self.registry.settings.worker
                from fairlane.runtime.executors.process import ProcessExecutor  # noqa: PLC0415

                pool = ProcessExecutor(
                    settings.process_pool_size or os.cpu_count() or 1,
                    "fairlane.runtime.invoke:invoke_sync",
                )
                await pool.start()
                self.processes, self._own_processes = pool, True
            return self.processes

    async def aclose(self) -> None:
        """Stop the process pool this runner started itself."""
        if self._own_processes and self.processes is not None:
            await self.processes.aclose()
            self.processes, self._own_processes = None, False

    async def run(self, job: FetchedJob) -> Outcome:
        """Run one attempt. ``CancelledError`` propagates to the caller, which knows why.

        The outcome carries what the attempt cost in work units: the usage the task
        reported through ``fairlane.context()``, wall time counting as tool seconds.
        """
        task = self.registry.tasks.get(job.task)
        ctx = JobContext(job.id, job.tenant, job.attempt)
        reset = usage.current.set(ctx)
        started = time.monotonic()
        delay_ms = 0
        try:
            if task is None:
                raise _unknown(job.task, self.registry.name)
            payload = await self._attempt(task, job)
        except _Failure as failure:
            kind, text, delay_ms = self._after_failure(job, failure)
        except _HandBack as back:
            kind, text, delay_ms = self._hand_back(job, back)
        except _Pushback as pushback:
            # the store checks the job holds the key; a key it does not is a failure there
            kind, text = (
                OutcomeKind.THROTTLE,
                pushback_payload(pushback.key, pushback.payload.decode()),
            )
            delay_ms = pushback.delay_ms
        except Suspend as end:
            # the run gives its slot back until what it waits for comes
            kind, text, delay_ms = OutcomeKind.SUSPEND, end.wait, end.delay_ms
        except LeaseLost:
            # another worker may own the run: a release under our token is fenced
            kind, text = OutcomeKind.RELEASE, ""
        else:
            kind, text = OutcomeKind.OK, payload.decode()
        finally:
            usage.current.reset(reset)
        cost = ctx.units(self.registry.pricing.coefficients, time.monotonic() - started)
        self.hooks.used(job, ctx, cost)
        if kind == OutcomeKind.HANDBACK:
            cost = -1.0  # the task never ran: nothing to learn its cost from
            return Outcome(job.id, job.token, kind, text, delay_ms, cost)
        return Outcome(job.id, job.token, kind, text, delay_ms, cost, *reported_ms(ctx))

    async def _attempt(self, task: TaskDefinition[Any, Any], job: FetchedJob) -> bytes:
        timeout = job.timeout or None
        if is_ref(job.args):  # large arguments are read only now that the attempt runs
            job = msgspec.structs.replace(job, args=(await self._resolve_args(job)).decode())
        # malformed arguments never reach the function
        args, kwargs, dropped, trimmed = self._decode(task, job)
        if trimmed is not None:
            # a process child and a workflow's slice decode the arguments again
            job = msgspec.structs.replace(job, args=trimmed.decode())
            self._tell(task.name, "drop:" + ",".join(dropped), _dropped_text(task.name, dropped))
        if task.options.executor == "async":
            # the worker enforces an async attempt's timeout with one timer per job
            try:
                value = await self._call_async(task, job, args, kwargs)
            except (NonDeterminismError, CorruptRunHistory) as exc:
                # replaying again would diverge again: no retry can help
                raise _Failure(encode_error(exc), retryable=False) from None
            except Throttled as exc:
                raise _Pushback(exc) from None
            except (Exception, SystemExit) as exc:  # sys.exit() in a task must not stop the worker
                raise _Failure(encode_error(exc), retryable=_retryable(task, exc)) from None
            try:
                payload = task.codec.encode_result(value)
            except (msgspec.EncodeError, TypeError, ValueError) as exc:  # ValueError: bad UTF-8
                raise _Failure(
                    encode_error(exc, type_name="ResultNotSerializable"), retryable=False
                ) from None
        else:
            payload = await self._offload(task, job, timeout, (args, kwargs))
        payloads = self.registry.payloads
        if payloads is not None and payloads.by_reference(payload):
            payload = await self._offload_result(job, payload)
        if len(payload) > self.max_result:
            raise _Failure(
                encode_error(
                    PayloadTooLarge(
                        f"the result is {len(payload)} bytes, over the {self.max_result}-byte limit"
                    )
                ),
                retryable=False,
            )
        return payload

    async def _call_async(
        self,
        task: TaskDefinition[Any, Any],
        job: FetchedJob,
        args: list[Any],
        kwargs: dict[str, Any],
    ) -> Any:
        if task.workflow is not None:
            return await run_slice(
                task,
                job,
                store=self.stores.store_for_job(job.id),
                worker=self.worker_id,
                process_pool=self.process_pool,
                durability=self.registry.durability,
                hooks=self.hooks,
            )
        return await task.fn(*args, **kwargs)

    async def _offload(
        self,
        task: TaskDefinition[Any, Any],
        job: FetchedJob,
        timeout: float | None,
        call: tuple[list[Any], dict[str, Any]],
    ) -> bytes:
        target = target_of(task.fn)
        try:
            if task.options.executor == "thread":
                # a thread calls the function itself: no import by path, so a task
                # defined anywhere (even inside a function) runs
                return await self.threads.run(_direct(task, *call), target, b"", timeout)
            if self.processes is None:
                raise RuntimeError("this worker has no process pool")
            return await self.processes.run(target, job.args.encode(), timeout)
        except ExecutionTimeout:
            raise _timed_out(timeout) from None
        except ChildCrashed as exc:
            raise _Failure(encode_error(exc, type_name="ChildCrashed"), retryable=True) from None
        except RemoteError as exc:
            raise _Failure(
                encode_error(exc, type_name=exc.type_name, tb=exc.traceback),
                retryable=_remote_retryable(task, exc.type_name),
            ) from None
        except ExecutorError:
            raise
        except Throttled as exc:  # a thread task's pushback (a process's arrives as a failure)
            raise _Pushback(exc) from None
        except _Unserializable as exc:
            raise _Failure(
                encode_error(exc.error, type_name="ResultNotSerializable"), retryable=False
            ) from None
        except (Exception, SystemExit) as exc:  # a thread task's own exception, unchanged
            raise _Failure(encode_error(exc), retryable=_retryable(task, exc)) from None

    async def _resolve_args(self, job: FetchedJob) -> bytes:
        payloads = self.registry.payloads
        try:
            if payloads is None:
                raise PayloadMissing(
                    "the arguments are kept in a payload store, and this worker has none "
                    "(payloads.url, or App(payloads=...))"
                )
            return await payloads.resolve(job.args)
        except MalformedReference as exc:
            error = encode_error(exc, type_name="MalformedArguments")
            raise _Failure(error, retryable=False) from None
        except Exception as exc:  # any store's failure fails the attempt, not the worker
            # perhaps passing (a store briefly unreachable): retried, then dead-lettered
            error = encode_error(
                PayloadMissing(f"the job's arguments cannot be read: {exc}"),
                type_name="PayloadUnavailable",
            )
            raise _Failure(error, retryable=True) from None

    async def _offload_result(self, job: FetchedJob, payload: bytes) -> bytes:
        payloads = self.registry.payloads
        assert payloads is not None
        try:
            store = self.stores.store_for_job(job.id)
            return await payloads.offload_result(store, job.id, payload, job.parent)
        except PayloadTooLarge as exc:
            raise _Failure(encode_error(exc), retryable=False) from None
        except Exception as exc:  # the store or the index failed: perhaps passing
            error = encode_error(exc, type_name="PayloadUnavailable")
            raise _Failure(error, retryable=True) from None

    def _decode(self, task: TaskDefinition[Any, Any], job: FetchedJob) -> Call:
        try:
            return task.codec.call(job.args)
        except Unbound as exc:
            # a producer on another version of the task: another worker may take them
            advice = (
                "a task can run without arguments it does not take: @app.task(..., "
                'unknown_kwargs="drop")'
                if "unknown field" in str(exc)
                else ""
            )
            raise _HandBack(
                "MalformedArguments",
                f"the stored arguments do not fit task {task.name!r} as this worker has it: {exc}",
                advice,
            ) from None
        except msgspec.DecodeError as exc:  # not even JSON: no worker can read them
            raise _Failure(
                encode_error(
                    ValueError(f"stored arguments do not fit the task's signature: {exc}"),
                    type_name="MalformedArguments",
                ),
                retryable=False,
            ) from None

    def _hand_back(self, job: FetchedJob, back: _HandBack) -> tuple[str, str, int]:
        """The outcome that hands ``job`` back: the store reads the window, the error
        it keeps meanwhile and the one it dead-letters with once the window is over."""
        settings = self.registry.settings.worker
        window = settings.deploy_window
        now = LookupError(f"{back.reason}; handed back for another worker (worker.deploy_window)")
        final = LookupError(
            f"no worker ran the job within the deploy window ({window:g}s, "
            f"worker.deploy_window): {back.reason}" + (f"; {back.advice}" if back.advice else "")
        )
        self._tell(job.task, back.type_name, _handback_notice(job.task, window, back.reason))
        text = handback_payload(
            round(window * 1000),
            encode_error(now, type_name=back.type_name, tb="").decode(),
            encode_error(final, type_name=back.type_name, tb="").decode(),
        )
        return OutcomeKind.HANDBACK, text, round(settings.handback_delay * 1000)

    def _tell(self, task: str, cause: str, text: str) -> None:
        """Log ``text`` the first time ``task`` meets ``cause`` on this worker."""
        if (task, cause) not in self._told:
            self._told.add((task, cause))
            log.warning("%s", text)

    def timed_out(self, job: FetchedJob) -> Outcome:
        """The outcome of an attempt the worker stopped at its timeout."""
        return self._failed(job, _timed_out(job.timeout or None))

    def expired(self, job: FetchedJob) -> Outcome:
        """The outcome of an attempt the worker stopped at its job's deadline."""
        return Outcome(job.id, job.token, OutcomeKind.EXPIRE, _EXPIRED)

    def uses_timer(self, job: FetchedJob) -> bool:
        """Whether the worker must time this attempt's timeout (executors time their own
        calls; a deadline the worker times whatever the executor)."""
        task = self.registry.tasks.get(job.task)
        return bool(job.timeout) and task is not None and task.options.executor == "async"

    def _failed(self, job: FetchedJob, failure: _Failure) -> Outcome:
        return Outcome(job.id, job.token, *self._after_failure(job, failure))

    def _after_failure(self, job: FetchedJob, failure: _Failure) -> tuple[str, str, int]:
        """A failed attempt's outcome: its kind (retry or dead), error and retry delay."""
        decision = after_failure(
            job.attempt,
            job.max_attempts,
            retryable=failure.retryable,
            backoff=_backoff(job.backoff),
            u=random.random(),
        )
        if decision.kind == "dead":
            return OutcomeKind.DEAD, failure.payload.decode(), 0
        return OutcomeKind.RETRY, failure.payload.decode(), round(decision.delay * 1000)


class _Unserializable(Exception):
    """A thread task's result could not be encoded (not the task's own failure)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _direct(
    task: TaskDefinition[Any, Any], args: list[Any], kwargs: dict[str, Any]
) -> Callable[[str, bytes], bytes]:
    def invoke(_target: str, _payload: bytes) -> bytes:
        value = task.fn(*args, **kwargs)
        try:
            return task.codec.encode_result(value)
        except (msgspec.EncodeError, TypeError, ValueError) as exc:
            raise _Unserializable(exc) from exc

    return invoke


def _unknown(name: str, app: str) -> _HandBack:
    reason = f"no task named {name!r} in this worker (app {app!r})"
    advice = ""
    if name.startswith("__main__."):
        # a producer run as a script named it after __main__ (an older Fairlane did)
        advice = (
            "a task declared in a script run as __main__ needs an explicit name that the "
            'worker\'s import gives it too: @app.task(name="<module>.<function>")'
        )
    return _HandBack("UnknownTask", reason, advice)


def _dropped_text(task: str, dropped: tuple[str, ...]) -> str:
    return (
        f"task {task!r} ran without stored arguments its function does not take "
        f"(unknown_kwargs='drop'): {', '.join(dropped)}"
    )


def _backoff(text: str) -> Backoff:
    try:
        return Backoff.decode(text)
    except ValueError:
        return Backoff()


def _retryable(task: TaskDefinition[Any, Any], exc: BaseException) -> bool:
    return isinstance(exc, task.options.retry_on)


def _remote_retryable(task: TaskDefinition[Any, Any], type_name: str) -> bool:
    short = type_name.rsplit(".", 1)[-1]
    return any(
        cls.__name__ == short or cls in (Exception, BaseException) for cls in task.options.retry_on
    )


def _timed_out(timeout: float | None) -> _Failure:
    error = TimeoutError(f"the attempt exceeded its timeout of {timeout}s")
    return _Failure(encode_error(error, type_name="TimeoutError"), retryable=True)


#: the error of a job expired at its deadline while running (the store's own, when it
#: expires a job before it runs, says so)
_EXPIRED = encode_error(
    TimeoutError("the deadline passed while the job was running; the attempt was stopped"),
    type_name="DeadlineExceeded",
    tb="",
).decode()


def _handback_notice(task: str, window: float, reason: str) -> str:
    """What the worker logs the first time it meets a job it cannot run: with no deploy
    window the store dead-letters the job at once, and the log must not say otherwise."""
    if window <= 0:
        return (
            f"dead-lettering jobs of task {task!r} that this worker cannot run "
            f"(worker.deploy_window is 0): {reason}"
        )
    return (
        f"handing back jobs of task {task!r} for another worker, for up to "
        f"{window:g}s each: {reason}"
    )
