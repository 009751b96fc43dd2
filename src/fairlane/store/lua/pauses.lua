-- Pauses: what dispatch does with held work (fairlane/policy/pauses.py, rules P1-P5),
-- an operator's pause and resume, and lifting a pause that ended.
--
-- Keys: pause (field -> end ms, 0 none), pause:why (field -> JSON reason, by, at, until),
--   pause:lanes (the lanes flagged `P`), lane:<l>:c:<c>:held (tenants held in the class),
--   parked:<field> (zset job id -> order score), job:<id> (`pz`: the field it is parked
--   under), lane:<l>:state, q:<lane>:<class>:<tenant>, KEYS[LEASES]
-- Calls: core, classes, pausetable, fairqueue
-- Entry points: pauses.{LIFT_BUDGET, hold, lift, lift_ended, park, parked_key, pause, resume,
--   unoffer}

local pauses = {}

do
  local LEASES, job_key, lane_key = core.LEASES, core.job_key, core.lane_key
  local log_event, now_ms, prefix, wake = core.log_event, core.now_ms, core.prefix, core.wake
  local class_key, tenant_queue = fairqueue.class_key, fairqueue.tenant_queue
  local field = pausetable.field

  -- parked jobs a dispatch lifting an ended pause moves back per call
  -- (fairlane/policy/pauses.py's LIFT_BUDGET, written in by the library)
  pauses.LIFT_BUDGET = __LIFT_BUDGET__

  local function why_key(p)
    return p .. 'pause:why'
  end

  local function lanes_key(p)
    return p .. 'pause:lanes'
  end

  local function parked_key(p, fld)
    return p .. 'parked:' .. fld
  end
  pauses.parked_key = parked_key

  -- P2: a paused tenant came to a class's head and left its fair set (dispatch idled it).
  function pauses.hold(p, lane, cls, tenant)
    redis.call('SADD', class_key(p, lane, cls, 'held'), tenant)
  end

  -- P3: a job of a paused task or key came to its class's head and was taken from its
  -- queue (dispatch took it, uncharged): it waits in the scope's parked set at its order
  -- score. Offers it held go back (P4). Returns the waiters that woke.
  function pauses.park(keys, p, id, f, fld, now)
    redis.call('ZADD', parked_key(p, fld), core.order_score(f[12] or 0, f[13] or 0), id)
    local jk = job_key(p, id)
    redis.call('HSET', jk, 'pz', fld)
    log_event(p, id, now, 'paused', {scope = fld})
    if f[21] then
      return fairqueue.take_back_offers(keys, p, id, now)
    end
    return {}
  end

  -- A tenant pause lifted: each class that held the tenant activates it again by the
  -- ordinary rule (P2), if it still has work waiting there.
  local function lift_tenant(p, tenant)
    for _, lane in ipairs(redis.call('SMEMBERS', lanes_key(p))) do
      for _, c in ipairs(classes.class_table(lane_key(p, lane, 'state'))) do
        local cls = c[ClassRow.NAME]
        if redis.call('SREM', class_key(p, lane, cls, 'held'), tenant) == 1
          and redis.call('ZCARD', tenant_queue(p, lane, cls, tenant)) > 0
          and not redis.call('ZSCORE', class_key(p, lane, cls, 'fair'), tenant) then
          fairqueue.activate(p, lane, cls, tenant)
          wake(p, lane)
        end
      end
    end
  end

  -- Up to `budget` parked jobs of the field back into their queues at their own places
  -- (P3); a job parked there but since cancelled or moved is dropped. Returns how many
  -- are left parked.
  local function lift_parked(p, fld, budget)
    local pk = parked_key(p, fld)
    local ids = redis.call('ZRANGE', pk, 0, budget - 1)
    for _, id in ipairs(ids) do
      local jk = job_key(p, id)
      local f = redis.call('HMGET', jk, 'st', 'pz', 'lane', 'cls', 'tenant', 'prio', 'seq', 'sl')
      if f[1] == 'queued' and f[2] == fld then
        redis.call('HDEL', jk, 'pz')
        local lane = f[3] or core.DEFAULT_LANE
        fairqueue.push_ready(p, lane, f[4] or core.DEFAULT_CLASS, f[5] or core.DEFAULT_TENANT, id,
          f[6] or 0, f[7] or 0, f[8])
        wake(p, lane)
      end
    end
    if #ids > 0 then
      redis.call('ZREM', pk, unpack(ids))
    end
    return redis.call('ZCARD', pk)
  end

  -- The pause of `fld` no longer holds: lift it, `budget` parked jobs at most. Once
  -- nothing is left of it, its entry goes; once the table is empty, the lanes' flags.
  -- Returns the parked jobs left.
  local function lift(p, fld, budget)
    local kind = string.sub(fld, 1, 1)
    local left = 0
    if kind == PauseField.TENANT then
      lift_tenant(p, string.sub(fld, 3))
    elseif kind == PauseField.KEY or kind == PauseField.TASK then
      left = lift_parked(p, fld, budget)
    elseif kind == PauseField.LANE then
      local lane = string.match(fld, '^..([^%z]*)')
      wake(p, lane)
    end
    if left > 0 then
      return left
    end
    redis.call('HDEL', p .. 'pause', fld)
    redis.call('HDEL', why_key(p), fld)
    if redis.call('EXISTS', p .. 'pause') == 0 then
      for _, lane in ipairs(redis.call('SMEMBERS', lanes_key(p))) do
        redis.call('HDEL', lane_key(p, lane, 'state'), 'P')
      end
      redis.call('DEL', lanes_key(p))
    end
    return 0
  end
  pauses.lift = lift

  -- Lift the pauses of table `t` that ended (dispatch, once per call).
  function pauses.lift_ended(p, t)
    for _, fld in ipairs(t.ended) do
      lift(p, fld, pauses.LIFT_BUDGET)
    end
  end

  -- Whether a running job of these fields is in the scope `fld` names.
  local function in_scope(fld, lane, cls, tenant, task, fk)
    local t = pausetable.single(fld)
    return pausetable.blocks(t, lane, cls, task, tenant, fk) or pausetable.refusal(t, tenant) ~= nil
  end

  -- Running jobs of the scope are asked to stop at their next lease renewal, as a cancel
  -- asks (`cx`). Returns how many were asked.
  local function cancel_running(keys, p, fld)
    local n = 0
    for _, id in ipairs(redis.call('ZRANGE', keys[LEASES], 0, -1)) do
      local jk = job_key(p, id)
      local f = redis.call('HMGET', jk, 'st', 'lane', 'cls', 'tenant', 'task', 'fk')
      if f[1] == 'running' and in_scope(fld, f[2] or core.DEFAULT_LANE,
          f[3] or core.DEFAULT_CLASS, f[4] or core.DEFAULT_TENANT, f[5], f[6]) then
        redis.call('HSET', jk, 'cx', '1')
        n = n + 1
      end
    end
    return n
  end

  -- ARGV: field, for_ms (0: until resumed), why (JSON), cancel running (0/1), lanes...
  -- Puts the pause in force (or moves its end) and flags every lane named, and those
  -- flagged before, as having pauses. Returns {1 new / 0 changed, running asked to stop,
  -- its end in ms (0 none)}.
  function pauses.pause(keys, args)
    local p, now = prefix(keys), now_ms()
    local fld = args[PauseArg.FIELD]
    local for_ms = tonumber(args[PauseArg.FOR_MS]) or 0
    local untl = for_ms > 0 and now + for_ms or 0
    local new = redis.call('HSET', p .. 'pause', fld, untl)
    local why = cjson.decode(args[PauseArg.WHY])
    why.at, why['until'] = now, untl
    redis.call('HSET', why_key(p), fld, cjson.encode(why))
    for i = PauseArg.FIRST_LANE, #args do
      redis.call('SADD', lanes_key(p), args[i])
    end
    for _, lane in ipairs(redis.call('SMEMBERS', lanes_key(p))) do
      redis.call('HSET', lane_key(p, lane, 'state'), 'P', '1')
    end
    local asked = 0
    if args[PauseArg.CANCEL_RUNNING] == '1' then
      asked = cancel_running(keys, p, fld)
    end
    return {new, asked, untl}
  end

  -- ARGV: ids... Each job of a paused scope that a throttle key woke before the pause,
  -- and that still waits in its queue with offers, gives them back (P4); the waiters they
  -- wake enter their queues. Returns how many gave offers back. (A pause's caller finds
  -- the woken jobs, `w:<job>` in the throttle hash, a bounded scan at a time.)
  function pauses.unoffer(keys, args)
    local p, now = prefix(keys), now_ms()
    local t = pausetable.load(p, now)
    local n = 0
    for i = UnofferArg.FIRST_ID, #args do
      local id = args[i]
      local f = redis.call('HMGET', job_key(p, id), 'st', 'toff', 'lane', 'cls', 'task', 'tenant', 'fk')
      if f[1] == 'queued' and f[2] and pausetable.blocks(t, f[3] or core.DEFAULT_LANE,
          f[4] or core.DEFAULT_CLASS, f[5], f[6] or core.DEFAULT_TENANT, f[7]) then
        fairqueue.give_back_offers(keys, p, id, now)
        n = n + 1
      end
    end
    return n
  end

  -- ARGV: field, budget. Ends the pause now and lifts up to `budget` of its parked jobs
  -- (call again while any are left). Returns {1 it was paused / 0 not, jobs left}.
  function pauses.resume(keys, args)
    local p = prefix(keys)
    local fld = args[ResumeArg.FIELD]
    if not redis.call('HGET', p .. 'pause', fld) then
      return {0, 0}
    end
    -- ended (an end in the past), so that dispatch lifts what a caller that stops here
    -- leaves
    redis.call('HSET', p .. 'pause', fld, 1)
    return {1, lift(p, fld, tonumber(args[ResumeArg.BUDGET]))}
  end
end
