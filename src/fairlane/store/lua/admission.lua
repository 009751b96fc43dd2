-- Admission: reservations of work against a lane's capacity in units, bounded queues,
-- and deferral (docs/contracts/admission.md states the rules, fairlane/policy/admission
-- is their Python twin; this is the store's).
-- Everything is counted in integer milli-units. A lane without an admission config
-- (`adm` in its state hash) admits everything and reserves nothing.
--   state `adm`        JSON {C, R, max, safety, window, classes = {name: [max_queue,
--                      max_queue_mu (-1 none), tenant_max_queue, max_deferred, defer,
--                      tenant_max_queue_mu (-1 none)]}}
--   state `utable`     the class table for units (min_slots = min milli-units)
--   state `ar:<c>`     milli-units reserved by admitted, unfinished jobs of class c
--   state `an:<c>`     admitted, unfinished jobs of class c
--   state `ad:<c>`     deferred jobs of class c
--   lane:<l>:adm:t     hash '<c>|<tenant>' -> admitted, unfinished jobs of the tenant
--   lane:<l>:adm:tu    hash '<c>|<tenant>' -> milli-units those jobs reserved
--   lane:<l>:c:<c>:deferred  zset: deferred job ids by FIFO order
--   lane:<l>:adm:rej   hash tenant -> '<count>|<window start ms>': recent rejections
--   cost:<key>         hash mean, n: a learned cost per (tenant, workflow, model)

local REJECT_WINDOW_MS = 60000
local COST_RISE = 0.5
local MIN_CHARGE_MU = __MIN_CHARGE_MILLI__
-- defined in records.lua: admitting a deferred job may expire it instead
local admit_deferred

local function admission_of(p, lane)
  local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'adm', 'utable')
  if not v[1] then
    return nil
  end
  local cfg = cjson.decode(v[1])
  cfg.utable = cjson.decode(v[2])
  return cfg
end

-- Everything a lane declares, in one read: its class table, whether tenants are
-- charged by cost, and its admission config (nil: none).
local function lane_declarations(p, lane)
  local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'table', 'charge', 'adm', 'utable')
  local adm
  if v[3] then
    adm = cjson.decode(v[3])
    adm.utable = cjson.decode(v[4])
  end
  return cjson.decode(v[1] or DEFAULT_CLASSES), v[2] == 'cost', adm
end

local function tenant_count_key(p, lane)
  return lane_key(p, lane, 'adm:t')
end

-- The learned cost of a (tenant, workflow, model) key in milli-units, or nil.
local function learned_mu(p, cost_key)
  if not cost_key or cost_key == '' then
    return nil
  end
  return tonumber(redis.call('HGET', p .. 'cost:' .. cost_key, 'mean'))
end

-- The learned cost of a key, read once per call: `cache` keeps false for a key that has
-- none, so that a batch of one key's jobs costs one read.
local function cached_learned_mu(p, cost_key, cache)
  local learned = cache[cost_key or '']
  if learned == nil then
    learned = learned_mu(p, cost_key) or false
    cache[cost_key or ''] = learned
  end
  return learned
end

-- What a new job is expected to cost, in milli-units: the larger of what the caller
-- declared and what its key was learned to cost; with nothing declared, the learned
-- cost alone (the default cost until something is learned).
local function expected_mu(p, declared_mu, declared, cost_key, cache)
  local learned = cached_learned_mu(p, cost_key, cache)
  if learned == false then
    return declared_mu
  end
  if declared then
    return math.max(declared_mu, learned)
  end
  return learned
end

-- What dispatch charges a new job's tenant in 'cost' mode, in milli-units
-- (fairlane/policy/admission, charge_milli): what the job's key was learned to cost
-- (or what the caller declared, if more); a job nobody knows anything about yet is
-- charged the least, MIN_CHARGE_MU, and corrected when it ends.
local function charge_mu(p, declared_mu, declared, cost_key, cache)
  local learned = cached_learned_mu(p, cost_key, cache)
  local mu = declared and declared_mu or 0
  if learned then
    mu = math.max(mu, learned)
  end
  return math.max(MIN_CHARGE_MU, mu)
