"""A worker's plug-ins called as one (fairlane.runtime.hooks.Hooks).

Each point reaches every plug-in that overrides it, in the order they were given; a
point no plug-in overrides is skipped outright; the scopes several plug-ins opened for
one attempt are ended in reverse order, each with the attempt's outcome; the context
managers of ``step`` and ``sending`` nest, and each sees an exception raised inside.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

import pytest

from fairlane.runtime.hooks import Hooks, WorkerHooks
from fairlane.runtime.steps import StepInfo
from fairlane.store.wire import FetchedJob, NewJob, Outcome

JOB = FetchedJob("j1", "tok", 1, "task", "[]", 0.0, 0, "t", 3, "", 0)
OUTCOME = Outcome("j1", "tok", "ok", "null")


class Recorder(WorkerHooks):
    """Writes each point it hears, with its own name, to a shared log."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def started(self, jobs: Sequence[FetchedJob]) -> None:
        self.log.append(f"{self.name} started {len(jobs)}")

    def attempt(self, job: FetchedJob) -> Scope:
        self.log.append(f"{self.name} attempt {job.id}")
        return Scope(self.name, self.log)

    def step(self, info: StepInfo) -> AbstractContextManager[object]:
        return self._around(f"step {info.name}")

    def sending(self, lane: str, jobs: Sequence[NewJob]) -> AbstractContextManager[object]:
        return self._around(f"send {lane}")

    def settled(self, outcomes: Sequence[Outcome], codes: Sequence[int]) -> None:
        self.log.append(f"{self.name} settled {list(codes)}")

    @contextmanager
    def _around(self, what: str) -> Iterator[None]:
        self.log.append(f"{self.name} enter {what}")
        try:
            yield
        except ValueError as exc:
            self.log.append(f"{self.name} saw {exc}")
            raise
        finally:
            self.log.append(f"{self.name} exit {what}")


class Scope:
    def __init__(self, name: str, log: list[str]) -> None:
        self.name = name
        self.log = log

    def end(self, outcome: Outcome | None) -> None:
        self.log.append(f"{self.name} end {outcome.kind if outcome else None}")


class OnlyLost(WorkerHooks):
    def __init__(self) -> None:
        self.lost_count = 0

    def lost(self, n: int) -> None:
        self.lost_count += n


def test_each_point_reaches_the_plug_ins_that_override_it_in_order() -> None:
    log: list[str] = []
    quiet = OnlyLost()
    hooks = Hooks([Recorder("a", log), quiet, Recorder("b", log)])
    hooks.started([JOB, JOB])
    hooks.settled([OUTCOME], [1])
    hooks.lost(2)
    hooks.finished(JOB, OUTCOME, 0.1)  # nobody listens: nothing happens
    assert log == ["a started 2", "b started 2", "a settled [1]", "b settled [1]"]
    assert quiet.lost_count == 2


def test_a_point_nobody_overrides_is_skipped() -> None:
    hooks = Hooks([OnlyLost()])
    assert hooks.attempt(JOB) is None
    assert not hooks._started and not hooks._attempt and not hooks._step
    with hooks.step(StepInfo("r", "s", 1)), hooks.sending("lane", []):
        pass


def test_the_scopes_of_one_attempt_end_in_reverse_order() -> None:
    log: list[str] = []
    one = Hooks([Recorder("a", log)]).attempt(JOB)
    assert isinstance(one, Scope)  # a single scope is handed back as it is
    both = Hooks([Recorder("a", log), Recorder("b", log)]).attempt(JOB)
    assert both is not None
    both.end(OUTCOME)
    assert log[1:] == ["a attempt j1", "b attempt j1", "b end ok", "a end ok"]


def test_step_and_sending_nest_and_each_sees_the_exception() -> None:
    log: list[str] = []
    hooks = Hooks([Recorder("a", log), Recorder("b", log)])
    with pytest.raises(ValueError, match="boom"), hooks.step(StepInfo("r", "charge", 1)):
        raise ValueError("boom")
    assert log == [
        "a enter step charge",
        "b enter step charge",
        "b saw boom",
        "b exit step charge",
        "a saw boom",
        "a exit step charge",
    ]
    log.clear()
    with hooks.sending("light", []):
        log.append("inside")
    assert log == [
        "a enter send light",
        "b enter send light",
        "inside",
        "b exit send light",
        "a exit send light",
    ]
