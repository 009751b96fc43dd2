"""The registry floor: what an app declared, and how its jobs are made.

Below the runtime and above the store: the worker reads a ``Registry`` (which tasks
exist, their functions, options and codecs, workflows' shapes, cron entries, lanes'
class tables, pricing), and every enqueue path makes its jobs with a task's
``TaskDefinition`` (``encode_args``, ``new_job``). Nothing here connects to a server.

- ``options``: ``TaskOptions``, ``WorkflowOptions``, the defaults and reserved names;
- ``naming``: the name of a task declared without one (``__main__`` warned about);
- ``pricing``: ``Pricing`` of declared estimates, ``cost_key``;
- ``jobs``: job ids, ``Placement``, ``Demand``, the ``JobFactory`` a task makes jobs with;
- ``definitions``: ``TaskDefinition`` and ``CronEntry``;
- ``declared``: ``Registry``, which checks and holds the declarations and records them
  on the server.
"""

from fairlane.registry.declared import UNSET, Registry
from fairlane.registry.definitions import CronEntry, TaskDefinition
from fairlane.registry.jobs import PRIORITY_LIMIT, JobFactory, Placement, Seconds, new_job_id
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
