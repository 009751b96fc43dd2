-- Draining: the waiting jobs of one source that a filter matches, cancelled (or only
-- counted) a bounded chunk per call, each exactly as control.cancel_job cancels one.
--
-- A source is one zset of waiting jobs: a tenant's queue of a class or a pause's parked
-- set (queued), a class's
-- deferred index or a tenant's deferred group (deferred), a lane's delayed set
-- (scheduled), or the throttle waiters (throttled, members '<key>\0<tenant>\0<order>\0
-- <job>'). It is walked with ZSCAN, whose cursor outlives the call: every job in the
-- source from the first call to the last is seen at least once, whatever is added or
-- removed meanwhile, and a job seen twice is cancelled once (its status has changed).
-- A job matches when its record says it is in the source's state and every filter given
-- holds: lane, class, tenant, task, fairness key, enqueued at or after / before.
--
-- Keys: q:<lane>:<class>:<tenant>, parked:<field>, lane:<l>:c:<c>:deferred,
--   lane:<l>:c:<c>:dq:<tenant>, lane:<l>:delayed, KEYS[THRW], job:<id>, and what
--   cancel_job touches
-- Calls: core, fairqueue, pauses, admission, records, control
-- Entry points: drain.{drain}

local drain = {}

do
  local DEFAULT_CLASS, THRW, job_key = core.DEFAULT_CLASS, core.THRW, core.job_key
  local lane_key, now_ms, prefix = core.lane_key, core.now_ms, core.prefix
  local class_key, tenant_queue = fairqueue.class_key, fairqueue.tenant_queue
  local apply_effects, new_effects = records.apply_effects, records.new_effects
  local CANCEL_FIELDS, cancel_job = control.CANCEL_FIELDS, control.cancel_job

  -- places in a record's fields as read here: cancel_job's first, then the filters'
  local ST, LANE, TENANT, CLS = 1, 2, 3, 4
  local TASK, ENQ, FK = #CANCEL_FIELDS + 1, #CANCEL_FIELDS + 2, #CANCEL_FIELDS + 3
  -- ZSCAN's COUNT: the call's bounds are checked between pages, so a page is what a call
  -- may run over them by (a zset small enough to be a listpack comes whole: 128 at most)
  local PAGE = 8
  -- a throttle waiter's tenant and job (Lua 5.1 spells the zero byte %z)
  local WAITER = '^[^%z]*%z([^%z]*)%z[^%z]*%z(.*)$'
  -- The server's CPU clock, where it gives scripts one (os.clock: Redis 7.2+, Valkey); a
  -- budget of work, not a time of record (TIME stands still inside a script). Without
  -- it a call looks at CLOCKLESS entries at most: a few milliseconds' work. Looked up at
  -- the first call (a library being loaded has no pcall), false: none.
  local clock
  local CLOCKLESS = 24

  local function cpu_clock()
    if clock == nil then
      local has, found = pcall(function() return os.clock end)
      clock = has and found or false
    end
    return clock
  end

  local function given(v)
    return v ~= '' and v or nil
  end

  -- The source's zset, and whether its members are throttle waiters.
  local function source_key(keys, p, state, lane, cls, tenant, parked)
    if parked then
      return pauses.parked_key(p, parked), false
    elseif state == 'queued' then
      return tenant_queue(p, lane, cls, tenant), false
    elseif state == 'deferred' then
      if tenant then
        return admission.deferral.group(p, lane, cls, tenant), false
      end
      return class_key(p, lane, cls, 'deferred'), false
    elseif state == 'scheduled' then
      return lane_key(p, lane, 'delayed'), false
    elseif state == 'throttled' then
      return keys[THRW], true
    end
    error('drain: no waiting state ' .. tostring(state))
  end

  local function matches(f, flt)
    if f[ST] then
      f[LANE], f[TENANT] = f[LANE] or core.DEFAULT_LANE, f[TENANT] or core.DEFAULT_TENANT
    end
    if f[ST] ~= flt.state or (flt.lane and f[LANE] ~= flt.lane)
        or (flt.tenant and f[TENANT] ~= flt.tenant)
        or (flt.cls and (f[CLS] or DEFAULT_CLASS) ~= flt.cls)
        or (flt.task and f[TASK] ~= flt.task) or (flt.fk and f[FK] ~= flt.fk) then
      return false
    end
    local enq = tonumber(f[ENQ]) or 0
    return not ((flt.after and enq < flt.after) or (flt.before and enq >= flt.before))
  end

  -- ARGV: state (queued, deferred, scheduled, throttled), lane, class, tenant (the source
  -- and filters: '' any), cursor ('0' starts), limit (entries looked at), budget_us (the
  -- server's CPU time a call may take, looked at between pages; with no clock, CLOCKLESS
  -- entries bound it instead), '1' to count only, task, fairness key, enqueued at or
  -- after, enqueued before (ms; '' any). Returns {cursor ('0' once the source is walked
  -- through), entries looked at, jobs matched: cancelled, or counted in a dry run, the
  -- CPU time the call took (us; -1: no clock)}. What the cancels free is applied once, at
  -- the call's end.
  local function run(keys, args)
    local p, now = prefix(keys), now_ms()
    local flt = {state = args[DrainArg.STATE], lane = given(args[DrainArg.LANE]),
      cls = given(args[DrainArg.SERVICE_CLASS]), tenant = given(args[DrainArg.TENANT]),
      task = given(args[DrainArg.TASK]), fk = given(args[DrainArg.FAIRNESS_KEY]),
      after = tonumber(args[DrainArg.AFTER_MS]), before = tonumber(args[DrainArg.BEFORE_MS])}
    local key, waiters = source_key(keys, p, flt.state, flt.lane, flt.cls, flt.tenant,
      given(args[DrainArg.PARKED] or ''))
    local fields = {unpack(CANCEL_FIELDS)}
    fields[TASK], fields[ENQ] = 'task', 'enq'
    -- a field the record lacks costs a scan of it: read only when filtered on
    if flt.fk then
      fields[FK] = 'fk'
    end
    local dry, limit = args[DrainArg.DRY_RUN] == '1', tonumber(args[DrainArg.LIMIT])
    local clock = cpu_clock()
    local budget, started = tonumber(args[DrainArg.BUDGET_US]) / 1e6, clock and clock()
    if not clock then
      limit = math.min(limit, CLOCKLESS)
    end
    local cursor, seen, matched, tally = args[DrainArg.CURSOR], 0, 0, new_effects()
    repeat
      local page = redis.call('ZSCAN', key, cursor, 'COUNT', PAGE)
      cursor = page[1]
      local members = page[2]
      for i = 1, #members, 2 do
        local id, tenant = members[i], nil
        if waiters then
          tenant, id = string.match(id, WAITER)
        end
        seen = seen + 1
        if id and not (flt.tenant and tenant and tenant ~= flt.tenant) then
          local f = redis.call('HMGET', job_key(p, id), unpack(fields))
          if matches(f, flt) then
            matched = matched + 1
            if not dry then
              cancel_job(keys, p, id, now, tally, f)
            end
          end
        end
      end
    until cursor == '0' or seen >= limit or (clock and clock() - started >= budget)
    if matched > 0 and not dry then
      apply_effects(keys, p, tally, now)
    end
    local used = clock and math.floor((clock() - started) * 1e6) or -1
    return {[DrainReply.CURSOR] = cursor, [DrainReply.SEEN] = seen, [DrainReply.MATCHED] = matched,
      [DrainReply.CPU_US] = used}
  end

  drain.drain = run
end