end

-- A job's cost correction when it ends: its tenant's tag in its class moves by the gap
-- between what it used and what it was charged, over the tenant's weight (fairqueue.py
-- rule 4: a charge lands on the present, a refund never puts the tenant ahead of V).
local function adjust_tag(p, lane, cls, tenant, delta)
  local vt = class_key(p, lane, cls, 'vt')
  local fair = class_key(p, lane, cls, 'fair')
  local v = tonumber(redis.call('HGET', vt, 'V')) or 0
  local tag = tonumber(redis.call('ZSCORE', fair, tenant))
  if tag then
    redis.call('ZADD', fair, math.max(v, math.max(tag, v) + delta), tenant)
  else
    local finish = tonumber(redis.call('HGET', vt, 'f:' .. tenant)) or 0
    redis.call('HSET', vt, 'f:' .. tenant, math.max(v, math.max(finish, v) + delta))
  end
end

-- Fold jobs' actual costs, in order, into their key's learned cost: quick to rise
-- (half the gap per job), slow to fall (alpha = 2 / (window + 1)), so under-declaring
-- stops paying within a few jobs while one cheap job barely lowers the estimate.
local function learn_costs(p, cost_key, samples, window)
  local ck = p .. 'cost:' .. cost_key
  local v = redis.call('HMGET', ck, 'mean', 'n')
  local mean, n = tonumber(v[1]), tonumber(v[2]) or 0
  for _, actual_mu in ipairs(samples) do
    if not mean or n == 0 then
      mean = actual_mu
    elseif actual_mu > mean then
      mean = mean + COST_RISE * (actual_mu - mean)
    else
      mean = mean + 2 / (window + 1) * (actual_mu - mean)
    end
    n = n + 1
  end
  redis.call('HSET', ck, 'mean', mean, 'n', n)
  return mean
end

-- Rules 3-5 of the admission contract for one request; returns 'accepted', or the reason it is full.
local function room_for(p, lane, cfg, cls, tenant, mu, fresh)
  local bounds = cfg.classes[cls]
  local sk = lane_key(p, lane, 'state')
  local nt = tonumber(redis.call('HGET', tenant_count_key(p, lane), cls .. '|' .. tenant)) or 0
  if bounds and nt >= bounds[3] then
    return 'tenant_queue_full'
  end
  if bounds and (bounds[6] or -1) >= 0 then
    local tu = tonumber(redis.call('HGET', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant)) or 0
    if tu + mu > bounds[6] then
      return 'tenant_queue_full'
    end
  end
  local tbl = cfg.utable
  local fields = {'an:' .. cls}
  for i, c in ipairs(tbl) do
    fields[i + 1] = 'ar:' .. c[1]
  end
  local v = redis.call('HMGET', sk, unpack(fields))
  local reserved, w, d, total, x = {}, {}, {}, 0, nil
  for i, c in ipairs(tbl) do
    reserved[i] = math.max(0, tonumber(v[i + 1]) or 0)
    total = total + reserved[i]
    d[i] = 0
    if c[1] == cls then
      x = i
    end
  end
  if bounds and ((tonumber(v[1]) or 0) >= bounds[1]
      or (bounds[2] >= 0 and reserved[x] + mu > bounds[2])) then
    return 'class_queue_full'
  end
  -- the class rules take widths of at least one; the job still reserves its true mu
  w[x], d[x] = math.max(mu, 1), math.max(mu, 1)
  if choose_class(class_levels(tbl, cfg.C), reserved, w, d) ~= x then
    return 'class_full'
  end
  if fresh and cfg.C - total - mu < cfg.R then
    return 'class_full'
  end
  return 'accepted'
end

