-- Tenants within a class: their queues, start-time fair queuing's activation and
-- idling, the classes' in-flight and waiting slots, and jobs a throttle key woke.
--
-- Keys: q:<lane>:<class>:<tenant>, lane:<l>:c:<class>:fair|vt, lane:<l>:state, job:<id>,
--   weights
-- Calls: core, classes, throttle, keyruns, pausetable
-- Entry points: fairqueue.{activate, add_settled, class_key, deactivate, enter_all_woken,
--   flush_pushes, flush_queue, flush_settled, give_back_offers, lane_waiting, new_pushes,
--   push_ready, release_grant, release_throttle, settle_running, take_back_offers, tenant_queue,
--   unweigh, work_of}

local fairqueue = {}

do
  local DEFAULT_CLASS, job_key, lane_key = core.DEFAULT_CLASS, core.job_key, core.lane_key
  local log_event, now_ms, order_score = core.log_event, core.now_ms, core.order_score
  local slots_of, wake = core.slots_of, core.wake
  local class_table = classes.class_table
  local thr_cancel, thr_release = throttle.thr_cancel, throttle.thr_release

  -- Per-class keys of a lane: `fair` (active tenant -> start tag), `vt` (V, in-flight
  -- `run`, idle tenants' finish tags `f:<tenant>`).
  local function class_key(p, lane, cls, what)
    return p .. 'lane:' .. lane .. ':c:' .. cls .. ':' .. what
  end

  local function tenant_queue(p, lane, cls, tenant)
    return p .. 'q:' .. lane .. ':' .. cls .. ':' .. tenant
  end

  -- Fair dispatch between a class's tenants: start-time fair queuing by work units
  -- (fairlane/policy/fairqueue.py derives it and states its bounds). A tenant that
  -- becomes active starts at max(F_t, V - run / active tenants): level with the work
  -- the others have *finished*, so a newcomer is not made to wait behind work that was
  -- merely dispatched first, and a returning tenant's credit is bounded by the work in
  -- flight -- never by how long it was idle.
  local function activate(p, lane, cls, tenant)
    local vt = class_key(p, lane, cls, 'vt')
    local fair = class_key(p, lane, cls, 'fair')
    local f = redis.call('HMGET', vt, 'V', 'run', 'f:' .. tenant)
    local start = tonumber(f[1]) or 0
    local active = redis.call('ZCARD', fair)
    if active > 0 then
      start = start - (tonumber(f[2]) or 0) / active
    end
    local finish = tonumber(f[3])
    if finish then
      if finish > start then
        start = finish
      end
      redis.call('HDEL', vt, 'f:' .. tenant)
    end
    redis.call('ZADD', fair, start, tenant)
    -- the class's waiting weight `W:<class>`, the sum of its active tenants' weights: a
    -- worker shares its slots between shards by it (fairlane/policy/shardshare.py), so
    -- only a shard of an app of several keeps it
    if core.sharded(p) then
      local w = tonumber(redis.call('HGET', p .. 'weights', tenant)) or 1
      redis.call('HINCRBYFLOAT', lane_key(p, lane, 'state'), 'W:' .. cls, w)
    end
  end

  -- A tenant left class `cls`'s fair set: the class's waiting weight loses `w` (its weight
  -- now, read when not given), or starts again from nought once the set is empty (a weight
  -- changed while its tenant waited is then forgotten). Only where it is kept (activate).
  function fairqueue.unweigh(p, lane, cls, tenant, w, empty)
    if not core.sharded(p) then
      return
    end
    local sk = lane_key(p, lane, 'state')
    if empty == nil then
      empty = redis.call('ZCARD', class_key(p, lane, cls, 'fair')) == 0
    end
    if empty then
      redis.call('HSET', sk, 'W:' .. cls, 0)
      return
    end
    w = w or tonumber(redis.call('HGET', p .. 'weights', tenant)) or 1
    redis.call('HINCRBYFLOAT', sk, 'W:' .. cls, -w)
  end

  -- Put a job in its tenant's queue; the tenant becomes active if it had no work. The
  -- class's waiting demand `d:<class>` grows by the job's slots. With `batch` (an
  -- enqueue's pushes) the members and the demand are gathered and written by
  -- `flush_pushes`, one ZADD per queue, and a queue already pushed to is known to be
  -- active.
  local function push_ready(p, lane, cls, tenant, id, prio, seq, slots, batch)
    local q = tenant_queue(p, lane, cls, tenant)
    if not (batch and batch.active[q]) then
      if redis.call('ZCARD', q) == 0 then
        activate(p, lane, cls, tenant)
      end
      if batch then
        batch.active[q] = true
      end
    end
    if batch then
      local z = batch.z[q]
      if not z then
        z = {}
        batch.z[q] = z
        batch.order[#batch.order + 1] = q
      end
      z[#z + 1] = order_score(prio, seq)
      z[#z + 1] = id
      batch.d[cls] = (batch.d[cls] or 0) + slots_of(slots)
    else
      redis.call('ZADD', q, order_score(prio, seq), id)
      redis.call('HINCRBY', lane_key(p, lane, 'state'), 'd:' .. cls, slots_of(slots))
    end
  end

  function fairqueue.new_pushes()
    return {active = {}, d = {}, z = {}, order = {}}
  end

  -- Write the members gathered for queue `q`, so that a reader sees them (a fairness
  -- key's order is taken from its queue's head).
  function fairqueue.flush_queue(batch, q)
    local z = batch.z[q]
    if z then
      core.chunked('ZADD', q, z)
      batch.z[q] = {}
    end
  end

  local function flush_pushes(p, lane, batch)
    for _, q in ipairs(batch.order) do
      fairqueue.flush_queue(batch, q)
    end
    batch.z, batch.order = {}, {}
    for cls, n in pairs(batch.d) do
      redis.call('HINCRBY', lane_key(p, lane, 'state'), 'd:' .. cls, n)
    end
    batch.d = {}
  end

  -- A tenant whose queue emptied leaves the active set; its tag is kept as its finish tag.
  local function deactivate(p, lane, cls, tenant, tag)
    redis.call('ZREM', class_key(p, lane, cls, 'fair'), tenant)
    redis.call('HSET', class_key(p, lane, cls, 'vt'), 'f:' .. tenant, tag)
    fairqueue.unweigh(p, lane, cls, tenant)
  end

  -- Whether any class of a lane has work waiting for a slot.
  local function lane_waiting(p, lane)
    local sk = lane_key(p, lane, 'state')
    local fields = {}
    for i, c in ipairs(class_table(sk)) do
      fields[i] = 'd:' .. c[ClassRow.NAME]
    end
    for _, v in ipairs(redis.call('HMGET', sk, unpack(fields))) do
      if (tonumber(v) or 0) > 0 then
        return true
      end
    end
    return false
  end

  -- The work a job is charged in its tenant's tag: one unit, or in 'cost' mode (where
  -- enqueue records `cu`) what it is expected to cost. In-flight work `run` counts the
  -- same units, so that a newcomer's credit (`run / active`) is in the tags' own scale.
  local function work_of(charged_mu)
    return charged_mu and (core.num(charged_mu) or 0) / 1000 or 1
  end

  -- A running attempt of a job ended: the class's in-flight slots and work shrink.
  local function settle_running(p, lane, cls, slots, work)
    redis.call('HINCRBYFLOAT', class_key(p, lane, cls, 'vt'), 'run', -(work or 1))
    redis.call('HINCRBY', lane_key(p, lane, 'state'), 'f:' .. cls, -slots_of(slots))
  end

  -- Settlements of one ack batch, added up per lane and class and written at once.
  -- `settled[lane][cls]`: nested rather than keyed by a joined name, as a name joined
  -- per job costs the interpreter a new string each time and a lookup does not. `slots`:
  -- a width as slots_of reads it.
  local function add_settled(settled, lane, cls, slots, work)
    local by_class = settled[lane]
    if not by_class then
      by_class = {}
      settled[lane] = by_class
    end
    local e = by_class[cls]
    if not e then
      e = {0, 0}
      by_class[cls] = e
    end
    e[1], e[2] = e[1] + work, e[2] + slots
  end

  local function flush_settled(p, settled)
    for lane, by_class in pairs(settled) do
      for cls, e in pairs(by_class) do
        settle_running(p, lane, cls, e[2], e[1])
      end
      settled[lane] = nil
    end
  end

  -- A throttle key woke job `id` with offers on its keys: it goes back into its tenant's
  -- queue of its class at its own place (its priority and seq), the tenant active again
  -- if it was idle, and its lane is woken. It takes its slots with its lane slot
  -- (dispatch converts the offers), so a throttle slot is held only by running work.
  -- A job whose scope an operator paused gives its offers back at once and waits in its
  -- queue holding none (fairlane/policy/pauses.py, P4): the waiters its offers wake are
  -- added to `wakes`, to enter in turn. A pause table is read only on a shard that has
  -- pauses, at most once per call of enter_all_woken.
  local function enter_woken(keys, p, id, key, now, wakes, pz)
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'lane', 'cls', 'tenant', 'prio', 'seq', 'sl', 'task', 'fk')
    f[1] = f[1] or core.DEFAULT_LANE
    local cls, tenant = f[2] or DEFAULT_CLASS, f[3] or core.DEFAULT_TENANT
    now = now or now_ms()
    if pz.t == nil then
      pz.t = pausetable.lane_has_pauses(p, f[1]) and pausetable.load(p, now) or false
    end
    if pz.t and pausetable.blocks(pz.t, f[1], cls, f[7], tenant, f[8]) then
      redis.call('HSET', jk, 'st', 'queued', 'x', '1')
      local _, more = thr_cancel(keys, id, now)
      for _, w in ipairs(more) do
        wakes[#wakes + 1] = w
      end
    else
      redis.call('HSET', jk, 'st', 'queued', 'toff', '1', 'x', '1')
      log_event(p, id, now, 'granted', {key = key})
    end
    push_ready(p, f[1], cls, tenant, id, f[4] or 0, f[5] or 0, f[6])
    wake(p, f[1])
  end

  local function enter_all_woken(p, wakes, now, keys)
    local n, pz = #wakes, {}
    local i = 1
    while i <= #wakes do
      enter_woken(keys, p, wakes[i][1], wakes[i][2], now, wakes, pz)
      i = i + 1
    end
    return n > 0
  end

  -- Release a job's throttle `grant` (its record's `ttok`, dropped here) and wake the keys;
  -- `used` (units the attempt used, nil when unknown) corrects its rate keys, `succeeded`
  -- grows its adaptive ones (thr_release, as is `quiet`). Returns the waiters woken, for
  -- the caller to enter.
  local function release_grant(keys, p, id, grant, now, used, succeeded, quiet)
    redis.call('HDEL', job_key(p, id), 'ttok')
    if keyruns.release(keys, grant) then
      return {}
    end
    local wakes, names = thr_release(keys, grant, now, used, succeeded, quiet)
    if names and #wakes == 0 then
      keyruns.released(keys, names, quiet)
    end
    return wakes
  end

  -- Release a job's throttle grant, if it holds one, and enter the waiters that wakes.
  local function release_throttle(keys, p, id, grant, now, used, succeeded)
    if grant then
      enter_all_woken(p, release_grant(keys, p, id, grant, now, used, succeeded), now, keys)
    end
  end

  -- A woken job that will not run (cancelled, expired) gives its offers back. Returns
  -- the waiters that wakes (the caller enters them: dispatch only where it is safe).
  local function take_back_offers(keys, p, id, now)
    redis.call('HDEL', job_key(p, id), 'toff')
    local _, wakes = thr_cancel(keys, id, now)
    return wakes
  end

  local function give_back_offers(keys, p, id, now)
    enter_all_woken(p, take_back_offers(keys, p, id, now), now, keys)
  end

  fairqueue.activate = activate
  fairqueue.add_settled = add_settled
  fairqueue.class_key = class_key
  fairqueue.deactivate = deactivate
  fairqueue.enter_all_woken = enter_all_woken
  fairqueue.flush_pushes = flush_pushes
  fairqueue.flush_settled = flush_settled
  fairqueue.give_back_offers = give_back_offers
  fairqueue.lane_waiting = lane_waiting
  fairqueue.push_ready = push_ready
  fairqueue.release_grant = release_grant
  fairqueue.release_throttle = release_throttle
  fairqueue.settle_running = settle_running
  fairqueue.take_back_offers = take_back_offers
  fairqueue.tenant_queue = tenant_queue
  fairqueue.work_of = work_of
end
