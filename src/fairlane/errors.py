"""The exceptions users see, each with a clear message."""

from __future__ import annotations

__all__ = [
    "FairlaneError",
    "JobCancelled",
    "JobExpired",
    "JobNotFound",
    "TaskFailed",
    "UnknownTask",
]


class FairlaneError(Exception):
    """Base of Fairlane's own errors."""


class UnknownTask(FairlaneError, LookupError):
    """No task of that name is registered with the app."""


class JobNotFound(FairlaneError, LookupError):
    """No record of the job exists (never enqueued, or removed by retention)."""


class TaskFailed(FairlaneError):
    """The job failed for good; carries the task's last error."""

    def __init__(self, job_id: str, type_name: str, message: str, traceback: str = "") -> None:
        super().__init__(f"job {job_id} failed: {type_name}: {message}")
        self.job_id = job_id
        self.type_name = type_name
        self.message = message
        self.traceback = traceback


class JobCancelled(TaskFailed):
    """The job was cancelled before it completed."""


class JobExpired(TaskFailed):
    """The job's deadline passed before it could complete."""
