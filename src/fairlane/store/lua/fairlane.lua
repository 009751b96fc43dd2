#!lua name=__LIBRARY__
--[[
Fairlane's store: every state change of a job, each one atomic.

Keys. Every function receives the app's fixed keys first, in this order
(fairlane/store/keys.py, AppKeys.common), each indexed by the Lua constant named here:
  KEYS[1]  FENCE    fence     string  fencing-token counter
  KEYS[2]  LEASES   leases    zset    running job id -> lease expiry (server ms)
  KEYS[3]  STATS    stats     hash    counters; also the 'fifo' FIFO counter
  KEYS[4]  IDEM     idem      hash    idempotency key -> job id
  KEYS[5]  DEAD     dead      zset    dead-lettered job id -> time (ms)
  KEYS[6]  WORKERS  workers   zset    worker id -> last heartbeat (ms)
  KEYS[7]  TASKS    tasks     hash    task name -> 'rc|rf' retention of its records
  KEYS[8]  WEIGHTS  weights   hash    tenant -> fair-share weight (absent = 1)
  KEYS[9]  FLEET    fleet     hash    worker -> its slots and lanes ('slots|lane,lane')
  KEYS[10] TLIMITS  tlimits   hash    tenant -> concurrency 'floor,max,burst_floor,burst_pct'
  KEYS[11] THR      thr       hash    throttle keys, offers, parked jobs (throttle.lua)
  KEYS[12] THRW     thr:wait  zset    throttle waiters, a lex range per key and tenant
followed by the keys of the lanes the caller names (state, cap, delayed, wake, idle
per lane). Per-job hashes (job:<id>), per-tenant queues (q:<lane>:<class>:<tenant>),
per-class fair queues (lane:<l>:c:<class>:fair|vt), throttle tags (<thr>:s|f:<key>), tenant signals
(sig:<tenant>), retention indexes (kept:<task>:<outcome>) and lane keys are derived
from the prefix of KEYS[FENCE], so they always carry the same hash tag (same cluster slot).

Time is always the server's (TIME), never a client's.

Job status: queued, throttled, scheduled, running, completed, failed, cancelled,
expired. A job id is in exactly one of: a tenant queue (queued; one a throttle key
woke holds offers), a throttle waiter group (throttled), a lane's delayed set (scheduled), the
leases set (running), or none (finished).
--]]

-- @include core.lua
-- @include writeback.lua
-- @include classes.lua
-- @include rates.lua
-- @include keyparts.lua
-- @include throttle.lua
-- @include keyruns.lua
-- @include pausetable.lua

-- @include deadlineorder.lua
-- @include fairqueue.lua
-- @include fairkeys.lua
-- @include pauses.lua
-- @include estimate.lua
-- @include bounds.lua
-- @include admission.lua
-- @include runs.lua
-- @include records.lua
-- @include globalkeys.lua
-- @include workflows.lua

---------------------------------------------------------------------------- ack

-- @include acks.lua

---------------------------------------------------------------------------- fetch

-- @include lease.lua
-- @include dispatch.lua
-- @include handoff.lua

---------------------------------------------------------------------------- enqueue

-- @include enqueue.lua
-- @include worker.lua

---------------------------------------------------------------------------- queries and control

-- @include control.lua
-- @include drain.lua

-- Functions that free memory, or must run for a full store to be drained -- a worker's
-- start (its declarations), its exchange, acks, renewals, sweeps, beats and leaving, a
-- cancel, a drain, a watch (one field on the record) -- run on a server at its maxmemory
-- (core.ALLOW_OOM); those that add data (enqueue, workflow steps and children, signals,
-- settings, redrive) do not, and the server refuses them there before they start.
redis.register_function{function_name = '__PREFIX__enqueue', callback = enqueuing.enqueue}
redis.register_function{function_name = '__PREFIX__enqueue_as', callback = workers.enqueue_as}
redis.register_function{function_name = '__PREFIX__exchange', callback = writeback.behind(workers.exchange),
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__ack', callback = writeback.behind(workers.ack), flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__leave', callback = workers.leave, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__renew', callback = workers.renew, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__sweep', callback = workers.sweep, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__beat', callback = workers.beat,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_task', callback = control.declare_task,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__claim_layout', callback = control.claim_layout,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__cancel', callback = control.cancel,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__drain', callback = drain.drain,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__watch', callback = control.watch, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__redrive', callback = control.redrive}
redis.register_function{function_name = '__PREFIX__pause', callback = pauses.pause, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__resume', callback = pauses.resume, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__unoffer', callback = pauses.unoffer, flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__configure_tenant', callback = control.configure_tenant}
redis.register_function{function_name = '__PREFIX__configure_limits', callback = control.configure_limits}
redis.register_function{function_name = '__PREFIX__configure_classes',
  callback = control.configure_classes}
redis.register_function{function_name = '__PREFIX__declare_lane', callback = control.declare_lane,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_admission', callback = control.declare_admission,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_bounds', callback = queue_bounds.declare,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__tenant_limit_now', callback = control.tenant_limit_now}
redis.register_function{function_name = '__PREFIX__wf_load', callback = workflows.wf_load}
redis.register_function{function_name = '__PREFIX__wf_step', callback = workflows.wf_step}
redis.register_function{function_name = '__PREFIX__wf_wait', callback = workflows.wf_wait}
redis.register_function{function_name = '__PREFIX__wf_children', callback = workflows.wf_children}
redis.register_function{function_name = '__PREFIX__signal', callback = workflows.signal}
redis.register_function{function_name = '__PREFIX__estimate', callback = estimating.estimate,
  flags = {'no-writes'}}
redis.register_function{function_name = '__PREFIX__learn_durations',
  callback = estimating.learn_durations}
redis.register_function{function_name = '__PREFIX__gk_enable', callback = globalkeys.enable,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__gk_report', callback = globalkeys.report,
  flags = core.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__gk_order', callback = globalkeys.order,
  flags = core.ALLOW_OOM}

-- @include tenantsweep.lua
