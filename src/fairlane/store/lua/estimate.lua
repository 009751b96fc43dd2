-- Start-time estimates: what one needs, read in one call (fairlane/policy/startpredict.py
-- works the estimate out from it), and the learned durations it rests on.
--
-- Durations (`dur`, a hash per shard; fairlane/store/durations.py names its fields):
-- the mean slot-ms of a tenant's jobs in a class and of the class, the mean units a
-- tenant's job in a class is charged, the mean ms of a task's attempts for a tenant and
-- for every tenant; each folded by workers from the
-- attempts they ran (learn_durations), so the hot path writes nothing for them.
--
-- Usage (`use:<window>`, a hash per shard and window of USAGE_WINDOW_MS, expiring after
-- three): the slot-ms a tenant's jobs in a class, and the class's, finished in that
-- window, added by the same batches: what a tenant that keeps no queue takes as it submits.
--
-- Keys: dur, use:<window>, job:<id>, q:<lane>:<class>:<tenant>, lane:<l>:c:<c>:fair, lane:<l>:state,
--   KEYS[WEIGHTS], pause
-- Calls: core, classes, fairqueue, pausetable
-- Entry points: estimating.{estimate, expected_ms, learn_durations}

local estimating = {}

do
  local WEIGHTS, job_key, lane_key = core.WEIGHTS, core.job_key, core.lane_key
  local class_key, tenant_queue = fairqueue.class_key, fairqueue.tenant_queue
  local DEFAULT_CLASS = core.DEFAULT_CLASS

  local USAGE_WINDOW_MS = __USAGE_WINDOW_MS__

  local function dur_key(p)
    return p .. 'dur'
  end

  local function use_key(p, window)
    return p .. 'use:' .. window
  end

  -- the fields of `dur` (fairlane/store/durations.py builds the same)
  local function tenant_field(lane, cls, tenant)
    return 't\0' .. lane .. '\0' .. cls .. '\0' .. tenant
  end

  local function charge_field(lane, cls, tenant)
    return 'u\0' .. lane .. '\0' .. cls .. '\0' .. tenant
  end

  local function class_field(lane, cls)
    return 'c\0' .. lane .. '\0' .. cls
  end

  local function task_field(task, tenant)
    if tenant then
      return 'k\0' .. task .. '\0' .. tenant
    end
    return 'k\0' .. task
  end

  -- The ms a job of `task` and `tenant` is expected to run: its tenant's mean for the
  -- task, else every tenant's; nil when no attempt of the task was learned.
  local function expected_ms(p, task, tenant)
    local v = redis.call('HMGET', dur_key(p), task_field(task, tenant), task_field(task))
    return tonumber(v[1]) or tonumber(v[2])
  end

  -- Fold each entry's attempts into its learned mean as if one by one, each moving it
  -- by ALPHA (fairlane.policy.startpredict.fold_mean; the first sets it).
  function estimating.learn_durations(keys, args)
    local p = core.prefix(keys)
    local alpha = tonumber(args[LearnArg.ALPHA])
    local fields, counts, sums = {}, {}, {}
    for i = LearnArg.FIRST_ENTRY, #args, 3 do
      fields[#fields + 1] = args[i]
      counts[#counts + 1] = tonumber(args[i + 1]) or 0
      sums[#sums + 1] = tonumber(args[i + 2]) or 0
    end
    if #fields == 0 then
      return 0
    end
    local dk = dur_key(p)
    local old = redis.call('HMGET', dk, unpack(fields))
    local out = {}
    for i = 1, #fields do
      local n = counts[i]
      if n > 0 then
        local batch = sums[i] / n
        local mean = tonumber(old[i])
        if mean then
          local keep = (1 - alpha) ^ n
          mean = keep * mean + (1 - keep) * batch
        else
          mean = batch
        end
        out[#out + 1] = fields[i]
        out[#out + 1] = string.format('%.3f', mean)
      end
    end
    if #out > 0 then
      redis.call('HSET', dk, unpack(out))
    end
    -- the slot-ms of tenants' and classes' jobs, added to this window's usage
    local uk = use_key(p, math.floor(core.now_ms() / USAGE_WINDOW_MS))
    local used = false
    for i = 1, #fields do
      local kind = string.sub(fields[i], 1, 1)
      if (kind == 't' or kind == 'c') and sums[i] > 0 then
        redis.call('HINCRBYFLOAT', uk, fields[i], sums[i])
        used = true
      end
    end
    if used then
      redis.call('PEXPIRE', uk, 3 * USAGE_WINDOW_MS)
    end
    return #out / 2
  end

  local function class_loads(sk, tbl)
    local fields = {}
    for i = 1, #tbl do
      local name = tbl[i][ClassRow.NAME]
      fields[#fields + 1] = 'f:' .. name
      fields[#fields + 1] = 'd:' .. name
    end
    if #fields == 0 then
      return {}
    end
    local v = redis.call('HMGET', sk, unpack(fields))
    for i = 1, #v do
      v[i] = tonumber(v[i]) or 0
    end
    return v
  end

  -- The class's waiting tenants, at most `cap` of them (those served soonest first):
  -- tenant, weight, waiting jobs, mean slot-ms and mean charge in units per job ('' none
  -- learned); and how many more.
  -- The slot-ms per second the tenants `names` (field `t`) and the class (field `c`)
  -- finished in the last whole usage window: ('' none) per tenant, then the class's.
  local function usage(p, lane, cls, names, now)
    local fields = {}
    for i = 1, #names do
      fields[i] = tenant_field(lane, cls, names[i])
    end
    fields[#fields + 1] = class_field(lane, cls)
    local v = redis.call('HMGET', use_key(p, math.floor(now / USAGE_WINDOW_MS) - 1), unpack(fields))
    local out = {}
    for i = 1, #fields do
      local ms = tonumber(v[i])
      out[i] = ms and string.format('%.3f', ms / USAGE_WINDOW_MS) or ''
    end
    return out
  end

  local function waiting_tenants(keys, p, lane, cls, cap, own)
    local fair = class_key(p, lane, cls, 'fair')
    local total = redis.call('ZCARD', fair)
    local names = redis.call('ZRANGE', fair, 0, cap - 1)
    local out = {}
    local listed = #names
    -- the job's own tenant is read too, whether it waits already or not
    if not redis.call('ZSCORE', fair, own) then
      names[#names + 1] = own
    elseif redis.call('ZRANK', fair, own) >= cap then
      names[#names + 1] = own
      listed = listed + 1
    end
    local weights = redis.call('HMGET', keys[WEIGHTS], unpack(names))
    local mfields = {}
    for i = 1, #names do
      mfields[2 * i - 1] = tenant_field(lane, cls, names[i])
      mfields[2 * i] = charge_field(lane, cls, names[i])
    end
    local means = redis.call('HMGET', dur_key(p), unpack(mfields))
    for i = 1, #names do
      out[#out + 1] = names[i]
      out[#out + 1] = weights[i] or '1'
      out[#out + 1] = redis.call('ZCARD', tenant_queue(p, lane, cls, names[i]))
      out[#out + 1] = means[2 * i - 1] or ''
      out[#out + 1] = means[2 * i] or ''
    end
    return out, math.max(0, total - listed)
  end

  -- What an estimate of job `id` needs (or, `id` '', of a job of the names given, as if
  -- submitted now): EstimateReply's places.
  function estimating.estimate(keys, args)
    local p = core.prefix(keys)
    local now = core.now_ms()
    local id = args[EstimateArg.JOB]
    local st, tenant, lane, cls, task, dl, run, fk
    local reply = {}
    reply[EstimateReply.NOW] = now
    if id ~= '' then
      local f = redis.call('HMGET', job_key(p, id), 'st', 'tenant', 'lane', 'cls', 'task', 'dl',
        'run', 'fk')
      st, tenant, lane, cls, task, dl, run, fk = f[1], f[2], f[3], f[4] or DEFAULT_CLASS, f[5],
        f[6], f[7], f[8]
      if not st then
        reply[EstimateReply.STATE] = ''
        return reply
      end
    else
      st, tenant, lane = 'new', args[EstimateArg.TENANT], args[EstimateArg.LANE]
      cls, task = args[EstimateArg.CLASS], args[EstimateArg.TASK]
    end
    reply[EstimateReply.STATE] = st
    reply[EstimateReply.TENANT] = tenant or ''
    reply[EstimateReply.LANE] = lane or ''
    reply[EstimateReply.CLASS] = cls
    reply[EstimateReply.TASK] = task or ''
    reply[EstimateReply.DEADLINE] = dl or ''
    reply[EstimateReply.RUN_AT] = run or ''
    if not lane or not tenant then
      return reply
    end
    local q = tenant_queue(p, lane, cls, tenant)
    local ahead = -1
    local before = args[EstimateArg.BEFORE]
    if st == 'new' and before and before ~= '' then -- behind the jobs that order before it
      ahead = redis.call('ZCOUNT', q, '-inf', '(' .. before)
    elseif st == 'new' or st == 'scheduled' then -- at the end of the queue, now or when due
      ahead = redis.call('ZCARD', q)
    elseif st == 'queued' then
      ahead = redis.call('ZRANK', q, id) or -1
    end
    reply[EstimateReply.AHEAD] = ahead
    local sk = lane_key(p, lane, 'state')
    local tbl = classes.class_table(sk)
    local lane_state = redis.call('HMGET', sk, 'C', 'charge')
    reply[EstimateReply.CAPACITY] = tonumber(lane_state[1]) or 0
    reply[EstimateReply.CHARGE] = lane_state[2] or ''
    reply[EstimateReply.TABLE] = cjson.encode(tbl)
    reply[EstimateReply.LOADS] = class_loads(sk, tbl)
    local listed, unread = waiting_tenants(keys, p, lane, cls,
      tonumber(args[EstimateArg.MAX_TENANTS]), tenant)
    reply[EstimateReply.TENANTS] = listed
    local names = {}
    for i = 1, #listed, 5 do
      names[#names + 1] = listed[i]
    end
    reply[EstimateReply.USAGE] = usage(p, lane, cls, names, now)
    reply[EstimateReply.UNREAD] = unread
    reply[EstimateReply.CLASS_MEAN] = redis.call('HGET', dur_key(p), class_field(lane, cls)) or ''
    reply[EstimateReply.OWN_MS] = task and expected_ms(p, task, tenant) or ''
    local paused = 0
    if pausetable.lane_has_pauses(p, lane) then
      local t = pausetable.load(p, now)
      paused = pausetable.blocks(t, lane, cls, task, tenant, fk) and 1 or 0
    end
    reply[EstimateReply.PAUSED] = paused
    return reply
  end

  estimating.expected_ms = expected_ms
end
