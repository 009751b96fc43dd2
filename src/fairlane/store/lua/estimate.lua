-- Start-time estimates: what one needs, read in one call (fairlane/policy/startpredict.py
-- works the estimate out from it), and the learned lengths it rests on.
--
-- Learned lengths (fairlane/store/durations.py names the fields): in `dur`, a shard's
-- hash, the mean slot-ms of a class's jobs (`c`), the mean ms of a task's attempts
-- (`k`) and what a class's jobs used lately (`uc`); in `dur:<tenant>`, a tenant's own
-- hash (the tenant sweep forgets it with the tenant's other state), the mean slot-ms of
-- its jobs in a class (`t`), the units a start of its is charged (`u`), the mean ms of
-- its attempts of a task (`k`) and what its jobs in a class used lately (`w`). A field
-- names its tenant last when it has one (`place` routes it). Workers fold what their
-- attempts took into them (learn_durations), so no job's own call writes any of it.
--
-- What was used lately: the slot-ms finished in the last whole window of
-- USAGE_WINDOW_MS, kept in one field as 'window|slot-ms|previous window|its slot-ms'.
--
-- Keys: dur, dur:<tenant>, job:<id>, q:<lane>:<class>:<tenant>, lane:<l>:c:<c>:fair,
--   lane:<l>:state, KEYS[WEIGHTS], pause
-- Calls: core, classes, fairqueue, pausetable
-- Entry points: estimating.{estimate, expected_ms, learn_durations}

local estimating = {}

do
  local WEIGHTS, job_key, lane_key = core.WEIGHTS, core.job_key, core.lane_key
  local class_key, tenant_queue = fairqueue.class_key, fairqueue.tenant_queue
  local DEFAULT_CLASS = core.DEFAULT_CLASS

  local USAGE_WINDOW_MS = __USAGE_WINDOW_MS__

  local function dur_key(p, tenant)
    if tenant then
      return p .. 'dur:' .. tenant
    end
    return p .. 'dur'
  end

  -- where a field lives: a tenant's own (`t`, `u`: kind, lane, class, tenant; `k`: kind,
  -- task, tenant) in its key, without its name; the others in `dur`
  local TENANT_AT = {t = 3, u = 3, k = 2}

  local function place(p, field)
    local parts = TENANT_AT[string.sub(field, 1, 1)]
    local at = 0
    for _ = 1, parts or 0 do
      at = string.find(field, '\0', at + 1, true)
      if not at then
        return dur_key(p), field
      end
    end
    if not parts then
      return dur_key(p), field
    end
    return dur_key(p, string.sub(field, at + 1)), string.sub(field, 1, at - 1)
  end

  local function in_class(kind, lane, cls)
    return kind .. '\0' .. lane .. '\0' .. cls
  end

  -- The ms a job of `task` and `tenant` is expected to run: its tenant's mean for the
  -- task, else every tenant's; nil when no attempt of the task was learned.
  local function expected_ms(p, task, tenant)
    local own = tonumber(redis.call('HGET', dur_key(p, tenant), 'k\0' .. task))
    return own or tonumber(redis.call('HGET', dur_key(p), 'k\0' .. task))
  end

  -- The slot-ms finished in window `w - 1`, from a usage field's value.
  local function last_use(value, w)
    local cur, sum, prev, psum = string.match(value or '', '^(-?%d+)|([^|]+)|(-?%d+)|([^|]+)$')
    if tonumber(cur) == w - 1 then
      return tonumber(sum) or 0
    elseif tonumber(prev) == w - 1 then
      return tonumber(psum) or 0
    end
    return 0
  end

  local function add_use(key, field, ms, w)
    local v = redis.call('HGET', key, field)
    local cur, sum, prev, psum = string.match(v or '', '^(-?%d+)|([^|]+)|(-?%d+)|([^|]+)$')
    cur, sum = tonumber(cur), tonumber(sum) or 0
    if cur == w then
      sum = sum + ms
    else
      prev, psum = -1, 0
      if cur == w - 1 then
        prev, psum = cur, sum
      end
      cur, sum = w, ms
    end
    redis.call('HSET', key, field, string.format('%d|%.3f|%d|%.3f', cur, sum, prev, psum))
  end

  -- Fold each entry's attempts into its learned mean as if one by one, each moving it
  -- by ALPHA (fairlane.policy.startpredict.fold_mean; the first sets it); what a tenant's
  -- and a class's jobs took is also added to the window now.
  function estimating.learn_durations(keys, args)
    local p = core.prefix(keys)
    local alpha = tonumber(args[LearnArg.ALPHA])
    local w = math.floor(core.now_ms() / USAGE_WINDOW_MS)
    local written = 0
    for i = LearnArg.FIRST_ENTRY, #args, 3 do
      local n, total = tonumber(args[i + 1]) or 0, tonumber(args[i + 2]) or 0
      if n > 0 then
        local key, field = place(p, args[i])
        local mean = tonumber(redis.call('HGET', key, field))
        local batch = total / n
        if mean then
          local keep = (1 - alpha) ^ n
          mean = keep * mean + (1 - keep) * batch
        else
          mean = batch
        end
        redis.call('HSET', key, field, string.format('%.3f', mean))
        written = written + 1
        local kind = string.sub(field, 1, 1)
        if kind == 't' then
          add_use(key, 'w' .. string.sub(field, 2), total, w)
        elseif kind == 'c' then
          add_use(key, 'uc' .. string.sub(field, 2), total, w)
        end
      end
    end
    return written
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
  local function waiting_tenants(keys, p, lane, cls, cap, own, use, now)
    local fair = class_key(p, lane, cls, 'fair')
    local total = redis.call('ZCARD', fair)
    local names = redis.call('ZRANGE', fair, 0, cap - 1)
    local out = {}
    local listed = #names
    -- the job's own tenant is read too, whether it waits already or not; each tenant's
    -- learned slot-ms, charge and last window's use from its own key
    if not redis.call('ZSCORE', fair, own) then
      names[#names + 1] = own
    elseif redis.call('ZRANK', fair, own) >= cap then
      names[#names + 1] = own
      listed = listed + 1
    end
    local weights = redis.call('HMGET', keys[WEIGHTS], unpack(names))
    local w = math.floor(now / USAGE_WINDOW_MS)
    local t_f, u_f, w_f = in_class('t', lane, cls), in_class('u', lane, cls), in_class('w', lane, cls)
    for i = 1, #names do
      local learned = redis.call('HMGET', dur_key(p, names[i]), t_f, u_f, w_f)
      out[#out + 1] = names[i]
      out[#out + 1] = weights[i] or '1'
      out[#out + 1] = redis.call('ZCARD', tenant_queue(p, lane, cls, names[i]))
      out[#out + 1] = learned[1] or ''
      out[#out + 1] = learned[2] or ''
      use[#use + 1] = string.format('%.3f', last_use(learned[3], w) / USAGE_WINDOW_MS)
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
        'run', 'fk', 'enq')
      -- (fields enqueue left out at their defaults, core.lua; an absent run is enq)
      st, tenant, lane, cls, task, dl, run, fk = f[1], f[2] or core.DEFAULT_TENANT,
        f[3] or core.DEFAULT_LANE, f[4] or DEFAULT_CLASS, f[5], f[6], f[7] or f[9], f[8]
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
    local use = {}
    local listed, unread = waiting_tenants(keys, p, lane, cls,
      tonumber(args[EstimateArg.MAX_TENANTS]), tenant, use, now)
    reply[EstimateReply.TENANTS] = listed
    local class_now = redis.call('HMGET', dur_key(p), in_class('c', lane, cls),
      in_class('uc', lane, cls))
    use[#use + 1] = string.format('%.3f',
      last_use(class_now[2], math.floor(now / USAGE_WINDOW_MS)) / USAGE_WINDOW_MS)
    reply[EstimateReply.USAGE] = use
    reply[EstimateReply.UNREAD] = unread
    reply[EstimateReply.CLASS_MEAN] = class_now[1] or ''
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
