"""What a worker tells the observers plugged into it: ``WorkerHooks``.

Tracing and metrics are cross-cutting: the worker does not import them, it calls its
hooks at fixed points of its life and of each job's, and whoever builds the worker
plugs in what should listen (``fairlane.app.worker`` plugs in ``fairlane.tracing``'s
spans and ``fairlane.metrics``' recorder). Every hook does nothing unless a subclass
overrides it; ``Hooks`` calls a list of them as one, and skips, once and for all, the
methods none of them overrides, so that an empty hook costs nothing on the hot path.

The points, in the order a job meets them:

- ``serving``: the worker begins to serve; a plug-in opens what it needs (closed by the
  stack after the worker's loops have ended) and returns loops to run beside them;
- ``started``: jobs were leased and are about to run;
- ``attempt``: in the attempt's own task, just before it runs; what it returns is
  ended with the attempt's outcome (a span current while the attempt runs);
- ``step`` and ``sending``: a workflow step that runs, and a run starting its children
  (context managers around them);
- ``used``: an attempt that ran to an outcome, with the usage it reported through
  ``fairlane.context()`` and the work units it was priced at;
- ``finished``: an attempt ended (its outcome None when its lease was lost);
- ``settled``: outcomes the server settled, with the codes it answered;
- ``lost``: running attempts stopped because their leases were lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Sequence
from contextlib import AbstractContextManager, AsyncExitStack, ExitStack, nullcontext
from typing import Any, Protocol

from fairlane.runtime.balancer import KeyBalancer
from fairlane.runtime.pressure import PressureGauge
from fairlane.runtime.steps import StepInfo
from fairlane.runtime.usage import JobContext
from fairlane.store.wire import FetchedJob, NewJob, Outcome

__all__ = ["AttemptScope", "Hooks", "WorkerHooks", "WorkerView"]

_OFF: AbstractContextManager[None] = nullcontext()


class AttemptScope(Protocol):
    """What a hook opened for one attempt, ended with the attempt's outcome."""

    def end(self, outcome: Outcome | None) -> None: ...


class WorkerView(Protocol):
    """What a plug-in may read of the worker it serves."""

    @property
    def id(self) -> str: ...

    @property
    def lanes(self) -> list[str]: ...

    @property
    def concurrency(self) -> int: ...

    @property
    def pressure(self) -> PressureGauge | None: ...

    @property
    def closed(self) -> asyncio.Event: ...

    @property
    def balancer(self) -> KeyBalancer | None:
        """The global-key balancer of a worker of an app of many shards."""
        ...

    def running_jobs(self) -> list[FetchedJob]: ...


class WorkerHooks:
    """A plug-in of a worker: each method is one point of its life (module docstring)."""

    def serving(
        self, worker: WorkerView, stack: AsyncExitStack
    ) -> Iterable[Coroutine[Any, Any, None]]:
        return ()

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        return None

    def attempt(self, job: FetchedJob) -> AttemptScope | None:
        return None

    def step(self, info: StepInfo) -> AbstractContextManager[object]:
        return _OFF

    def sending(self, lane: str, jobs: Sequence[NewJob]) -> AbstractContextManager[object]:
        return _OFF

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        return None

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        return None

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        return None

    def lost(self, n: int) -> None:
        return None


def _overriding(hooks: Sequence[WorkerHooks], name: str) -> list[Any]:
    """The bound ``name`` methods of the hooks that override the do-nothing one."""
    base = getattr(WorkerHooks, name)
    return [getattr(h, name) for h in hooks if getattr(type(h), name) is not base]


class _Scopes:
    """Several hooks' scopes of one attempt, ended in reverse order."""

    __slots__ = ("_scopes",)

    def __init__(self, scopes: list[AttemptScope]) -> None:
        self._scopes = scopes

    def end(self, outcome: Outcome | None) -> None:
        for scope in reversed(self._scopes):
            scope.end(outcome)


class Hooks(WorkerHooks):
    """Several plug-ins called as one, each point only on those that listen to it."""

    def __init__(self, hooks: Iterable[WorkerHooks] = ()) -> None:
        self.hooks = list(hooks)
        self._serving = _overriding(self.hooks, "serving")
        self._started = _overriding(self.hooks, "started")
        self._attempt = _overriding(self.hooks, "attempt")
        self._step = _overriding(self.hooks, "step")
        self._sending = _overriding(self.hooks, "sending")
        self._used = _overriding(self.hooks, "used")
        self._finished = _overriding(self.hooks, "finished")
        self._settled = _overriding(self.hooks, "settled")
        self._lost = _overriding(self.hooks, "lost")
        if len(self._attempt) == 1:
            # the point runs once per job, and a worker usually has one plug-in on it
            # (tracing): its own bound method, without a call through this one
            self.attempt = self._attempt[0]  # type: ignore[method-assign]

    def serving(self, worker: WorkerView, stack: AsyncExitStack) -> list[Coroutine[Any, Any, None]]:
        return [loop for serving in self._serving for loop in serving(worker, stack)]

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        for started in self._started:
            started(jobs)

    def attempt(self, job: FetchedJob) -> AttemptScope | None:
        scopes = [s for s in (attempt(job) for attempt in self._attempt) if s is not None]
        if not scopes:
            return None
        return scopes[0] if len(scopes) == 1 else _Scopes(scopes)

    def step(self, info: StepInfo) -> AbstractContextManager[object]:
        return _nested(step(info) for step in self._step) if self._step else _OFF

    def sending(self, lane: str, jobs: Sequence[NewJob]) -> AbstractContextManager[object]:
        if not self._sending:
            return _OFF
        return _nested(sending(lane, jobs) for sending in self._sending)

    def used(self, job: FetchedJob, usage: JobContext, units: float) -> None:
        for used in self._used:
            used(job, usage, units)

    def finished(self, job: FetchedJob, outcome: Outcome | None, seconds: float) -> None:
        for finished in self._finished:
            finished(job, outcome, seconds)

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        for settled in self._settled:
            settled(outcomes, codes)

    def lost(self, n: int) -> None:
        for lost in self._lost:
            lost(n)


def _nested(managers: Iterable[AbstractContextManager[object]]) -> ExitStack:
    stack = ExitStack()
    try:
        for manager in managers:
            stack.enter_context(manager)
    except BaseException:
        stack.close()
        raise
    return stack
