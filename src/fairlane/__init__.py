"""Fairlane: a fair, bounded, durable task queue for multi-tenant AI platforms.

from fairlane import App, Backoff, Retention, ServiceClass

app = App("agents")
app.lane("heavy", classes=[ServiceClass("interactive", nominal_share=0.7, min_slots=2),
                           ServiceClass("bulk", batch=True)])

@app.task(lane="light", attempts=5, backoff=Backoff(base=2.0, cap=120.0))
async def classify(text: str) -> str: ...
"""

from fairlane.app import App
from fairlane.app.admission import Admission, Rejected
from fairlane.app.job import Job
from fairlane.app.task import Task
from fairlane.app.workflows import RunNotFound, Workflow
from fairlane.config.lanes import load_lanes
from fairlane.config.pools import FairlaneConfig, load_config
from fairlane.errors import (
    FairlaneError,
    FairlaneWarning,
    JobCancelled,
    JobExpired,
    JobNotFound,
    StoreFull,
    TaskFailed,
    TaskNameWarning,
    Throttled,
    UnknownTask,
)
from fairlane.policy.admission import Coefficients, Estimate, EstimationSettings
from fairlane.policy.backoff import Backoff
from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.classes import DEFAULT_CLASSES, ClassTable, ServiceClass
from fairlane.policy.rates import Adaptive, Rate
from fairlane.policy.retention import Retention
from fairlane.registry import WorkflowOptions
from fairlane.runtime.context import (
    ChildFailed,
    Context,
    NonDeterminismError,
    StepInfo,
    current_step,
)
from fairlane.runtime.usage import JobContext, context, report_usage
from fairlane.store.gate import StoreBusy
from fairlane.store.wire import StoreError, StoreUnavailable

__all__ = [
    "DEFAULT_CLASSES",
    "Adaptive",
    "Admission",
    "App",
    "Backoff",
    "ChildFailed",
    "ClassTable",
    "Coefficients",
    "Context",
    "Estimate",
    "EstimationSettings",
    "FairlaneConfig",
    "FairlaneError",
    "FairlaneWarning",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobExpired",
    "JobNotFound",
    "NonDeterminismError",
    "Rate",
    "Rejected",
    "Retention",
    "RunNotFound",
    "ServiceClass",
    "StepInfo",
    "StoreBusy",
    "StoreError",
    "StoreFull",
    "StoreUnavailable",
    "Task",
    "TaskFailed",
    "TaskNameWarning",
    "TenantLimits",
    "Throttled",
    "UnknownTask",
    "Workflow",
    "WorkflowOptions",
    "context",
    "current_step",
    "load_config",
    "load_lanes",
    "report_usage",
]
