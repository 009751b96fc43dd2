"""The gateway's request and response bodies, as they appear in its OpenAPI spec."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CancelReply",
    "ErrorBody",
    "JobView",
    "ResultReply",
    "SignalReply",
    "SignalRequest",
    "StartEstimateView",
    "SubmitReply",
    "SubmitRequest",
    "TaskError",
]

MAX_DEADLINE_SECONDS = 366 * 24 * 3600.0
MAX_ESTIMATE_UNITS = 1e9


class SubmitRequest(BaseModel):
    """One call of an exposed task. The tenant is the API key's, never the body's."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(
        min_length=1, max_length=200, description="The name of a task the gateway exposes."
    )
    args: list[Any] = Field(default_factory=list, description="Positional arguments (JSON).")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments (JSON).")
    service_class: str | None = Field(default=None, min_length=1, max_length=100)
    estimate: float | None = Field(
        default=None,
        ge=0,
        le=MAX_ESTIMATE_UNITS,
        allow_inf_nan=False,
        description="Declared work units (admission-controlled lanes).",
    )
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=200)
    deadline_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_DEADLINE_SECONDS,
        allow_inf_nan=False,
        description="Past this many seconds from now the job expires instead of running.",
    )
    priority: int = Field(default=0, ge=-1000, le=1000)
    fairness_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The end user of the tenant the job is for: the tenant's keys share its "
        "part fairly (printable characters).",
    )
    on_unmeetable: Literal["reject", "accept"] = Field(
        default="reject",
        description="With a deadline the job is not expected to meet (its estimated start "
        "and learned length): `reject` refuses it (429 `deadline_unmeetable`), `accept` "
        "stores it anyway.",
    )
    estimate_start: bool = Field(
        default=False,
        description="Estimate when the job is expected to start (one more read) even "
        "without a deadline; a deadline always takes the estimate.",
    )


_ESTIMATED_START = (
    "When the job is expected to start (ISO 8601, UTC): an estimate, not a promise. "
    "Null where nothing can be said (no live worker, nothing learned yet) or where it "
    "was not estimated."
)


class SubmitReply(BaseModel):
    id: str
    state: Literal["accepted", "deferred"]
    created: bool = Field(description="False when the idempotency key named an existing job.")
    status_url: str
    estimated_start: str | None = Field(
        default=None,
        description=_ESTIMATED_START + " Estimated for a submission with a deadline or "
        "`estimate_start`; null for any other.",
    )


class ErrorBody(BaseModel):
    """Every error answer: a message, and for refusals a reason and when to retry."""

    detail: str
    reason: str | None = None
    retry_after_seconds: float | None = None
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="Field errors of a request that does not validate."
    )
    estimated_start: str | None = Field(
        default=None,
        description="`deadline_unmeetable`: when the job was expected to start (ISO 8601, "
        "UTC; null where nothing could be said).",
    )


class StartEstimateView(BaseModel):
    """What a waiting job's start estimate rests on (``fairlane.policy.startpredict``);
    each figure null where nothing can be said, and ``why_none`` says why."""

    wait_seconds: float | None = Field(description="Seconds from now to the expected start.")
    work_ahead_slot_seconds: float | None = Field(
        description="Slot-seconds its class serves before it, in the fair order."
    )
    slots: float | None = Field(description="The slots its class gets of the lane.")
    share: float | None = Field(
        description="Its tenant's share of its class's starts (weight over the waiting "
        "tenants' weights)."
    )
    jobs_ahead: int | None = Field(description="Jobs of its own tenant ahead of it.")
    tenants: int | None = Field(description="Tenants waiting in its class.")
    expected_run_seconds: float | None = Field(
        description="How long it is expected to run, learned from its task's attempts."
    )
    why_none: str | None = Field(description="Why no start can be estimated, if none can.")


class JobView(BaseModel):
    id: str
    status: str
    task: str
    tenant: str
    attempts: int
    max_attempts: int
    enqueued_at: str | None
    finished_at: str | None
    error: str | None
    service_class: str
    slots: int
    limits: dict[str, int]
    reserved_units: float | None
    charged_units: float | None
    actual_units: float | None
    fairness_key: str | None = None
    not_before: str | None = Field(
        default=None,
        description="The earliest its current or next attempt may start (ISO time): when it "
        "was enqueued, or the end of its delay or of the backoff before a retry.",
    )
    deadline: str | None = Field(
        default=None, description="Past this time (ISO) it expires instead of running."
    )
    idempotency_key: str | None = Field(
        default=None, description="The key it was submitted with, which names it to a retry."
    )
    estimated_start: str | None = Field(
        default=None,
        description=_ESTIMATED_START + " Null too once it has started or ended.",
    )
    start_estimate: StartEstimateView | None = Field(
        default=None,
        description="What the estimate rests on, for a job that has not started; null "
        "once it has started or ended.",
    )


class TaskError(BaseModel):
    type: str
    message: str


class ResultReply(BaseModel):
    """``result`` when completed; ``error`` when failed, cancelled or expired; neither
    when the job had not finished within the wait (answered with 202)."""

    id: str
    status: str
    result: Any = None
    error: TaskError | None = None


class CancelReply(BaseModel):
    id: str
    status: str = Field(description="cancelled, cancelling (it was running), or its final status.")


class SignalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    payload: Any = None
    signal_id: str | None = Field(default=None, min_length=1, max_length=200)


class SignalReply(BaseModel):
    result: Literal["delivered", "duplicate", "finished"]
