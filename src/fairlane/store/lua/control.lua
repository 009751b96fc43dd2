-- Queries and control: task and lane declarations, tenant settings, cancel, watch,
-- redrive.
--
-- Keys: tclasses, sig:<tenant>, job:<id>, kept:<task>:<outcome>, lane:<l>:state|delayed|dl,
--   lane:<l>:c:<c>:fair|deferred|dvt, q:<lane>:<class>:<tenant>, KEYS[TASKS],
--   KEYS[TLIMITS], KEYS[WEIGHTS], KEYS[DEAD], KEYS[STATS] (layout), gkeys (a global pool
--   joins it)
-- Calls: core, throttle, keyparts, fairqueue, records, leasing, dispatch, pauses
-- Entry points: control.{CANCEL_FIELDS, cancel, cancel_job, claim_layout, configure_classes,
--   configure_limits, configure_tenant, declare_admission, declare_lane, declare_task,
--   redrive, tenant_limit_now, watch}

local control = {}

do
  local DEAD, DEFAULT_CLASS, TASKS, TERMINAL = core.DEAD, core.DEFAULT_CLASS, core.TASKS, core.TERMINAL
  local STATS = core.STATS
  local TLIMITS, WEIGHTS, error_type = core.TLIMITS, core.WEIGHTS, core.error_type
  local job_key, lane_key, log_event = core.job_key, core.lane_key, core.log_event
  local now_ms, prefix, slots_of, wake = core.now_ms, core.prefix, core.slots_of, core.wake
  local rate_per_min, sig_key, tenant_limit = throttle.rate_per_min, throttle.sig_key, throttle.tenant_limit
  local thr_cancel_waiter = throttle.thr_cancel_waiter
  local class_key, deactivate, push_ready = fairqueue.class_key, fairqueue.deactivate, fairqueue.push_ready
  local tenant_queue = fairqueue.tenant_queue
  local apply_effects, finish, new_effects = records.apply_effects, records.finish, records.new_effects
  local lane_load, load_state, new_dispatch = dispatch.lane_load, dispatch.load_state, dispatch.new_dispatch

  -- ARGV: task, 'rc|rf'. Records a task's retention so sweeps can trim its records by age.
  local function declare_task(keys, args)
    redis.call('HSET', keys[TASKS], args[DeclareTaskArg.TASK], args[DeclareTaskArg.RETENTION])
    return 1
  end

  -- ARGV: the store layout this library writes. The shard's layout (the stats hash's
  -- `layout`), claimed by the first app to declare itself on it. Returns the layout found:
  -- the one given when it was free, '' when the shard holds data of a library that wrote
  -- none (store layout 1, fairlane/store/keys.py), which kept its FIFO counter in the
  -- stats hash's `seq` (this layout's is `fifo`: a producer that enqueued on a shard
  -- before any app declared itself there, after a restart that lost the data, leaves no
  -- sign of an earlier library).
  local function claim_layout(keys, args)
    local found = redis.call('HGET', keys[STATS], 'layout')
    if found then
      return found
    end
    if redis.call('HEXISTS', keys[STATS], 'seq') == 1 then
      return ''
    end
    redis.call('HSET', keys[STATS], 'layout', args[ClaimLayoutArg.LAYOUT])
    return args[ClaimLayoutArg.LAYOUT]
  end

  -- A tenant's setting in hash `key`: set to `value`, or removed when `value` is ''.
  local function set_tenant_setting(key, tenant, value)
    if value == '' then
      redis.call('HDEL', key, tenant)
    else
      redis.call('HSET', key, tenant, value)
    end
    return 1
  end

  -- ARGV: tenant, weight ('' = back to the default, 1). A new weight applies from the
  -- tenant's next dispatch.
  local function configure_tenant(keys, args)
    return set_tenant_setting(keys[WEIGHTS], args[ConfigureTenantArg.TENANT], args[ConfigureTenantArg.WEIGHT])
  end

  -- ARGV: tenant, concurrency settings 'floor,max,burst_floor,burst_pct' ('' = none).
  local function configure_limits(keys, args)
    return set_tenant_setting(keys[TLIMITS], args[ConfigureLimitsArg.TENANT], args[ConfigureLimitsArg.LIMITS])
  end

  -- ARGV: tenant, '1' to set its restricted classes (else kept), them as a JSON array,
  -- '1' to set its default class (else kept), it ('' = none). One step, so that setting
  -- one keeps the other; an entitlement left empty is removed (tclasses, enqueue.lua).
  function control.configure_classes(keys, args)
    local ek = prefix(keys) .. 'tclasses'
    local raw = redis.call('HGET', ek, args[ConfigureClassesArg.TENANT])
    local ent = raw and cjson.decode(raw) or {}
    local entitled, default = ent.c or {}, ent.d
    if args[ConfigureClassesArg.SET_CLASSES] == '1' then
      entitled = cjson.decode(args[ConfigureClassesArg.CLASSES])
    end
    if args[ConfigureClassesArg.SET_DEFAULT] == '1' then
      default = args[ConfigureClassesArg.DEFAULT] ~= '' and args[ConfigureClassesArg.DEFAULT] or nil
    end
    if #entitled == 0 and not default then
      redis.call('HDEL', ek, args[ConfigureClassesArg.TENANT])
      return 1
    end
    -- cjson writes an empty table as {}, which the readers take for no classes either
    redis.call('HSET', ek, args[ConfigureClassesArg.TENANT], cjson.encode({c = entitled, d = default}))
    return 1
  end

  -- ARGV: lane, its class table as JSON (classes.lua), how tenants are charged ('jobs':
  -- one unit per job; 'cost': what each job was learned to cost, corrected when it
  -- ends). Applies from the next decision.
  local function declare_lane(keys, args)
    cjson.decode(args[DeclareLaneArg.TABLE])
    local charge = args[DeclareLaneArg.CHARGE] == 'cost' and 'cost' or 'jobs'
    redis.call('HSET', lane_key(prefix(keys), args[DeclareLaneArg.LANE], 'state'),
      'table', args[DeclareLaneArg.TABLE], 'charge', charge)
    return 1
  end

  -- ARGV: lane, admission config JSON, unit class table JSON ('' '' = no admission
  -- control). Applies from the next submission; reservations held stay as they are. The
  -- pool of an app of many shards (`n` > 1) joins the balancer's report at once, before
  -- any submission (its part is kept when the pool is lifted: globalkeys.lua).
  local function declare_admission(keys, args)
    local sk = lane_key(prefix(keys), args[DeclareAdmissionArg.LANE], 'state')
    if args[DeclareAdmissionArg.CONFIG] == '' then
      redis.call('HDEL', sk, 'adm', 'utable')
    else
      local n = cjson.decode(args[DeclareAdmissionArg.CONFIG]).n
      if n and n > 1 then
        redis.call('ZADD', keyparts.keys_key(keys), 0, keyparts.POOL_PREFIX .. args[DeclareAdmissionArg.LANE])
      end
      cjson.decode(args[DeclareAdmissionArg.UNITS])
      redis.call('HSET', sk, 'adm', args[DeclareAdmissionArg.CONFIG], 'utable', args[DeclareAdmissionArg.UNITS])
    end
    return 1
  end

  -- ARGV: lane, tenant. The tenant's concurrency limit now (-1: it has no settings), and
  -- the signals it came from: {limit, rate per minute, mean duration, C, load}.
  local function tenant_limit_now(keys, args)
    local p, now = prefix(keys), now_ms()
    local cx = new_dispatch(keys, p, args[TenantLimitNowArg.LANE], 1, now, new_effects())
    load_state(cx)
    local cap, load = cx.cap, lane_load(cx.levels, cx.f, cx.d)
    local limit = tenant_limit(keys, p, args[TenantLimitNowArg.TENANT], cap, load, now) or -1
    local mean = tonumber(redis.call('HGET', sig_key(p, args[TenantLimitNowArg.TENANT]), 'dm')) or 0
    return {limit, tostring(rate_per_min(p, args[TenantLimitNowArg.TENANT], now)), tostring(mean), cap, load}
  end

  -- The fields of a job's record that cancelling it reads, in the places cancel_job reads
  -- them: a caller that reads more of the record (drain.lua) puts these first.
  local CANCEL_FIELDS = {'st', 'lane', 'tenant', 'cls', 'sl', 'pz'}

  -- Cancels job `id` at once if it is waiting; a running one is asked to stop (its worker
  -- learns on its next lease renewal). `f` holds its CANCEL_FIELDS when the caller read
  -- them (else they are read here); what the cancel frees is gathered in `tally`, for the
  -- caller's apply_effects. Returns the status after the call. A queued job a throttle key
  -- woke gives its offers back in `finish` (its `toff`); a deferred job that is its
  -- class's pinned head gets the lane a readmission pass.
  local function cancel_job(keys, p, id, now, tally, f)
    local jk = job_key(p, id)
    f = f or redis.call('HMGET', jk, unpack(CANCEL_FIELDS))
    local st, cls = f[1], f[4] or DEFAULT_CLASS
    if not st then
      return 'missing'
    end
    f[2], f[3] = f[2] or core.DEFAULT_LANE, f[3] or core.DEFAULT_TENANT
    if st == 'queued' and f[6] then
      -- parked by a pause (pauses.lua): out of its queue, its slots out of the demand
      redis.call('ZREM', pauses.parked_key(p, f[6]), id)
    elseif st == 'queued' then
      local q = tenant_queue(p, f[2], cls, f[3])
      if redis.call('ZREM', q, id) == 1 then
        redis.call('HINCRBY', lane_key(p, f[2], 'state'), 'd:' .. cls, -slots_of(f[5]))
      end
      if redis.call('ZCARD', q) == 0 then
        -- the tag stays as it was: cancelling and queueing again gains nothing
        local tag = redis.call('ZSCORE', class_key(p, f[2], cls, 'fair'), f[3])
        if tag then
          deactivate(p, f[2], cls, f[3], tag)
        end
      end
    elseif st == 'throttled' then
      thr_cancel_waiter(keys, id, now)
    elseif st == 'deferred' then
      if redis.call('ZREM', class_key(p, f[2], cls, 'deferred'), id) == 1 then
        redis.call('HINCRBY', lane_key(p, f[2], 'state'), 'ad:' .. cls, -1)
      end
      -- the pinned head may hold its class (nothing else admitted): a pass now drops it
      -- and admits what fits rather than at the lane's next release. Any other deferred
      -- job leaves its group when a pass reaches it; it held nothing back.
      if redis.call('HGET', class_key(p, f[2], cls, 'dvt'), 'pin') == id then
        tally.readmit[f[2]] = true
      end
    elseif st == 'scheduled' then
      redis.call('ZREM', lane_key(p, f[2], 'delayed'), id)
    elseif st == 'running' then
      redis.call('HSET', jk, 'cx', '1')
      return 'cancelling'
    else
      return st
    end
    finish(keys, p, id, 'cancelled', 'err',
      '{"type":"Cancelled","message":"the job was cancelled","traceback":""}', now, tally)
    return 'cancelled'
  end

  -- ARGV: id. cancel_job on one job, its effects applied at once.
  local function cancel(keys, args)
    local p, now, tally = prefix(keys), now_ms(), new_effects()
    local status = cancel_job(keys, p, args[CancelArg.ID], now, tally)
    if status == 'cancelled' then
      apply_effects(keys, p, tally, now)
    end
    return status
  end

  -- ARGV: id. Returns {status, result, error} for a finished job; for any other job it
  -- sets the waiter flag (so its completion is published) and returns {status}.
  local function watch(keys, args)
    local p = prefix(keys)
    local jk = job_key(p, args[WatchArg.ID])
    local f = redis.call('HMGET', jk, 'st', 'res', 'err')
    if not f[1] then
      return {'missing'}
    end
    if TERMINAL[f[1]] then
      return {f[1], f[2] or '', f[3] or ''}
    end
    redis.call('HSET', jk, 'w', '1', 'x', '1')
    return {f[1]}
  end

  -- ARGV: limit, ids... (none = the oldest `limit`). Sends dead-lettered jobs back to
  -- their queues with a fresh attempt budget, but one whose restricted class its tenant
  -- is not entitled to (it stays dead-lettered: entitle the tenant first). Returns the ids
  -- re-driven.
  local function redrive(keys, args)
    local p, now = prefix(keys), now_ms()
    local fx, seen, lanes = new_effects(), {}, {}
    local ids = {}
    for i = RedriveArg.FIRST_ID, #args do
      ids[#ids + 1] = args[i]
    end
    if #ids == 0 then
      ids = redis.call('ZRANGE', keys[DEAD], 0, tonumber(args[RedriveArg.LIMIT]) - 1)
    end
    local done = {}
    for _, id in ipairs(ids) do
      local jk = job_key(p, id)
      local f = redis.call('HMGET', jk, 'st', 'lane', 'tenant', 'prio', 'seq', 'task', 'cls', 'sl',
        'start', 'wk', 'att', 'fin', 'err', 'qw', 'use', 'dl')
      if f[1] then
        f[2], f[3] = f[2] or core.DEFAULT_LANE, f[3] or core.DEFAULT_TENANT
      end
      local memo = f[2] and (lanes[f[2]] or {seen = seen})
      if memo then
        lanes[f[2]] = memo
      end
      if f[1] == 'failed' and not (memo and leasing.lost_class(keys, p, f[2], f[7] or DEFAULT_CLASS,
          f[3] or '', fx, memo)) and redis.call('ZREM', keys[DEAD], id) == 1 then
        local idx = p .. 'kept:' .. (f[6] or '') .. ':failed'
        redis.call('ZREM', idx, id)
        redis.call('SREM', records.links_key(idx), id)
        redis.call('HSET', jk, 'st', 'queued', 'att', 0, 'run', now)
        -- a fresh deploy window too (hb, acks.lua); what its last attempt reported of its
        -- time (use) goes with that attempt into the event
        redis.call('HDEL', jk, 'fin', 'err', 'res', 'hb', 'use')
        -- its first life's last attempt and end, which the record is about to forget
        log_event(p, id, now, 'redriven', {start = tonumber(f[9]), wk = f[10] or nil,
          att = tonumber(f[11]), fin = tonumber(f[12]), err = error_type(f[13] or nil),
          qw = f[14] ~= '' and f[14] or nil, use = f[15] or nil})
        push_ready(p, f[2], f[7] or DEFAULT_CLASS, f[3], id, f[4], f[5], f[8])
        if tonumber(f[16]) then -- unfinished again: back in the deadline index
          redis.call('ZADD', lane_key(p, f[2], 'dl'), tonumber(f[16]), id)
        end
        wake(p, f[2])
        done[#done + 1] = id
      end
    end
    return done
  end

  control.CANCEL_FIELDS = CANCEL_FIELDS
  control.cancel = cancel
  control.cancel_job = cancel_job
  control.configure_limits = configure_limits
  control.configure_tenant = configure_tenant
  control.declare_admission = declare_admission
  control.declare_lane = declare_lane
  control.claim_layout = claim_layout
  control.declare_task = declare_task
  control.redrive = redrive
  control.tenant_limit_now = tenant_limit_now
  control.watch = watch
end
