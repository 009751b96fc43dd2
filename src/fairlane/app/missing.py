"""Why a job has no record: the ``JobNotFound`` a handle raises, saying what retention did.

A record retention removed recently is noted by the store (``fairlane.store.removals``):
the error then says when, by which bound of which setting, and how to keep more. Any
other missing record was never enqueued in this app, or was removed long ago.
"""

from __future__ import annotations

from datetime import UTC, datetime

from fairlane.errors import JobNotFound
from fairlane.policy.retention import Retention
from fairlane.store.api import Store

__all__ = ["job_not_found"]


async def job_not_found(store: Store, job_id: str, retention: Retention | None) -> JobNotFound:
    """The error for ``job_id``'s missing record (``retention``: its task's, when known)."""
    removal = await store.removal(job_id)
    if removal is None:
        return JobNotFound(
            f"no record of job {job_id}: it was never enqueued in this app, or retention "
            "removed it long ago"
        )
    when = datetime.fromtimestamp(removal.ms / 1000, UTC).isoformat(timespec="milliseconds")
    keep = None if retention is None else getattr(retention, removal.outcome)
    setting = f"{removal.outcome}={keep.describe()}" if keep is not None else removal.outcome
    return JobNotFound(
        f"no record of job {job_id}: retention removed its {removal.outcome} record at "
        f"{when} by the {removal.bound} bound of its task's Retention({setting}); keep more "
        f"with @app.task(retention=Retention({removal.outcome}=(count, age)))"
    )