local function reserve(p, lane, cls, tenant, id, mu)
  local sk = lane_key(p, lane, 'state')
  redis.call('HINCRBY', sk, 'ar:' .. cls, mu)
  redis.call('HINCRBY', sk, 'an:' .. cls, 1)
  redis.call('HINCRBY', tenant_count_key(p, lane), cls .. '|' .. tenant, 1)
  redis.call('HINCRBY', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant, mu)
  -- `mu` is the live reservation (released once); `emu` keeps what was reserved
  redis.call('HSET', job_key(p, id), 'mu', mu, 'emu', mu)
end

-- A job's reservation ends (it finished, or a retry left for its backoff).
local function release_reservation(p, id, lane, cls, tenant, mu, fx)
  mu = tonumber(mu)
  if not mu then
    return
  end
  -- `0 - mu`, not `-mu`: a free job's -0 reaches the server as '-0', which Redis 7.0
  -- refuses as an integer
  local back = 0 - mu
  local sk = lane_key(p, lane, 'state')
  redis.call('HINCRBY', sk, 'ar:' .. cls, back)
  redis.call('HINCRBY', sk, 'an:' .. cls, -1)
  if redis.call('HINCRBY', tenant_count_key(p, lane), cls .. '|' .. tenant, -1) <= 0 then
    redis.call('HDEL', tenant_count_key(p, lane), cls .. '|' .. tenant)
  end
  if redis.call('HINCRBY', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant, back) <= 0 then
    redis.call('HDEL', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant)
  end
  redis.call('HDEL', job_key(p, id), 'mu')
  fx.readmit[lane] = true
end

local function defer(p, lane, cls, id, seq)
  redis.call('ZADD', class_key(p, lane, cls, 'deferred'), seq, id)
  redis.call('HINCRBY', lane_key(p, lane, 'state'), 'ad:' .. cls, 1)
  redis.call('HSET', job_key(p, id), 'st', 'deferred')
end

local function may_defer(p, lane, cfg, cls)
  local bounds = cfg.classes[cls]
  if not bounds or bounds[5] ~= 1 then
    return false
  end
  local n = tonumber(redis.call('HGET', lane_key(p, lane, 'state'), 'ad:' .. cls)) or 0
  return n < bounds[4]
end

-- Count a rejection of `tenant`'s request; returns its earlier rejections in the window.
local function note_rejection(p, lane, tenant, now)
  local rk = lane_key(p, lane, 'adm:rej')
  local n, start = 0, now
  local v = redis.call('HGET', rk, tenant)
  if v then
    local c, s = string.match(v, '^(%d+)|(%d+)$')
    if tonumber(s) and now - tonumber(s) < REJECT_WINDOW_MS then
      n, start = tonumber(c), tonumber(s)
    end
  end
  redis.call('HSET', rk, tenant, (n + 1) .. '|' .. start)
  return n
end

-- The decision for a new job (fresh work). Returns 'accepted', 'deferred' or
-- 'rejected', the reason (nil when accepted) and the reservation in milli-units.
local function admit_new(p, lane, cfg, cls, tenant, base_mu)
  local mu = math.floor(base_mu * cfg.safety + 0.5)
  if mu > cfg.max then
    return 'rejected', 'too_wide', mu
  end
  local why = room_for(p, lane, cfg, cls, tenant, mu, true)
  if why == 'accepted' then
    return 'accepted', nil, mu
  end
  if may_defer(p, lane, cfg, cls) then
    return 'deferred', why, mu
  end
  return 'rejected', why, mu
end

-- Counts one decision of admit_new in the stats hash, field
-- 'adm:<outcome>:<reason>:<lane>:<class>' (reason 'none' when accepted), for the
-- metrics. It joins the call's effects, so a batch costs one HINCRBY per distinct field
-- rather than one per job. Lane and class names hold no ':' and the reasons are a fixed
-- set, so the number of fields stays bounded by the declared lanes and classes.
local function count_decision(fx, lane, cls, verdict, reason)
  local name = 'adm:' .. verdict .. ':' .. (reason or 'none') .. ':' .. lane .. ':' .. cls
  fx.counts[name] = (fx.counts[name] or 0) + 1
end
