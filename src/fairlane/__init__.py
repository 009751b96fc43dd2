"""Fairlane: a fair, bounded, durable task queue for multi-tenant AI platforms.

from fairlane import App, Backoff, Retention

app = App("agents")

@app.task(lane="light", attempts=5, backoff=Backoff(base=2.0, cap=120.0))
async def classify(text: str) -> str: ...
"""

from fairlane.app import App
from fairlane.errors import (
    FairlaneError,
    JobCancelled,
    JobExpired,
    JobNotFound,
    TaskFailed,
    UnknownTask,
)
from fairlane.policy.backoff import Backoff
from fairlane.policy.retention import Retention
from fairlane.store.redis import StoreUnavailable
from fairlane.task import Job, Task

__all__ = [
    "App",
    "Backoff",
    "FairlaneError",
    "Job",
    "JobCancelled",
    "JobExpired",
    "JobNotFound",
    "Retention",
    "StoreUnavailable",
    "Task",
    "TaskFailed",
    "UnknownTask",
]
