"""A running job's context: which job it is, and the work it reports having used.

Inside a task, ``fairlane.context()`` is the attempt's :class:`JobContext`;
``ctx.report_usage(input_tokens=..., output_tokens=..., tool_calls=...,
tool_seconds=..., model_seconds=...)`` adds to what the attempt used (call it as often
as you like). The worker prices it with the app's coefficients when the attempt ends --
wall time is recorded on its own and counts as tool seconds when it is the larger -- and
the store learns from it what this tenant's jobs of this workflow and model really
cost, and charges the tenant's fair share for it. ``model_seconds`` (time spent waiting
for a model) is not priced (the tokens price model work): it is kept, with the raw
counts, for the worker's metrics (``fairlane.metrics.recorder``), which tell model time
from tool time. Both times go with the attempt's ack to the store, which keeps them with
the attempt (``fairlane explain`` tells how much of an attempt's run they were).
Thread-executor tasks see the context too; process-executor tasks do not (their usage is
priced from wall time alone, and they report no time).
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass

from fairlane.policy.admission import (
    MAX_TOKENS,
    MAX_TOOL_CALLS,
    MAX_TOOL_SECONDS,
    Coefficients,
    work_units,
)

__all__ = ["JobContext", "context", "report_usage", "reported_ms"]


@dataclass(slots=True)
class JobContext:
    """The attempt being run, and the usage it has reported so far."""

    id: str
    tenant: str
    attempt: int
    input_tokens: int = 0
    output_tokens: int = 0
    tool_calls: int = 0
    tool_seconds: float = 0.0
    model: str | None = None
    model_seconds: float = 0.0

    def report_usage(
        self,
        *,
        input_tokens: int = 0,
        output_tokens: int = 0,
        tool_calls: int = 0,
        tool_seconds: float = 0.0,
        model: str | None = None,
        model_seconds: float = 0.0,
    ) -> None:
        """Add to the work this attempt used (``model`` prices its tokens, if given;
        ``model_seconds``, the time spent waiting for the model, is recorded, not priced)."""
        for label, value, high in (
            ("input_tokens", input_tokens, MAX_TOKENS),
            ("output_tokens", output_tokens, MAX_TOKENS),
            ("tool_calls", tool_calls, MAX_TOOL_CALLS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
                raise ValueError(f"{label} must be an int within [0, {high}], got {value!r}")
        for label, seconds in (("tool_seconds", tool_seconds), ("model_seconds", model_seconds)):
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, int | float)
                or not (math.isfinite(seconds) and 0 <= seconds <= MAX_TOOL_SECONDS)
            ):
                raise ValueError(f"{label} must be within [0, {MAX_TOOL_SECONDS}]: {seconds!r}")
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"model must be a non-empty string or None, got {model!r}")
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.tool_calls += tool_calls
        self.tool_seconds += float(tool_seconds)
        self.model_seconds += float(model_seconds)
        self.model = model or self.model

    def units(self, coefficients: Coefficients, wall_seconds: float) -> float:
        """What the attempt cost in work units, wall time counting as tool seconds."""
        return work_units(
            coefficients,
            tokens=self.input_tokens + self.output_tokens,
            tool_calls=self.tool_calls,
            tool_seconds=max(self.tool_seconds, wall_seconds),
            model=self.model,
        )


def reported_ms(ctx: JobContext) -> tuple[int, int]:
    """The attempt's reported time in model calls and in tool calls, in ms, as its ack
    carries them to the store (``Outcome.model_ms``, ``tool_ms``): (-1, -1) when it
    reported neither, so that a job that reports nothing keeps nothing."""
    if ctx.model_seconds <= 0 and ctx.tool_seconds <= 0:
        return -1, -1
    return round(ctx.model_seconds * 1000), round(ctx.tool_seconds * 1000)


current: ContextVar[JobContext | None] = ContextVar("fairlane_job", default=None)


def context() -> JobContext:
    """The job being run by this task; a ``RuntimeError`` outside a task."""
    ctx = current.get()
    if ctx is None:
        raise RuntimeError("fairlane.context() is only available inside a running task")
    return ctx


def report_usage(
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
    tool_calls: int = 0,
    tool_seconds: float = 0.0,
    model: str | None = None,
    model_seconds: float = 0.0,
) -> None:
    """``context().report_usage(...)``: add to the running attempt's reported usage."""
    context().report_usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        tool_calls=tool_calls,
        tool_seconds=tool_seconds,
        model=model,
        model_seconds=model_seconds,
    )
