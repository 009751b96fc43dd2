#!lua name=__LIBRARY__
--[[
Fairlane's store: every state change of a job, each one atomic.

Keys. Every function receives the app's fixed keys first, in this order
(fairlane/store/keys.py, AppKeys.common):
  KEYS[1] fence    string  fencing-token counter
  KEYS[2] leases   zset    running job id -> lease expiry (server ms)
  KEYS[3] stats    hash    counters; also the 'seq' FIFO counter
  KEYS[4] idem     hash    idempotency key -> job id
  KEYS[5] dead     zset    dead-lettered job id -> time (ms)
  KEYS[6] workers  zset    worker id -> last heartbeat (ms)
  KEYS[7] tasks    hash    task name -> 'rc|rf' retention of its records
  KEYS[8] weights  hash    tenant -> fair-share weight (absent = 1)
  KEYS[9] fleet    hash    worker -> its slots and lanes ('slots|lane,lane')
  KEYS[10] tlimits hash    tenant -> concurrency settings 'floor,max,burst_floor,burst_pct'
  KEYS[11] thr     hash    throttle keys, grants and parked jobs (throttle.lua)
  KEYS[12] thrw    zset    throttle waiters, one lex range per key (throttle.lua)
followed by the keys of the lanes the caller names (state, cap, delayed, wake, idle
per lane). Per-job hashes (job:<id>), per-tenant queues (q:<lane>:<class>:<tenant>),
per-class fair queues (lane:<l>:c:<class>:fair|vt|granted), tenant signals
(sig:<tenant>), retention indexes (kept:<task>:<outcome>) and lane keys are derived
from the prefix of KEYS[1], so they always carry the same hash tag (same cluster slot).

Time is always the server's (TIME), never a client's.

Job status: queued, throttled, scheduled, running, completed, failed, cancelled,
expired. A job id is in exactly one of: a tenant queue or its class's granted set
(queued), a throttle waiter queue (throttled), a lane's delayed set (scheduled), the
leases set (running), or none (finished).
--]]

local FENCE, LEASES, STATS, IDEM, DEAD, WORKERS, TASKS, WEIGHTS = 1, 2, 3, 4, 5, 6, 7, 8
local FLEET, TLIMITS, THR, THRW = 9, 10, 11, 12
local TERMINAL = {completed = true, failed = true, cancelled = true, expired = true}
-- priorities are clamped to +-PRIO_LIMIT so that prio * 2^40 + seq stays exact in a double
local PRIO_SPAN = 1099511627776
local DEFAULT_CLASS = 'standard'

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function prefix(keys)
  return string.sub(keys[FENCE], 1, -6)
end

local function lane_key(p, lane, what)
  return p .. 'lane:' .. lane .. ':' .. what
end

local function job_key(p, id)
  return p .. 'job:' .. id
end

local function order_score(prio, seq)
  return -tonumber(prio) * PRIO_SPAN + tonumber(seq)
end

local function wake(p, lane)
  local wk = lane_key(p, lane, 'wake')
  if redis.call('LLEN', wk) == 0 then
    redis.call('LPUSH', wk, '1')
  end
end

-- @include classes.lua
-- @include throttle.lua

