"""The app floor: what users hold.

- ``application``: ``App``, which composes what the app declared (its ``Registry``),
  its shards' stores, the result listener and the admin operations;
- ``declaring``: the decorators (``@app.task``, ``@app.workflow``, ``@app.cron``,
  ``app.lane``) that record declarations in the registry;
- ``task``: ``Task``, a registered function, and its producer side (``enqueue``,
  ``submit``, ``enqueue_many``); ``job``: ``Job``, a handle on one enqueued job;
- ``workflows``: ``Workflow`` and signals; ``tenants``: ``app.tenants``;
- ``admission``: what a submission is told (``Admission``, ``Rejected``);
- ``results``: the listener that wakes producers waiting on results;
- ``admin``: dead letters, redrive, stats and purge over every shard;
- ``worker``: the worker an app runs, with tracing and metrics plugged in.
"""

from fairlane.app.application import App
from fairlane.app.declaring import TaskDecorator
from fairlane.registry import CronEntry

__all__ = ["App", "CronEntry", "TaskDecorator"]
