"""The store's read models: what the faces read, every key and field kept in the store.

Each read model is a *plan* (``fairlane.store.reads``) over the keys of every shard of
an app, run by ``Store.view`` / ``Store.read`` on the asyncio client or by
``run_sync`` on a synchronous one, so that the dashboard, the metrics collector,
``inspect load``, ``explain``, ``runs show`` and the demo share one parser and one
merge over shards:

- ``lanes``: a lane's state hash parsed once, merged over the shards;
- ``totals``: the lanes with the stats counters, the admission decisions and the
  throttle waiters (the metrics' read);
- ``waits``: the oldest waiting job of each class, and recent start delays;
- ``fleet``: jobs running and dead, live workers, tenants' weights and running slots;
- ``tenants``: a lane's active tenants, their queues and rejections;
- ``throttles``: throttle keys with their limits, use and waiters;
- ``rates``: rate keys with their rate in force, tokens now, pause, adaptive value,
  counters, waiters and due time; a job's rate keys (for ``explain``);
- ``jobs``: job ids found through the indexes of each state, and their records;
- ``starts``: a class's starts by the second, retries counted apart (for ``explain``).

Job records and events themselves are decoded by ``fairlane.store.records``.
"""
