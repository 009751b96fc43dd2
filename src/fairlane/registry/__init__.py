"""The registry floor: what an app declared, and how its jobs are made.

Below the runtime and above the store: the worker reads a ``Registry`` (which tasks
exist, their functions, options and codecs, workflows' shapes, cron entries, lanes'
class tables, pricing), and every enqueue path makes its jobs with a task's
``TaskDefinition`` (``encode_args``, ``new_job``). Nothing here connects to a server.

- ``options``: ``TaskOptions``, ``WorkflowOptions``, the defaults and reserved names;
- ``naming``: the name of a task declared without one (``__main__`` warned about);
- ``pricing``: ``Pricing`` of declared estimates, ``cost_key``;
- ``calls``: ``CallOptions``, one enqueue call's options, and the checks of what a call
  names (``Placement``: where and when its jobs go);
- ``jobs``: job ids, ``Demand``, the ``JobFactory`` a task makes jobs with (``plan``
  checks a call's options once);
- ``definitions``: ``TaskDefinition`` and ``CronEntry``;
- ``declared``: ``Registry``, which checks and holds the declarations and records them
  on the server.
"""

from fairlane.registry.calls import PRIORITY_LIMIT, CallOptions, Placement, Seconds
from fairlane.registry.declared import UNSET, Registry
from fairlane.registry.definitions import CronEntry, TaskDefinition
from fairlane.registry.jobs import JobFactory, new_job_id
from fairlane.registry.options import (
    RESERVED_PARAMETERS,
    TASK_DEFAULTS,
    Executor,
    TaskOptions,
    UnknownKwargs,
    WorkflowOptions,
)
from fairlane.registry.pricing import Pricing, cost_key

__all__ = [
    "PRIORITY_LIMIT",
    "RESERVED_PARAMETERS",
    "TASK_DEFAULTS",
    "UNSET",
    "CallOptions",
    "CronEntry",
    "Executor",
    "JobFactory",
    "Placement",
    "Pricing",
    "Registry",
    "Seconds",
    "TaskDefinition",
    "TaskOptions",
    "UnknownKwargs",
    "WorkflowOptions",
    "cost_key",
    "new_job_id",
]
