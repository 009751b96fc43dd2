-- Throttle keys: per-key concurrency limits with fair waiter queues and direct
-- hand-off (fairlane/policy/throttle.py states the rules and proves them; this is its
-- twin, step for step). State, all under the app's hash tag:
--   KEYS[THR]  hash  l:<key> limit in force, u:<key> slots in use, r:<key> jobs naming
--                    it; h:<job> 'token<TAB>key<TAB>key..' held slots; p:<job>
--                    'at<TAB>prio<TAB>seq<TAB>key..' a parked job; tok the grant counter
--   KEYS[THRW] zset  every waiter at score 0, member '<key>\0<order>\0<job>', so the
--                    queue of a key is a lex range and its head the first member

local TAB = '\t'

local function split_tabs(s)
  local out = {}
  for part in string.gmatch(s, '[^\t]+') do
    out[#out + 1] = part
  end
  return out
end

-- Waiter order: highest priority first, then lowest seq, then job id.
local function wait_member(key, prio, seq, id)
  return key .. '\0' .. string.format('%016d%020d', 1e15 - tonumber(prio), tonumber(seq))
    .. '\0' .. id
end

local function queue_head(keys, key)
  local m = redis.call('ZRANGEBYLEX', keys[THRW], '[' .. key .. '\0', '(' .. key .. '\1',
    'LIMIT', 0, 1)[1]
  if not m then
    return nil
  end
  -- Lua 5.1 patterns spell the zero byte %z
  return m, string.match(m, '%z[^%z]*%z(.*)$')
end

local function has_room(keys, key)
  local v = redis.call('HMGET', keys[THR], 'l:' .. key, 'u:' .. key)
  return (tonumber(v[2]) or 0) < (tonumber(v[1]) or 0)
end

local function first_full(keys, names)
  for _, key in ipairs(names) do
    if not has_room(keys, key) then
      return key
    end
  end
  return nil
end

local function grant(keys, id, names)
  local token = redis.call('HINCRBY', keys[THR], 'tok', 1)
  for _, key in ipairs(names) do
    redis.call('HINCRBY', keys[THR], 'u:' .. key, 1)
  end
  redis.call('HSET', keys[THR], 'h:' .. id, token .. TAB .. table.concat(names, TAB))
  return token
end

local function park(keys, id, names, at, prio, seq)
  redis.call('HSET', keys[THR], 'p:' .. id,
    at .. TAB .. prio .. TAB .. seq .. TAB .. table.concat(names, TAB))
  redis.call('ZADD', keys[THRW], 0, wait_member(at, prio, seq, id))
end

-- Hand `key`'s room to its waiters until it is full or nobody waits. Appends
-- {job, token} for every waiter admitted.
local function drain(keys, key, out)
  while has_room(keys, key) do
    local member, id = queue_head(keys, key)
    if not member then
      return
    end
    redis.call('ZREM', keys[THRW], member)
    local parts = split_tabs(redis.call('HGET', keys[THR], 'p:' .. id))
    redis.call('HDEL', keys[THR], 'p:' .. id)
    local names = {unpack(parts, 4)}
    local blocker = first_full(keys, names)
    if blocker then
      park(keys, id, names, blocker, parts[2], parts[3])
      redis.call('HINCRBY', keys[THR], 'moves', 1)
    else
      out[#out + 1] = {id, grant(keys, id, names)}
      redis.call('HINCRBY', keys[THR], 'handoffs', 1)
    end
  end
end

local function unref(keys, names)
  for _, key in ipairs(names) do
    if redis.call('HINCRBY', keys[THR], 'r:' .. key, -1) <= 0 then
      redis.call('HDEL', keys[THR], 'r:' .. key, 'l:' .. key, 'u:' .. key)
    end
  end
end

-- Admit `id` on every key of `limits` ({{key, limit}, ..} sorted by key) at once, or
-- park it on its first full key. Returns the grant token (nil when parked), the
-- waiters admitted on the way (by limits this job raised) and the key it parked on.
local function thr_acquire(keys, id, limits, prio, seq)
  local names, raised = {}, {}
  for i, kl in ipairs(limits) do
    local key, limit = kl[1], tonumber(kl[2])
    names[i] = key
    local cur = tonumber(redis.call('HGET', keys[THR], 'l:' .. key))
    if cur and limit > cur and queue_head(keys, key) then
      raised[#raised + 1] = key
    end
    redis.call('HSET', keys[THR], 'l:' .. key, limit)
    redis.call('HINCRBY', keys[THR], 'r:' .. key, 1)
  end
  local handoffs = {}
  for _, key in ipairs(raised) do
    drain(keys, key, handoffs)
  end
  local blocker = first_full(keys, names)
  if not blocker then
    return grant(keys, id, names), handoffs
  end
  park(keys, id, names, blocker, prio, seq)
  return nil, handoffs, blocker
end

-- Free the slots of `id`'s grant `token` and hand them on. A stale token or a job
-- holding nothing changes nothing. Returns the waiters admitted.
local function thr_release(keys, id, token)
  local held = redis.call('HGET', keys[THR], 'h:' .. id)
  local handoffs = {}
  if not held then
    return handoffs
  end
  local parts = split_tabs(held)
  if parts[1] ~= tostring(token) then
    return handoffs
  end
  redis.call('HDEL', keys[THR], 'h:' .. id)
  local names, freed = {unpack(parts, 2)}, {}
  for _, key in ipairs(names) do
    redis.call('HINCRBY', keys[THR], 'u:' .. key, -1)
    if queue_head(keys, key) and has_room(keys, key) then
      freed[#freed + 1] = key
    end
  end
  for _, key in ipairs(freed) do
    drain(keys, key, handoffs)
  end
  unref(keys, names)
  return handoffs
end

-- Take a parked job out of its queue; false when it was not waiting.
local function thr_cancel_waiter(keys, id)
  local parked = redis.call('HGET', keys[THR], 'p:' .. id)
  if not parked then
    return false
  end
  local parts = split_tabs(parked)
  redis.call('ZREM', keys[THRW], wait_member(parts[1], parts[2], parts[3], id))
  redis.call('HDEL', keys[THR], 'p:' .. id)
  unref(keys, {unpack(parts, 4)})
  return true
end

---------------------------------------------------------------------------- tenant ceilings

-- A tenant's own key and its limit now (fairlane/policy/ceilings.py): Little's law on
-- its recent submission rate R and mean duration D, a burst on top, compressed by the
-- lane's pressure. Settings in KEYS[TLIMITS]: tenant -> 'floor,max,burst_floor,burst_pct'
-- (max -1 = none); signals in sig:<tenant> (a ring of RATE_BUCKETS counters and the
-- duration mean): all fixed-size reads.
local RATE_BUCKETS, RATE_WIDTH_MS = __RATE_BUCKETS__, __RATE_WIDTH_MS__
local F_MIN, F_MAX, DURATION_ALPHA = __F_MIN__, __F_MAX__, __DURATION_ALPHA__

local function ceil_eps(x)
  return math.ceil(x - CLASS_EPS)
end

local function sig_key(p, tenant)
  return p .. 'sig:' .. tenant
end

-- Count `n` submissions of a tenant at `now` (only tenants with limits are tracked).
local function note_submissions(p, tenant, n, now)
  local index = math.floor(now / RATE_WIDTH_MS)
  local slot = index % RATE_BUCKETS
  local sk = sig_key(p, tenant)
  local stamp = tonumber(redis.call('HGET', sk, 's' .. slot))
  if stamp and stamp > index then
    return
  end
  if stamp ~= index then
    redis.call('HSET', sk, 's' .. slot, index, 'c' .. slot, n)
  else
    redis.call('HINCRBY', sk, 'c' .. slot, n)
  end
end

-- Fold one finished attempt's duration (seconds) into the tenant's mean.
local function note_duration(p, tenant, seconds)
  local sk = sig_key(p, tenant)
  local v = redis.call('HMGET', sk, 'dm', 'dn')
  local mean = tonumber(v[1])
  if not mean or not tonumber(v[2]) or tonumber(v[2]) == 0 then
    mean = seconds
  else
    mean = mean + DURATION_ALPHA * (seconds - mean)
  end
  redis.call('HSET', sk, 'dm', mean)
  redis.call('HINCRBY', sk, 'dn', 1)
end

local function rate_per_min(p, tenant, now)
  local index = math.floor(now / RATE_WIDTH_MS)
  local fields = {}
  for slot = 0, RATE_BUCKETS - 1 do
    fields[#fields + 1] = 's' .. slot
    fields[#fields + 1] = 'c' .. slot
  end
  local v = redis.call('HMGET', sig_key(p, tenant), unpack(fields))
  local total = 0
  for slot = 0, RATE_BUCKETS - 1 do
    local stamp = tonumber(v[2 * slot + 1])
    if stamp and index - RATE_BUCKETS < stamp and stamp <= index then
      total = total + (tonumber(v[2 * slot + 2]) or 0)
    end
  end
  local span = (RATE_BUCKETS - 1) * RATE_WIDTH_MS + now % RATE_WIDTH_MS + 1
  return total * 60000 / span
end

-- The tenant's limit now, or nil when it has no concurrency settings. `target` is the
-- lane's cached capacity, `load` its slots in flight and waiting.
local function tenant_limit(keys, p, tenant, target, load, now)
  local spec = redis.call('HGET', keys[TLIMITS], tenant)
  if not spec then
    return nil
  end
  local floor, max, burst_floor, burst_pct = string.match(spec, '^(%d+),(-?%d+),(%d+),([%d.e+-]+)$')
  floor, max, burst_floor, burst_pct = tonumber(floor), tonumber(max), tonumber(burst_floor),
    tonumber(burst_pct)
  if not (floor and max and burst_floor and burst_pct) then
    return nil -- settings that do not parse limit nothing: better than no dispatch at all
  end
  local mean = tonumber(redis.call('HGET', sig_key(p, tenant), 'dm')) or 0
  local base = math.max(floor, ceil_eps(rate_per_min(p, tenant, now) * mean / 60))
  local top = base + math.max(burst_floor, floor_eps(base * burst_pct))
  local factor = F_MAX
  if load > 0 then
    factor = math.min(F_MAX, math.max(F_MIN, target / load))
  end
  local limit = math.max(floor, floor_eps(top * factor))
  if max >= 0 then
    limit = math.min(limit, max)
  end
  return limit
end
