"""The exceptions and warnings users see, each with a clear message."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

__all__ = [
    "FairlaneError",
    "FairlaneWarning",
    "JobCancelled",
    "JobExpired",
    "JobNotFound",
    "StoreFull",
    "StoreLayoutError",
    "TaskFailed",
    "TaskNameWarning",
    "Throttled",
    "UnknownTask",
]

#: The longest pause an upstream's Retry-After may ask for (a day); longer is cut to it.
MAX_RETRY_AFTER = 86400.0


class FairlaneError(Exception):
    """Base of Fairlane's own errors."""


class FairlaneWarning(UserWarning):
    """Base of Fairlane's own warnings: something works now that will surprise later."""


class TaskNameWarning(FairlaneWarning):
    """A task's name was derived from ``__main__``, a module no worker imports by that name.

    The message names the task as it was registered and the ``name=`` that fixes it.
    """


class StoreLayoutError(FairlaneError):
    """The server holds this app's data in a store layout this library does not read.

    An earlier (or later) Fairlane wrote it, and reading it would misread its job
    records. ``prefix`` is the app's (or shard's) key prefix, ``found`` the layout found
    there, ``reads`` the one this library reads, ``version`` this library's version.
    """

    def __init__(self, prefix: str, found: int, reads: int, version: str):
        self.prefix, self.found, self.reads = prefix, found, reads
        who = "an earlier" if found < reads else "a later"
        super().__init__(
            f"the keys under {prefix!r} hold data written by {who} Fairlane (store layout "
            f"{found}); Fairlane {version} reads store layout {reads} only and would "
            "misread it. Finish its jobs with the release that wrote them, then delete "
            f"the keys under {prefix!r} (fairlane purge); or use another app name."
        )


class UnknownTask(FairlaneError, LookupError):
    """No task of that name is registered with the app."""


class JobNotFound(FairlaneError, LookupError):
    """No record of the job exists (never enqueued, or removed by retention)."""


class StoreFull(FairlaneError):
    """The store is full: the server is at its memory limit (``maxmemory`` with the
    ``noeviction`` policy) and refused a write, or above the app's memory mark
    (``queues.memory_high_water``) where new jobs are refused. Nothing was written.
    Retry after ``retry_after`` seconds, once workers have drained the store (or give
    the server more memory); ``depth`` is how far the server was from the mark to the
    limit (0 at the mark, 1 at the limit), which that wait grows with."""

    def __init__(self, message: str, retry_after: float, depth: float = 1.0) -> None:
        super().__init__(f"{message}; retry after {retry_after:.1f} s")
        self.retry_after = retry_after
        self.depth = depth


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


class Throttled(FairlaneError):
    """Raised by a task when the upstream behind one of its keys pushed back (a 429).

    The key (a rate key or a concurrency key the job holds) is paused for every job on it
    until ``retry_after`` has passed on the server's clock; this job goes back to its
    tenant's queue due at the pause's end, without spending an attempt (up to a bound,
    after which a pushback counts as a failed attempt). ``retry_after`` is seconds (a
    number, or the digits of a ``Retry-After`` header) or an HTTP-date as the header may
    give it.
    """

    def __init__(
        self, key: str, retry_after: float | str | datetime = 0.0, message: str = ""
    ) -> None:
        if not isinstance(key, str) or not key or "\n" in key or "\0" in key:
            raise ValueError(f"Throttled needs the key that pushed back, got {key!r}")
        self.key = key
        self.retry_after = _seconds_after(retry_after)
        default = f"{key}: the upstream pushed back; retry in {self.retry_after:g}s"
        super().__init__(message or default)


def _seconds_after(value: float | str | datetime) -> float:
    """Seconds from now that a Retry-After asks for, within [0, MAX_RETRY_AFTER]."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = float(text)
        except ValueError:
            try:
                value = parsedate_to_datetime(text)
            except (TypeError, ValueError):
                raise ValueError(
                    f"retry_after must be seconds or an HTTP-date, got {text!r}"
                ) from None
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        value = moment.timestamp() - time.time()
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"retry_after must be seconds or an HTTP-date, got {value!r}")
    return min(MAX_RETRY_AFTER, max(0.0, float(value)))
