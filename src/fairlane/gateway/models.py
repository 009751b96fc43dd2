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


class SubmitReply(BaseModel):
    id: str
    state: Literal["accepted", "deferred"]
    created: bool = Field(description="False when the idempotency key named an existing job.")
    status_url: str


class ErrorBody(BaseModel):
    """Every error answer: a message, and for refusals a reason and when to retry."""

    detail: str
    reason: str | None = None
    retry_after_seconds: float | None = None
    errors: list[dict[str, Any]] | None = Field(
        default=None, description="Field errors of a request that does not validate."
    )


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