-- Per-class keys of a lane: `fair` (active tenant -> start tag), `vt` (V, in-flight
-- `run`, idle tenants' finish tags `f:<tenant>`), `granted` (jobs a throttle handed a
-- slot to, by grant token: they start before the fair queue's head).
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
end

-- Put a job in its tenant's queue; the tenant becomes active if it had no work. The
-- class's waiting demand `d:<class>` grows by the job's slots. With `batch` (an
-- enqueue's pushes) the demand is added up and written by `flush_pushes`, and a queue
-- already pushed to is known to be active.
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
  redis.call('ZADD', q, order_score(prio, seq), id)
  if batch then
    batch.d[cls] = (batch.d[cls] or 0) + (tonumber(slots) or 1)
  else
    redis.call('HINCRBY', lane_key(p, lane, 'state'), 'd:' .. cls, tonumber(slots) or 1)
  end
end

local function flush_pushes(p, lane, batch)
  for cls, n in pairs(batch.d) do
    redis.call('HINCRBY', lane_key(p, lane, 'state'), 'd:' .. cls, n)
  end
  batch.d = {}
end

-- A tenant whose queue emptied leaves the active set; its tag is kept as its finish tag.
local function deactivate(p, lane, cls, tenant, tag)
  redis.call('ZREM', class_key(p, lane, cls, 'fair'), tenant)
  redis.call('HSET', class_key(p, lane, cls, 'vt'), 'f:' .. tenant, tag)
end

-- Whether any class of a lane has work waiting for a slot.
local function lane_waiting(p, lane)
  local sk = lane_key(p, lane, 'state')
  local fields = {}
  for i, c in ipairs(class_table(sk)) do
    fields[i] = 'd:' .. c[1]
  end
  for _, v in ipairs(redis.call('HMGET', sk, unpack(fields))) do
    if (tonumber(v) or 0) > 0 then
      return true
    end
  end
  return false
end

-- A running attempt of a job ended: the class's in-flight slots and work shrink.
local function settle_running(p, lane, cls, slots, jobs)
  redis.call('HINCRBY', class_key(p, lane, cls, 'vt'), 'run', -(jobs or 1))
  redis.call('HINCRBY', lane_key(p, lane, 'state'), 'f:' .. cls, -(tonumber(slots) or 1))
end

-- Settlements of one ack batch, added up per lane and class and written at once.
local function add_settled(settled, lane, cls, slots)
  local key = lane .. '\0' .. cls
  local e = settled[key]
  if not e then
    e = {lane, cls, 0, 0}
    settled[key] = e
  end
  e[3], e[4] = e[3] + 1, e[4] + (tonumber(slots) or 1)
end

local function flush_settled(p, settled)
  for key, e in pairs(settled) do
    settle_running(p, e[1], e[2], e[4], e[3])
    settled[key] = nil
  end
end

-- A throttle handed job `id` the slots of grant `token`: it waits at the front of its
-- class (in the granted set) for a worker slot.
local function enter_granted(p, id, token)
  local jk = job_key(p, id)
  local f = redis.call('HMGET', jk, 'lane', 'cls', 'sl')
  redis.call('HSET', jk, 'st', 'queued', 'ttok', token)
  redis.call('ZADD', class_key(p, f[1], f[2], 'granted'), token, id)
  local sk = lane_key(p, f[1], 'state')
  redis.call('HINCRBY', sk, 'd:' .. f[2], tonumber(f[3]) or 1)
  redis.call('HINCRBY', sk, 'g:' .. f[2], 1)
  wake(p, f[1])
end

local function enter_all_granted(p, handoffs)
  for _, h in ipairs(handoffs) do
    enter_granted(p, h[1], h[2])
  end
  return #handoffs > 0
end

-- Release a job's throttle grant, if it holds one, and pass the slots on.
local function release_throttle(keys, p, id, token)
  if token then
    redis.call('HDEL', job_key(p, id), 'ttok')
    enter_all_granted(p, thr_release(keys, id, token))
  end
end

local function split2(spec)
  local a, b = string.match(spec, '^(-?%d+),(-?%d+)$')
  return tonumber(a), tonumber(b)
end

local function remove_record(keys, p, id, failed)
  local jk = job_key(p, id)
  local idem = redis.call('HGET', jk, 'idem')
  if idem and redis.call('HGET', keys[IDEM], idem) == id then
    redis.call('HDEL', keys[IDEM], idem)
  end
  if failed then
    redis.call('ZREM', keys[DEAD], id)
  end
  redis.call('DEL', jk)
end

-- Bounded trim of one retention index: at most `budget` records per call, so the
-- cost per finished job stays constant and the index still converges to its bounds.
local function trim(keys, p, idx, spec, now, budget)
  local count, age = split2(spec)
  local failed = string.sub(idx, -7) == ':failed'
  if count and count >= 0 then
    local over = redis.call('ZCARD', idx) - count
    if over > 0 then
      local popped = redis.call('ZPOPMIN', idx, math.min(over, budget))
      for i = 1, #popped, 2 do
        remove_record(keys, p, popped[i], failed)
      end
    end
  end
  if age and age >= 0 then
    local old = redis.call('ZRANGE', idx, '-inf', now - age, 'BYSCORE', 'LIMIT', 0, budget)
    for _, oid in ipairs(old) do
      redis.call('ZREM', idx, oid)
      remove_record(keys, p, oid, failed)
    end
  end
end

-- Effects gathered during one call and written once at its end, so that a batch
-- costs one command per effect instead of one per job: counters, and finished jobs
-- to add to each retention index.
local function new_effects()
  return {counts = {}, kept = {}}
end

local function count(fx, name, n)
  fx.counts[name] = (fx.counts[name] or 0) + (n or 1)
end

local function keep(fx, idx, spec, id)
  local k = fx.kept[idx]
  if not k then
    k = {spec = spec or '-1,-1', ids = {}}
    fx.kept[idx] = k
  end
  k.ids[#k.ids + 1] = id
end

local function apply_effects(keys, p, fx, now)
  for name, n in pairs(fx.counts) do
    redis.call('HINCRBY', keys[STATS], name, n)
  end
  for idx, k in pairs(fx.kept) do
    local zargs = {}
    for i, id in ipairs(k.ids) do
      zargs[2 * i - 1] = now
      zargs[2 * i] = id
    end
    redis.call('ZADD', idx, unpack(zargs))
    -- trims at most a few more records than it adds, so a steady flow stays bounded
    trim(keys, p, idx, k.spec, now, #k.ids + 10)
  end
end

-- Settle a job for good. `meta` holds its task, rc, rf and w fields when the caller
-- already read them (the hot path); otherwise they are read here.
local function finish(keys, p, id, status, field, payload, now, tally, meta)
  local jk = job_key(p, id)
  if field then
    redis.call('HSET', jk, 'st', status, 'fin', now, field, payload)
  else
    redis.call('HSET', jk, 'st', status, 'fin', now)
  end
  count(tally, status)
  meta = meta or redis.call('HMGET', jk, 'task', 'rc', 'rf', 'w')
  local task = meta[1] or '' -- a corrupt record without a task name must still settle
  if status == 'completed' then
    keep(tally, p .. 'kept:' .. task .. ':ok', meta[2], id)
  else
    keep(tally, p .. 'kept:' .. task .. ':failed', meta[3], id)
  end
  if meta[4] then
    redis.call('PUBLISH', p .. 'done', id)
  end
end

local function dead_letter(keys, p, id, err, now, tally, meta)
  redis.call('ZADD', keys[DEAD], now, id)
  finish(keys, p, id, 'failed', 'err', err, now, tally, meta)
end

local function expire(keys, p, id, reason, now, tally, meta)
  finish(keys, p, id, 'expired', 'err', reason, now, tally, meta)
end

local EXPIRED_ERR = '{"type":"DeadlineExceeded","message":"the deadline passed before the job could run","traceback":""}'

-- Schedule a retry `delay` ms from now, unless that is past the job's deadline.
local function schedule_retry(keys, p, id, delay, err, now, tally)
  local jk = job_key(p, id)
  local f = redis.call('HMGET', jk, 'dl', 'lane')
  local run_at = now + delay
  if f[1] and run_at > tonumber(f[1]) then
    redis.call('HSET', jk, 'err', err)
    expire(keys, p, id, EXPIRED_ERR, now, tally)
    return 'expired'
  end
  redis.call('HSET', jk, 'st', 'scheduled', 'run', run_at, 'err', err)
  redis.call('ZADD', lane_key(p, f[2], 'delayed'), run_at, id)
  count(tally, 'retried')
  -- the retry may be due sooner than a blocked worker's timeout: wake one to re-read it
  wake(p, f[2])
  return 'scheduled'
end

-- The backoff of fairlane/policy/backoff.py: min(cap, base * 2^(n-1)) with jitter u in [0,1).
local function backoff_ms(spec, attempt, u)
  local base, cap, jitter = string.match(spec or '', '^([^,]+),([^,]+),(%a+)$')
  if not base then
    return 0
  end
  local raw = math.min(tonumber(cap), tonumber(base) * 2 ^ math.min(math.max(attempt, 1) - 1, 62))
  local d = raw
  if jitter == 'full' then
    d = raw * u
  elseif jitter == 'equal' then
    d = raw / 2 + raw / 2 * u
  end
  return math.floor(d * 1000)
end

---------------------------------------------------------------------------- ack

-- Apply a batch of outcomes, each fenced by its lease token. `acks` is an array of
-- [id, token, kind (ok | retry | dead | cancel | release), payload, delay_ms].
-- Returns one code per entry: 1 applied, 0 rejected as stale (counted in stats 'fenced').
local function apply_acks(keys, p, acks, now, tally)
  local codes, released, freed, limited, settled = {}, {}, {}, {}, {}
  for i, a in ipairs(acks) do
    local id, kind, payload = a[1], a[3], a[4]
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'tok', 'task', 'rc', 'rf', 'w', 'att', 'max', 'lane',
      'cls', 'sl', 'ttok', 'tenant', 'start')
    if f[1] ~= 'running' or f[2] ~= a[2] then
      count(tally, 'fenced')
      codes[i] = 0
    else
      -- the status leaves 'running' below, which alone fences any later write of this token
      released[#released + 1] = id
      add_settled(settled, f[9], f[10] or DEFAULT_CLASS, f[11])
      freed[f[9]] = true
      release_throttle(keys, p, id, f[12])
      local tenant = f[13] or ''
      if limited[tenant] == nil then
        limited[tenant] = redis.call('HEXISTS', keys[TLIMITS], tenant) == 1
      end
      if kind ~= 'release' and limited[tenant] then
        note_duration(p, f[13], math.max(0, now - (tonumber(f[14]) or now)) / 1000)
      end
      local meta = {f[3], f[4], f[5], f[6]}
      if kind == 'ok' then
        finish(keys, p, id, 'completed', 'res', payload, now, tally, meta)
      elseif kind == 'retry' and (tonumber(f[7]) or 0) >= (tonumber(f[8]) or 1) then
        -- the store holds the attempt budget itself: a retry past it is a dead letter
        dead_letter(keys, p, id, payload, now, tally, meta)
      elseif kind == 'retry' then
        schedule_retry(keys, p, id, tonumber(a[5]), payload, now, tally)
      elseif kind == 'dead' then
        dead_letter(keys, p, id, payload, now, tally, meta)
      elseif kind == 'cancel' then
        finish(keys, p, id, 'cancelled', 'err', payload, now, tally, meta)
      else -- release: handed back unstarted by a stopping worker; the attempt is not counted
        local r = redis.call('HMGET', jk, 'lane', 'tenant', 'prio', 'seq')
        -- written first, so that the job handed back sees the lane's true load
        flush_settled(p, settled)
        redis.call('HINCRBY', jk, 'att', -1)
        redis.call('HSET', jk, 'st', 'queued')
        push_ready(p, r[1], f[10], r[2], id, r[3], r[4], f[11])
        wake(p, r[1])
      end
      codes[i] = 1
    end
  end
  -- dropped before anything is fetched, so a job settled and leased again in one
  -- exchange keeps its new lease
  flush_settled(p, settled)
  if #released > 0 then
    redis.call('ZREM', keys[LEASES], unpack(released))
  end
  -- freed slots may let a class start that the rules held back: wake a worker to look
  for lane in pairs(freed) do
    if lane_waiting(p, lane) then
      wake(p, lane)
    end
  end
  return codes
end

---------------------------------------------------------------------------- fetch

local function promote_due(keys, p, lane, now, limit)
  local dk = lane_key(p, lane, 'delayed')
  local due = redis.call('ZRANGE', dk, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', dk, id)
    local f = redis.call('HMGET', job_key(p, id), 'st', 'tenant', 'prio', 'seq', 'cls', 'sl')
    if f[1] == 'scheduled' then
      redis.call('HSET', job_key(p, id), 'st', 'queued')
      push_ready(p, lane, f[5], f[2], id, f[3], f[4], f[6])
    end
  end
end

local MALFORMED_ERR = '{"type":"MalformedJob","message":"the stored job record is incomplete or corrupt; it was not executed","traceback":""}'

-- Well-formed multi-byte UTF-8 sequences (no overlongs, no surrogates, <= U+10FFFF).
local UTF8_SEQS = {
  '[\194-\223][\128-\191]',
  '\224[\160-\191][\128-\191]', '[\225-\236][\128-\191][\128-\191]',
  '\237[\128-\159][\128-\191]', '[\238-\239][\128-\191][\128-\191]',
  '\240[\144-\191][\128-\191][\128-\191]',
  '[\241-\243][\128-\191][\128-\191][\128-\191]',
  '\244[\128-\143][\128-\191][\128-\191]',
}

-- Whether `s` is valid UTF-8: the worker decodes a fetched job's text fields strictly,
-- so one corrupt byte would fail the decoding of its whole batch. Fast for ASCII.
local function utf8_ok(s)
  if not s or not string.find(s, '[\128-\255]') then
    return true
  end
  for _, seq in ipairs(UTF8_SEQS) do
    s = string.gsub(s, seq, '.') -- an ASCII stand-in, so that leftovers cannot join up
  end
  return not string.find(s, '[\128-\255]')
end

-- Lease popped jobs ({id, fields, lane} as `runnable` returns them) to `worker`: one
-- fencing token each, the attempt counted, one ZADD for all the leases; the classes'
-- in-flight work grows (their in-flight slots grew when the jobs were taken). Returns the rows a worker receives: [id, token,
-- attempt, task, args, timeout, deadline, tenant, max, backoff, enqueued, slots].
local function lease_jobs(keys, p, popped, worker, lease, now)
  local jobs = {}
  if #popped == 0 then
    return jobs
  end
  local tok = redis.call('INCRBY', keys[FENCE], #popped) - #popped
  local zargs, running = {}, {}
  for i, e in ipairs(popped) do
    local id, f, lane = e[1], e[2], e[3]
    local cls = f[12] or DEFAULT_CLASS
    local rk = lane .. '\0' .. cls
    local r = running[rk]
    if not r then
      r = {lane, cls, 0}
      running[rk] = r
    end
    r[3] = r[3] + 1
    tok = tok + 1
    local att = (tonumber(f[10]) or 0) + 1
    redis.call('HSET', job_key(p, id), 'st', 'running', 'tok', tok, 'att', att, 'wk', worker,
      'start', now)
    zargs[2 * i - 1] = now + lease
    zargs[2 * i] = id
    jobs[i] = {id, tostring(tok), att, f[2], f[3], tonumber(f[6]) or 0,
      tonumber(f[5]) or 0, f[7] or '', tonumber(f[4]), f[8] or '', tonumber(f[9]) or 0, tonumber(f[11]) or 1}
  end
  redis.call('ZADD', keys[LEASES], unpack(zargs))
  for _, r in pairs(running) do
    redis.call('HINCRBY', class_key(p, r[1], r[2], 'vt'), 'run', r[3])
  end
  return jobs
end

-- Idle workers. A worker about to block registers in its lanes' `idle` sets (member
-- 'worker|lease_ms', score = when the registration lapses). An enqueue that finds one
-- leases it a job on the spot and pushes the job into the worker's inbox, which the
-- worker is blocked on: the job starts after one hop instead of a wake-up and a fetch.
-- Jobs in an inbox are leased, so a worker that died meanwhile loses nothing: the
-- lease expires and the job is reclaimed. Its next exchange drains its inbox.
local function inbox_key(p, worker)
  return p .. 'inbox:' .. worker
end

local function peek_idle_worker(p, lane, now)
  local idle = lane_key(p, lane, 'idle')
  redis.call('ZREMRANGEBYSCORE', idle, '-inf', now)
  local found = redis.call('ZRANGE', idle, 0, 0)[1]
  if not found then
    return nil
  end
  local worker, lease = string.match(found, '^(.*)|(%d+)$')
  return found, worker, tonumber(lease)
end

local function hand_off(keys, p, worker, lease, popped, now)
  local rows = lease_jobs(keys, p, popped, worker, lease, now)
  local inbox = inbox_key(p, worker)
  for _, row in ipairs(rows) do
    redis.call('RPUSH', inbox, cmsgpack.pack(row))
  end
  redis.call('PEXPIRE', inbox, lease)
end

-- Check a job popped from a tenant queue or a granted set. Returns its fields (st,
-- task, args, max, dl, to, tenant, bo, enq, att, sl, cls, lim, prio, seq, ttok) when it
-- can run; settles it (and frees any throttle grant it held) and returns nil when it
-- cannot (expired, malformed, or a stale entry).
local function runnable(keys, p, id, now, tally)
  local f = redis.call('HMGET', job_key(p, id), 'st', 'task', 'args', 'max', 'dl', 'to', 'tenant',
    'bo', 'enq', 'att', 'sl', 'cls', 'lim', 'prio', 'seq', 'ttok')
  if f[1] == 'queued' then
    if not f[2] or not f[3] or not tonumber(f[4]) or not f[7]
      or not (utf8_ok(f[2]) and utf8_ok(f[3]) and utf8_ok(f[7]) and utf8_ok(f[8])) then
      count(tally, 'malformed')
      release_throttle(keys, p, id, f[16])
      dead_letter(keys, p, id, MALFORMED_ERR, now, tally)
    elseif f[5] and tonumber(f[5]) < now then
      release_throttle(keys, p, id, f[16])
      expire(keys, p, id, EXPIRED_ERR, now, tally)
    else
      return f
    end
  elseif not f[1] then
    count(tally, 'missing')
  end
  return nil
end

-- One dispatch's view of a lane: what it read once (class table, capacity, weights,
-- tenant settings, virtual times) and what it changed but has not written yet (the
-- classes' in-flight, waiting and granted slots as deltas, V), so that a job costs a
-- few commands instead of one per fact. `flush` writes the deltas.
local function new_dispatch(keys, p, lane, budget, now, tally)
  local sk = lane_key(p, lane, 'state')
  local cx = {keys = keys, p = p, lane = lane, now = now, tally = tally, sk = sk,
    tbl = class_table(sk), weights = {}, tlimits = {}, vt = {}, delta = {}, runs = {},
    f = {}, d = {}, g = {}, heads = {}, w = {}, cap = 0, batch = math.min(budget, 100)}
  cx.fields = {'C'}
  for i, c in ipairs(cx.tbl) do
    local n = #cx.fields
    cx.fields[n + 1], cx.fields[n + 2], cx.fields[n + 3] = 'f:' .. c[1], 'd:' .. c[1], 'g:' .. c[1]
  end
  return cx
end

local function bump(cx, field, n)
  cx.delta[field] = (cx.delta[field] or 0) + n
end

-- A run: the tenant a class took its last job from, the ids next in its queue (read
-- in one call), the ids taken but not yet removed, and -- while it is the class's only
-- active tenant -- its start tag, kept here until the run ends.
local function flush_run(cx, cls)
  local run = cx.runs[cls]
  if not run then
    return
  end
  if #run.taken > 0 then
    redis.call('ZREM', tenant_queue(cx.p, cx.lane, cls, run.tenant), unpack(run.taken))
    run.taken = {}
  end
  if run.tag_dirty then
    redis.call('ZADD', class_key(cx.p, cx.lane, cls, 'fair'), run.tag, run.tenant)
    run.tag_dirty = false
  end
end

local function read_run(cx, cls, run)
  run.ids = redis.call('ZRANGE', tenant_queue(cx.p, cx.lane, cls, run.tenant), 0, cx.batch - 1)
  run.pos = 1
end

local function flush_dispatch(cx)
  for cls in pairs(cx.runs) do
    flush_run(cx, cls)
  end
  for field, n in pairs(cx.delta) do
    if n ~= 0 then
      redis.call('HINCRBY', cx.sk, field, n)
    end
  end
  cx.delta = {}
  for cls, v in pairs(cx.vt) do
    if v.dirty then
      redis.call('HSET', class_key(cx.p, cx.lane, cls, 'vt'), 'V', v.value)
      v.dirty = false
    end
  end
end

local function weight_of(cx, tenant)
  local wt = cx.weights[tenant]
  if not wt then
    wt = tonumber(redis.call('HGET', cx.keys[WEIGHTS], tenant)) or 1
    cx.weights[tenant] = wt
  end
  return wt
end

-- The head job of class i: the oldest grant, else the queue head of the active tenant
-- with the smallest start tag. Returns {kind ('g' | 'q'), id, width, tenant, tag}, or
-- false when the class has nothing waiting.
local function class_head(cx, i)
  local p, lane, cls = cx.p, cx.lane, cx.tbl[i][1]
  if cx.g[i] > 0 then
    local g = redis.call('ZRANGE', class_key(p, lane, cls, 'granted'), 0, 0)[1]
    if g then
      return {'g', g, tonumber(redis.call('HGET', job_key(p, g), 'sl')) or 1}
    end
  end
  local run = cx.runs[cls]
  local tenant, tag, id
  if run and run.sole then
    tenant, tag, id = run.tenant, run.tag, run.ids[run.pos]
  else
    local head = redis.call('ZRANGE', class_key(p, lane, cls, 'fair'), 0, 0, 'WITHSCORES')
    if not head[1] then
      return false
    end
    tenant, tag = head[1], tonumber(head[2])
    if run and run.tenant == tenant then
      id = run.ids[run.pos]
    else
      id = redis.call('ZRANGE', tenant_queue(p, lane, cls, tenant), 0, 0)[1]
    end
  end
  local width = id and tonumber(redis.call('HGET', job_key(p, id), 'sl')) or 1
  return {'q', id, width, tenant, tag}
end

local function load_state(cx)
  flush_dispatch(cx)
  cx.runs = {}
  local v = redis.call('HMGET', cx.sk, unpack(cx.fields))
  cx.cap = tonumber(v[1]) or 0
  if not cx.levels or cx.levels.cap ~= cx.cap then
    cx.levels = class_levels(cx.tbl, cx.cap)
  end
  for i = 1, #cx.tbl do
    cx.f[i] = math.max(0, tonumber(v[3 * i - 1]) or 0)
    cx.d[i] = math.max(0, tonumber(v[3 * i]) or 0)
    cx.g[i] = math.max(0, tonumber(v[3 * i + 1]) or 0)
  end
  for i = 1, #cx.tbl do
    cx.heads[i] = class_head(cx, i)
    cx.w[i] = cx.heads[i] and cx.heads[i][3] or nil
  end
end

-- Take a class's fair head: take the tenant's head job, move V up to the tenant's tag,
-- and charge the tenant one work unit over its weight (1 per job until estimates
-- exist); a tenant left with no waiting job becomes idle. Returns the job's id and
-- fields (nil fields when it cannot run).
local function take_fair_head(cx, cls, h)
  local p, lane, tenant, tag = cx.p, cx.lane, h[4], h[5]
  local run = cx.runs[cls]
  if not run or run.tenant ~= tenant then
    flush_run(cx, cls)
    run = {tenant = tenant, taken = {},
      sole = redis.call('ZCARD', class_key(p, lane, cls, 'fair')) == 1}
    read_run(cx, cls, run)
    cx.runs[cls] = run
  end
  local id = run.ids[run.pos]
  local f
  if id then
    run.pos = run.pos + 1
    run.taken[#run.taken + 1] = id
    f = runnable(cx.keys, p, id, cx.now, cx.tally)
  end
  if f then
    local v = cx.vt[cls]
    if not v then
      v = {value = tonumber(redis.call('HGET', class_key(p, lane, cls, 'vt'), 'V')) or 0}
      cx.vt[cls] = v
    end
    if tag > v.value then
      v.value, v.dirty = tag, true
    end
    tag = tag + 1 / weight_of(cx, tenant)
  end
  if not run.ids[run.pos] then
    flush_run(cx, cls)
    read_run(cx, cls, run)
  end
  run.tag = tag
  if run.ids[run.pos] then
    if run.sole then
      run.tag_dirty = true
    else
      redis.call('ZADD', class_key(p, lane, cls, 'fair'), tag, tenant)
    end
  else
    deactivate(p, lane, cls, tenant, tag)
    cx.runs[cls] = nil
  end
  return id, f
end

-- The pressure on a lane, for tenant ceilings: slots running, and slots waiting in
-- non-batch classes (batch work waits for spare slots and presses on nobody).
local function lane_load(levels, f, d)
  local load = 0
  for i = 1, levels.n do
    load = load + f[i]
    if not levels.batch[i] then
      load = load + d[i]
    end
  end
  return load
end

-- The throttle keys of a job ({{key, limit}, ..} sorted): its own `limits`, and its
-- tenant's key when the tenant has concurrency settings.
local function job_limits(cx, f)
  local limits = {}
  if f[13] then
    limits = cmsgpack.unpack(f[13])
  end
  local tenant = f[7]
  local configured = cx.tlimits[tenant]
  if configured == nil then
    configured = redis.call('HEXISTS', cx.keys[TLIMITS], tenant) == 1
    cx.tlimits[tenant] = configured
  end
  if configured then
    local load = lane_load(cx.levels, cx.f, cx.d)
    local own = tenant_limit(cx.keys, cx.p, tenant, cx.cap, load, cx.now)
    limits[#limits + 1] = {'tenant:' .. tenant, own}
    table.sort(limits, function(x, y) return x[1] < y[1] end)
  end
  return limits
end

-- Pass a job popped from the fair queue through its throttle keys. Returns whether it
-- was admitted, and whether waiters were handed slots on the way (the lane's state
-- must then be read again).
local function admit(cx, id, f)
  local limits = job_limits(cx, f)
  if #limits == 0 then
    return true, false
  end
  local token, handoffs = thr_acquire(cx.keys, id, limits, f[14] or 0, f[15] or 0)
  local moved = #handoffs > 0
  if moved then
    flush_dispatch(cx)
    enter_all_granted(cx.p, handoffs)
  end
  if token then
    redis.call('HSET', job_key(cx.p, id), 'ttok', token)
    return true, moved
  end
  redis.call('HSET', job_key(cx.p, id), 'st', 'throttled')
  count(cx.tally, 'throttled')
  return false, moved
end

-- Dispatch up to `budget` slots of a lane's work to a worker. Each step asks the
-- class rules (classes.lua) which class's head job may start given the lane's cached
-- capacity C, its classes' in-flight and waiting slots; a head wider than what is
-- left of the budget ends the step (nothing in a class overtakes its head). A job
-- popped from the fair queue then passes its throttle keys: it is admitted, or it
-- parks (status 'throttled', holding nothing) and the next head is tried.
-- Appends {id, fields, lane} to `popped`. Returns the slots given and whether the
-- lane stopped for want of budget (so it might give more).
local function dispatch_lane(keys, p, lane, budget, now, tally, popped)
  local cx = new_dispatch(keys, p, lane, budget, now, tally)
  load_state(cx)
  local given = 0
  while true do
    local x = choose_class(cx.levels, cx.f, cx.w, cx.d)
    local h = x and cx.heads[x]
    if not h or h[3] > budget - given then
      flush_dispatch(cx)
      return given, h and true or false
    end
    local cls = cx.tbl[x][1]
    bump(cx, 'd:' .. cls, -h[3])
    cx.d[x] = math.max(0, cx.d[x] - h[3])
    local id, jf, dirty = h[2], nil, false
    if h[1] == 'g' then
      redis.call('ZREM', class_key(p, lane, cls, 'granted'), id)
      bump(cx, 'g:' .. cls, -1)
      cx.g[x] = cx.g[x] - 1
      jf = runnable(keys, p, id, now, tally)
      -- a grant that cannot run passed its slots on, maybe into this lane
      dirty = not jf
    else
      id, jf = take_fair_head(cx, cls, h)
      if jf then
        local admitted
        admitted, dirty = admit(cx, id, jf)
        if not admitted then
          jf = nil
        end
      end
    end
    if jf then
      popped[#popped + 1] = {id, jf, lane}
      given = given + h[3]
      cx.f[x] = cx.f[x] + h[3]
      bump(cx, 'f:' .. cls, h[3])
    end
    if dirty then
      load_state(cx)
    else
      cx.heads[x] = class_head(cx, x)
      cx.w[x] = cx.heads[x] and cx.heads[x][3] or nil
    end
  end
end

-- Lease up to `n` slots of work from `lanes` (taken in turn) to `worker`. Returns the
-- jobs, each [id, token, attempt, task, args, timeout, deadline, tenant, max, backoff,
-- enqueued, slots], and the ms until the lanes' next scheduled job (-1 when none).
local function fetch(keys, p, worker, n, lease, promote_limit, lanes, now, tally)
  for _, lane in ipairs(lanes) do
    promote_due(keys, p, lane, now, promote_limit)
  end
  -- lanes are served in turn, each round asking for an even share of what is left
  local popped, live, given, busy = {}, {}, 0, {}
  for i, lane in ipairs(lanes) do
    live[i] = lane
  end
  while given < n and #live > 0 do
    local still = {}
    for _, lane in ipairs(live) do
      local want = math.ceil((n - given) / #live)
      if want > 0 then
        local got, more = dispatch_lane(keys, p, lane, want, now, tally, popped)
        given = given + got
        busy[lane] = more
        if more and got > 0 then
          still[#still + 1] = lane
        end
      end
    end
    live = still
  end
  local jobs = lease_jobs(keys, p, popped, worker, lease, now)
  local next_due = -1
  for _, lane in ipairs(lanes) do
    if busy[lane] then
      -- work may be left that another worker could take
      wake(p, lane)
    end
    local head = redis.call('ZRANGE', lane_key(p, lane, 'delayed'), 0, 0, 'WITHSCORES')
    if head[2] then
      local due = math.max(0, tonumber(head[2]) - now)
      if next_due < 0 or due < next_due then
        next_due = due
      end
    end
  end
  return jobs, next_due
end

---------------------------------------------------------------------------- enqueue

-- ARGV: lane, msgpack array of jobs, each
--   [id, tenant, prio, task, args, max, bo, to, rc, rf, idem, delay_ms, at_ms, deadline,
--    class, slots, limits]
-- with nil for an absent delay/at, '' for an absent idem/deadline; a deadline is '+ms'
-- (relative) or absolute ms; limits is {{key, limit}, ..} sorted by key.
-- Returns a flat list: id, code per job (1 created, 0 existing via idempotency key,
-- -1 deadline already past, -2 class unknown in the lane: nothing written).
local function enqueue(keys, args)
  local p, now = prefix(keys), now_ms()
  local lane = args[1]
  local jobs = cmsgpack.unpack(args[2])
  local out, tally = {}, new_effects()
  local tbl = class_table(lane_key(p, lane, 'state'))
  local ready, submitted, pushes = false, {}, {active = {}, d = {}}
  -- one counter update reserves FIFO numbers for the whole batch (unused ones leave gaps)
  local seq = redis.call('HINCRBY', keys[STATS], 'seq', #jobs) - #jobs
  for _, j in ipairs(jobs) do
    seq = seq + 1
    local id, tenant, prio, idem = j[1], j[2], j[3], j[11]
    local cls, slots = j[15] or DEFAULT_CLASS, tonumber(j[16]) or 1
    local existing = idem ~= '' and redis.call('HGET', keys[IDEM], idem)
    if existing and redis.call('EXISTS', job_key(p, existing)) == 1 then
      out[#out + 1] = existing
      out[#out + 1] = 0
    elseif not class_index(tbl, cls) then
      out[#out + 1] = id
      out[#out + 1] = -2
    else
      local run_at = now
      if j[13] then
        run_at = tonumber(j[13])
      elseif j[12] then
        run_at = now + tonumber(j[12])
      end
      local dl = j[14]
      if string.sub(dl, 1, 1) == '+' then
        dl = now + tonumber(string.sub(dl, 2))
      elseif dl ~= '' then
        dl = tonumber(dl)
      end
      if dl ~= '' and (dl <= now or dl < run_at) then
        out[#out + 1] = id
        out[#out + 1] = -1
      else
        local jk = job_key(p, id)
        local st = run_at > now and 'scheduled' or 'queued'
        redis.call('HSET', jk, 'task', j[4], 'tenant', tenant, 'lane', lane, 'prio', prio,
          'args', j[5], 'max', j[6], 'bo', j[7], 'to', j[8], 'rc', j[9], 'rf', j[10],
          'enq', now, 'run', run_at, 'seq', seq, 'st', st, 'att', 0, 'cls', cls, 'sl', slots)
        if j[17] and #j[17] > 0 then
          redis.call('HSET', jk, 'lim', cmsgpack.pack(j[17]))
        end
        if dl ~= '' then
          redis.call('HSET', jk, 'dl', dl)
        end
        if idem ~= '' then
          redis.call('HSET', jk, 'idem', idem)
          redis.call('HSET', keys[IDEM], idem, id)
        end
        if st == 'scheduled' then
          redis.call('ZADD', lane_key(p, lane, 'delayed'), run_at, id)
        else
          push_ready(p, lane, cls, tenant, id, prio, seq, slots, pushes)
          ready = true
        end
        submitted[tenant] = (submitted[tenant] or 0) + 1
        out[#out + 1] = id
        out[#out + 1] = 1
      end
    end
  end
  flush_pushes(p, lane, pushes)
  for tenant, n in pairs(submitted) do
    if redis.call('HEXISTS', keys[TLIMITS], tenant) == 1 then
      note_submissions(p, tenant, n, now)
    end
  end
  if ready then
    -- a worker blocked on its inbox gets the lane's next job (one slot's worth) at once
    local member, worker, lease = peek_idle_worker(p, lane, now)
    if member then
      local popped = {}
      dispatch_lane(keys, p, lane, 1, now, tally, popped)
      if #popped > 0 then
        redis.call('ZREM', lane_key(p, lane, 'idle'), member)
        hand_off(keys, p, worker, lease, popped, now)
      end
    end
  end
  apply_effects(keys, p, tally, now)
  if #jobs > 0 then
    -- a scheduled job may be due sooner than a blocked worker's timeout: wake one either way
    wake(p, lane)
  end
  return out
end

-- Lane capacity: the live sum of its workers' slots. A worker is counted in each of its
-- lanes' `cap` hashes (worker -> slots) from its first exchange until it leaves or its
-- heartbeat goes stale; the sum is kept in the lane's `state` as C, so deciding never
-- reads the fleet.
local function register_worker(keys, p, worker, slots, lanes, now)
  redis.call('ZADD', keys[WORKERS], now, worker)
  local added = false
  for _, lane in ipairs(lanes) do
    if redis.call('HSETNX', lane_key(p, lane, 'cap'), worker, slots) == 1 then
      redis.call('HINCRBY', lane_key(p, lane, 'state'), 'C', slots)
      added = true
    end
  end
  if added then
    -- the fleet entry lists every lane the worker is counted in (those of earlier
    -- exchanges too), so that deregistering it uncounts it everywhere
    local entry = redis.call('HGET', keys[FLEET], worker)
    local known, all = {}, {}
    if entry then
      for lane in string.gmatch(string.match(entry, '|(.*)$'), '[^,]+') do
        known[lane] = true
        all[#all + 1] = lane
      end
    end
    for _, lane in ipairs(lanes) do
      if not known[lane] then
        known[lane] = true
        all[#all + 1] = lane
      end
    end
    redis.call('HSET', keys[FLEET], worker, slots .. '|' .. table.concat(all, ','))
  end
end

local function deregister_worker(keys, p, worker)
  local entry = redis.call('HGET', keys[FLEET], worker)
  redis.call('HDEL', keys[FLEET], worker)
  redis.call('ZREM', keys[WORKERS], worker)
  if not entry then
    return
  end
  for lane in string.gmatch(string.match(entry, '|(.*)$'), '[^,]+') do
    local slots = redis.call('HGET', lane_key(p, lane, 'cap'), worker)
    if slots then
      redis.call('HDEL', lane_key(p, lane, 'cap'), worker)
      redis.call('HINCRBY', lane_key(p, lane, 'state'), 'C', -tonumber(slots))
    end
  end
end

-- ARGV: msgpack [acks, worker, n, lease_ms, promote_limit, lanes, idle_ms, slots]. One
-- round trip settles a worker's finished attempts and leases it the next batch: first
-- what was handed to its inbox, then up to n more slots of work. `slots` is the
-- worker's whole size, counted in its lanes' capacity. With idle_ms > 0 and nothing to give,
-- the worker is registered idle for idle_ms (it is about to block on its inbox).
-- Returns msgpack [next_due_ms, ack codes, jobs].
local function exchange(keys, args)
  local p, now = prefix(keys), now_ms()
  local a = cmsgpack.unpack(args[1])
  local worker, n, lease, lanes, idle_ms = a[2], a[3], a[4], a[6], tonumber(a[7]) or 0
  local tally = new_effects()
  register_worker(keys, p, worker, tonumber(a[8]) or n, lanes, now)
  local codes = apply_acks(keys, p, a[1], now, tally)
  local member = worker .. '|' .. lease
  for _, lane in ipairs(lanes) do
    redis.call('ZREM', lane_key(p, lane, 'idle'), member)
  end
  local inbox = inbox_key(p, worker)
  local handed = redis.call('LRANGE', inbox, 0, -1)
  local jobs, next_due, left = {}, -1, n
  if #handed > 0 then
    redis.call('DEL', inbox)
  end
  for i = 1, #handed do
    handed[i] = cmsgpack.unpack(handed[i])
    left = left - (tonumber(handed[i][12]) or 1)
  end
  if left > 0 then
    jobs, next_due = fetch(keys, p, worker, left, lease, a[5], lanes, now, tally)
  end
  for i = #handed, 1, -1 do
    table.insert(jobs, 1, handed[i])
  end
  if #jobs == 0 and idle_ms > 0 then
    for _, lane in ipairs(lanes) do
      redis.call('ZADD', lane_key(p, lane, 'idle'), now + idle_ms, member)
    end
  end
  apply_effects(keys, p, tally, now)
  return cmsgpack.pack({next_due, codes, jobs})
end

-- ARGV: msgpack [worker, lease_ms, lanes]. A stopping worker leaves: it is no longer
-- idle nor alive, and the jobs handed to its inbox meanwhile are returned (still
-- leased to it) so that it can hand them back.
local function leave(keys, args)
  local p = prefix(keys)
  local a = cmsgpack.unpack(args[1])
  local worker, member = a[1], a[1] .. '|' .. a[2]
  for _, lane in ipairs(a[3]) do
    redis.call('ZREM', lane_key(p, lane, 'idle'), member)
  end
  deregister_worker(keys, p, worker)
  local inbox = inbox_key(p, worker)
  local handed = redis.call('LRANGE', inbox, 0, -1)
  redis.call('DEL', inbox)
  local jobs = {}
  for i, row in ipairs(handed) do
    jobs[i] = cmsgpack.unpack(row)
  end
  return cmsgpack.pack(jobs)
end

-- ARGV: msgpack array of acks. Returns the codes as a plain array.
local function ack(keys, args)
  local p, now, tally = prefix(keys), now_ms(), new_effects()
  local codes = apply_acks(keys, p, cmsgpack.unpack(args[1]), now, tally)
  apply_effects(keys, p, tally, now)
  return codes
end

---------------------------------------------------------------------------- leases

-- ARGV: worker, lease_ms, then pairs (id, token). Extends every lease still held
-- and records the worker's heartbeat. Returns {lost ids, ids whose cancellation was requested}.
local function renew(keys, args)
  local p, now = prefix(keys), now_ms()
  local worker, lease = args[1], tonumber(args[2])
  redis.call('ZADD', keys[WORKERS], now, worker)
  local lost, cancel = {}, {}
  for i = 3, #args, 2 do
    local id = args[i]
    local f = redis.call('HMGET', job_key(p, id), 'st', 'tok', 'cx')
    if f[1] == 'running' and f[2] == args[i + 1] then
      redis.call('ZADD', keys[LEASES], 'XX', now + lease, id)
      if f[3] then
        cancel[#cancel + 1] = id
      end
    else
      lost[#lost + 1] = id
    end
  end
  return {lost, cancel}
end

local LOST_ERR = '{"type":"LeaseExpired","message":"the lease expired: the worker running attempt %d was lost","traceback":""}'

-- ARGV: limit, random seed, stale_worker_ms. Reclaims up to `limit` expired leases:
-- each counts as an attempt; a job out of attempts is dead-lettered, others are
-- retried after their backoff. Also trims retention indexes by age.
-- Returns {reclaimed ids, dead-lettered ids}.
local function sweep(keys, args)
  local p, now = prefix(keys), now_ms()
  local limit = tonumber(args[1])
  math.randomseed(tonumber(args[2]))
  local expired = redis.call('ZRANGE', keys[LEASES], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local retried, dead, tally = {}, {}, new_effects()
  for _, id in ipairs(expired) do
    redis.call('ZREM', keys[LEASES], id)
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'att', 'max', 'bo', 'lane', 'cls', 'sl', 'ttok')
    if f[1] == 'running' then
      redis.call('HDEL', jk, 'tok', 'wk')
      settle_running(p, f[5], f[6] or DEFAULT_CLASS, f[7])
      release_throttle(keys, p, id, f[8])
      count(tally, 'reclaimed')
      local att = tonumber(f[2]) or 0
      local err = string.format(LOST_ERR, att)
      if att >= (tonumber(f[3]) or 1) then
        dead_letter(keys, p, id, err, now, tally)
        dead[#dead + 1] = id
      else
        schedule_retry(keys, p, id, backoff_ms(f[4], att, math.random()), err, now, tally)
        retried[#retried + 1] = id
      end
    end
  end
  apply_effects(keys, p, tally, now)
  local stale = redis.call('ZRANGE', keys[WORKERS], '-inf', now - tonumber(args[3]), 'BYSCORE',
    'LIMIT', 0, limit)
  for _, worker in ipairs(stale) do
    deregister_worker(keys, p, worker)
  end
  local specs = redis.call('HGETALL', keys[TASKS])
  for i = 1, #specs, 2 do
    local rc, rf = string.match(specs[i + 1], '^(.-)|(.*)$')
    trim(keys, p, p .. 'kept:' .. specs[i] .. ':ok', rc, now, 100)
    trim(keys, p, p .. 'kept:' .. specs[i] .. ':failed', rf, now, 100)
  end
  return {retried, dead}
end

---------------------------------------------------------------------------- queries and control

-- ARGV: task, 'rc|rf'. Records a task's retention so sweeps can trim its records by age.
local function declare_task(keys, args)
  redis.call('HSET', keys[TASKS], args[1], args[2])
  return 1
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
  return set_tenant_setting(keys[WEIGHTS], args[1], args[2])
end

-- ARGV: tenant, concurrency settings 'floor,max,burst_floor,burst_pct' ('' = none).
local function configure_limits(keys, args)
  return set_tenant_setting(keys[TLIMITS], args[1], args[2])
end

-- ARGV: lane, its class table as JSON (classes.lua). Applies from the next decision.
local function declare_lane(keys, args)
  cjson.decode(args[2])
  redis.call('HSET', lane_key(prefix(keys), args[1], 'state'), 'table', args[2])
  return 1
end

-- ARGV: lane, tenant. The tenant's concurrency limit now (-1: it has no settings), and
-- the signals it came from: {limit, rate per minute, mean duration, C, load}.
local function tenant_limit_now(keys, args)
  local p, now = prefix(keys), now_ms()
  local cx = new_dispatch(keys, p, args[1], 1, now, new_effects())
  load_state(cx)
  local cap, load = cx.cap, lane_load(cx.levels, cx.f, cx.d)
  local limit = tenant_limit(keys, p, args[2], cap, load, now) or -1
  local mean = tonumber(redis.call('HGET', sig_key(p, args[2]), 'dm')) or 0
  return {limit, tostring(rate_per_min(p, args[2], now)), tostring(mean), cap, load}
end

-- ARGV: id. Cancels a waiting job at once; a running one is asked to stop (its
-- worker learns on its next lease renewal). Returns the status after the call.
local function cancel(keys, args)
  local p, now = prefix(keys), now_ms()
  local id = args[1]
  local jk = job_key(p, id)
  local f = redis.call('HMGET', jk, 'st', 'lane', 'tenant', 'cls', 'sl', 'ttok')
  local st, cls = f[1], f[4] or DEFAULT_CLASS
  if not st then
    return 'missing'
  end
  if st == 'queued' and f[6] then
    if redis.call('ZREM', class_key(p, f[2], cls, 'granted'), id) == 1 then
      local sk = lane_key(p, f[2], 'state')
      redis.call('HINCRBY', sk, 'd:' .. cls, -(tonumber(f[5]) or 1))
      redis.call('HINCRBY', sk, 'g:' .. cls, -1)
    end
    release_throttle(keys, p, id, f[6])
  elseif st == 'queued' then
    local q = tenant_queue(p, f[2], cls, f[3])
    if redis.call('ZREM', q, id) == 1 then
      redis.call('HINCRBY', lane_key(p, f[2], 'state'), 'd:' .. cls, -(tonumber(f[5]) or 1))
    end
    if redis.call('ZCARD', q) == 0 then
      -- the tag stays as it was: cancelling and queueing again gains nothing
      local tag = redis.call('ZSCORE', class_key(p, f[2], cls, 'fair'), f[3])
      if tag then
        deactivate(p, f[2], cls, f[3], tag)
      end
    end
  elseif st == 'throttled' then
    thr_cancel_waiter(keys, id)
  elseif st == 'scheduled' then
    redis.call('ZREM', lane_key(p, f[2], 'delayed'), id)
  elseif st == 'running' then
    redis.call('HSET', jk, 'cx', '1')
    return 'cancelling'
  else
    return st
  end
  local tally = new_effects()
  finish(keys, p, id, 'cancelled', 'err',
    '{"type":"Cancelled","message":"the job was cancelled","traceback":""}', now, tally)
  apply_effects(keys, p, tally, now)
  return 'cancelled'
end

-- ARGV: id. Returns {status, result, error} for a finished job; for any other job it
-- sets the waiter flag (so its completion is published) and returns {status}.
local function watch(keys, args)
  local p = prefix(keys)
  local jk = job_key(p, args[1])
  local f = redis.call('HMGET', jk, 'st', 'res', 'err')
  if not f[1] then
    return {'missing'}
  end
  if TERMINAL[f[1]] then
    return {f[1], f[2] or '', f[3] or ''}
  end
  redis.call('HSET', jk, 'w', '1')
  return {f[1]}
end

-- ARGV: limit, ids... (none = the oldest `limit`). Sends dead-lettered jobs back to
-- their queues with a fresh attempt budget. Returns the ids re-driven.
local function redrive(keys, args)
  local p, now = prefix(keys), now_ms()
  local ids = {}
  for i = 2, #args do
    ids[#ids + 1] = args[i]
  end
  if #ids == 0 then
    ids = redis.call('ZRANGE', keys[DEAD], 0, tonumber(args[1]) - 1)
  end
  local done = {}
  for _, id in ipairs(ids) do
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'lane', 'tenant', 'prio', 'seq', 'task', 'cls', 'sl')
    if f[1] == 'failed' and redis.call('ZREM', keys[DEAD], id) == 1 then
      redis.call('ZREM', p .. 'kept:' .. (f[6] or '') .. ':failed', id)
      redis.call('HSET', jk, 'st', 'queued', 'att', 0, 'run', now)
      redis.call('HDEL', jk, 'fin', 'err', 'res')
      push_ready(p, f[2], f[7] or DEFAULT_CLASS, f[3], id, f[4], f[5], f[8])
      wake(p, f[2])
      done[#done + 1] = id
    end
  end
  return done
end

redis.register_function('__PREFIX__enqueue', enqueue)
redis.register_function('__PREFIX__exchange', exchange)
redis.register_function('__PREFIX__ack', ack)
redis.register_function('__PREFIX__leave', leave)
redis.register_function('__PREFIX__renew', renew)
redis.register_function('__PREFIX__sweep', sweep)
redis.register_function('__PREFIX__declare_task', declare_task)
redis.register_function('__PREFIX__cancel', cancel)
redis.register_function('__PREFIX__watch', watch)
redis.register_function('__PREFIX__redrive', redrive)
redis.register_function('__PREFIX__configure_tenant', configure_tenant)
redis.register_function('__PREFIX__configure_limits', configure_limits)
redis.register_function('__PREFIX__declare_lane', declare_lane)
redis.register_function('__PREFIX__tenant_limit_now', tenant_limit_now)
