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
followed by the keys of the lanes the caller names (fair, vt, delayed, wake, idle per
lane). Per-job hashes (job:<id>), per-tenant queues (q:<lane>:<tenant>),
retention indexes (kept:<task>:<outcome>) and lane keys are derived from the
prefix of KEYS[1], so they always carry the same hash tag (same cluster slot).

Time is always the server's (TIME), never a client's.

Job status: queued, scheduled, running, completed, failed, cancelled, expired.
A job id is in exactly one of: a tenant queue (queued), a lane's delayed set
(scheduled), the leases set (running), or none (finished).
--]]

local FENCE, LEASES, STATS, IDEM, DEAD, WORKERS, TASKS, WEIGHTS = 1, 2, 3, 4, 5, 6, 7, 8
local TERMINAL = {completed = true, failed = true, cancelled = true, expired = true}
-- priorities are clamped to +-PRIO_LIMIT so that prio * 2^40 + seq stays exact in a double
local PRIO_SPAN = 1099511627776

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

-- Fair dispatch between a lane's tenants: start-time fair queuing by work units
-- (fairlane/policy/fairqueue.py derives it and states its bounds). `fair` holds the
-- tenants with waiting work, scored by their start tag; `vt` holds the lane's virtual
-- time V, its in-flight work `run`, and the finish tags `f:<tenant>` of idle tenants.
-- A tenant that becomes active starts at max(F_t, V - run / active tenants): level
-- with the work the others have *finished*, so a newcomer is not made to wait behind
-- work that was merely dispatched first, and a returning tenant's credit is bounded
-- by the work in flight -- never by how long it was idle.
local function activate(p, lane, tenant)
  local vt = lane_key(p, lane, 'vt')
  local fair = lane_key(p, lane, 'fair')
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

-- Put a job in its tenant's queue; the tenant becomes active if it had no work.
local function push_ready(p, lane, tenant, id, prio, seq)
  local q = p .. 'q:' .. lane .. ':' .. tenant
  if redis.call('ZCARD', q) == 0 then
    activate(p, lane, tenant)
  end
  redis.call('ZADD', q, order_score(prio, seq), id)
end

-- A tenant whose queue emptied leaves the active set; its tag is kept as its finish tag.
local function deactivate(p, lane, tenant, tag)
  redis.call('ZREM', lane_key(p, lane, 'fair'), tenant)
  redis.call('HSET', lane_key(p, lane, 'vt'), 'f:' .. tenant, tag)
end

-- In-flight work per lane, for the activation rule above.
local function add_running(p, counts)
  for lane, n in pairs(counts) do
    redis.call('HINCRBY', lane_key(p, lane, 'vt'), 'run', n)
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
  local codes, released = {}, {}
  for i, a in ipairs(acks) do
    local id, kind, payload = a[1], a[3], a[4]
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'tok', 'task', 'rc', 'rf', 'w', 'att', 'max', 'lane')
    if f[1] ~= 'running' or f[2] ~= a[2] then
      count(tally, 'fenced')
      codes[i] = 0
    else
      -- the status leaves 'running' below, which alone fences any later write of this token
      released[#released + 1] = id
      -- settled at once, so that a job handed back below sees the lane's true load
      redis.call('HINCRBY', lane_key(p, f[9], 'vt'), 'run', -1)
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
        redis.call('HINCRBY', jk, 'att', -1)
        redis.call('HSET', jk, 'st', 'queued')
        push_ready(p, r[1], r[2], id, r[3], r[4])
        wake(p, r[1])
      end
      codes[i] = 1
    end
  end
  -- dropped before anything is fetched, so a job settled and leased again in one
  -- exchange keeps its new lease
  if #released > 0 then
    redis.call('ZREM', keys[LEASES], unpack(released))
  end
  return codes
end

---------------------------------------------------------------------------- fetch

local function promote_due(keys, p, lane, now, limit)
  local dk = lane_key(p, lane, 'delayed')
  local due = redis.call('ZRANGE', dk, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', dk, id)
    local f = redis.call('HMGET', job_key(p, id), 'st', 'tenant', 'prio', 'seq')
    if f[1] == 'scheduled' then
      redis.call('HSET', job_key(p, id), 'st', 'queued')
      push_ready(p, lane, f[2], id, f[3], f[4])
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

-- Lease popped jobs ({id, fields} as `runnable` returns them) to `worker`: one fencing
-- token each, the attempt counted, one ZADD for all the leases. Returns the rows a
-- worker receives: [id, token, attempt, task, args, timeout, deadline, tenant, max,
-- backoff, enqueued].
local function lease_jobs(keys, p, popped, worker, lease, now)
  local jobs = {}
  if #popped == 0 then
    return jobs
  end
  local tok = redis.call('INCRBY', keys[FENCE], #popped) - #popped
  local zargs, running = {}, {}
  for i, e in ipairs(popped) do
    local id, f = e[1], e[2]
    running[e[3]] = (running[e[3]] or 0) + 1
    tok = tok + 1
    local att = (tonumber(f[10]) or 0) + 1
    redis.call('HSET', job_key(p, id), 'st', 'running', 'tok', tok, 'att', att, 'wk', worker,
      'start', now)
    zargs[2 * i - 1] = now + lease
    zargs[2 * i] = id
    jobs[i] = {id, tostring(tok), att, f[2], f[3], tonumber(f[6]) or 0,
      tonumber(f[5]) or 0, f[7] or '', tonumber(f[4]), f[8] or '', tonumber(f[9]) or 0}
  end
  redis.call('ZADD', keys[LEASES], unpack(zargs))
  add_running(p, running)
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

local function claim_idle_worker(p, lane, now)
  local idle = lane_key(p, lane, 'idle')
  redis.call('ZREMRANGEBYSCORE', idle, '-inf', now)
  local found = redis.call('ZRANGE', idle, 0, 0)
  if not found[1] then
    return nil
  end
  redis.call('ZREM', idle, found[1])
  local worker, lease = string.match(found[1], '^(.*)|(%d+)$')
  return worker, tonumber(lease)
end

local function hand_off(keys, p, worker, lease, id, f, lane, now)
  local rows = lease_jobs(keys, p, {{id, f, lane}}, worker, lease, now)
  local inbox = inbox_key(p, worker)
  redis.call('RPUSH', inbox, cmsgpack.pack(rows[1]))
  redis.call('PEXPIRE', inbox, lease)
end

-- Check a job popped from a tenant queue. Returns its fields (st, task, args, max,
-- dl, to, tenant, bo, enq, att) when it can run; settles it and returns nil when it
-- cannot (expired, malformed, or a stale entry).
local function runnable(keys, p, id, now, tally)
  local f = redis.call('HMGET', job_key(p, id), 'st', 'task', 'args', 'max', 'dl', 'to', 'tenant',
    'bo', 'enq', 'att')
  if f[1] == 'queued' then
    if not f[2] or not f[3] or not tonumber(f[4])
      or not (utf8_ok(f[2]) and utf8_ok(f[3]) and utf8_ok(f[7]) and utf8_ok(f[8])) then
      count(tally, 'malformed')
      dead_letter(keys, p, id, MALFORMED_ERR, now, tally)
    elseif f[5] and tonumber(f[5]) < now then
      expire(keys, p, id, EXPIRED_ERR, now, tally)
    else
      return f
    end
  elseif not f[1] then
    count(tally, 'missing')
  end
  return nil
end

-- Dispatch up to `want` jobs of a lane in fair order: the active tenant with the
-- smallest start tag gives its head job (priority, then FIFO), V moves up to that tag,
-- and the tenant's tag grows by the job's work over the tenant's weight (work is 1
-- unit per job until estimates exist).
-- A sole active tenant gives its jobs in one pop. Ties go to the smaller tenant name.
-- Appends {id, fields, lane} to `popped`; returns false when the lane has no tenants.
local function pop_fair(keys, p, lane, want, now, tally, popped)
  local fair = lane_key(p, lane, 'fair')
  local vt = lane_key(p, lane, 'vt')
  local v = tonumber(redis.call('HGET', vt, 'V')) or 0
  local got, any = 0, false
  while got < want do
    local head = redis.call('ZRANGE', fair, 0, 0, 'WITHSCORES')
    if not head[1] then
      break
    end
    any = true
    local tenant, tag = head[1], tonumber(head[2])
    local step = 1 / (tonumber(redis.call('HGET', keys[WEIGHTS], tenant)) or 1)
    local q = p .. 'q:' .. lane .. ':' .. tenant
    local take = 1
    if redis.call('ZCARD', fair) == 1 then
      take = want - got
    end
    local ids = redis.call('ZPOPMIN', q, take)
    for i = 1, #ids, 2 do
      local f = runnable(keys, p, ids[i], now, tally)
      if f then
        popped[#popped + 1] = {ids[i], f, lane}
        got = got + 1
        if tag > v then
          v = tag
        end
        tag = tag + step
      end
    end
    if redis.call('ZCARD', q) > 0 then
      redis.call('ZADD', fair, tag, tenant)
    else
      deactivate(p, lane, tenant, tag)
    end
  end
  redis.call('HSET', vt, 'V', v)
  return any
end

-- Lease up to `n` jobs of `lanes` (taken in turn) to `worker`. Returns the jobs, each
-- [id, token, attempt, task, args, timeout, deadline, tenant, max, backoff, enqueued],
-- and the ms until the lanes' next scheduled job (-1 when none).
local function fetch(keys, p, worker, n, lease, promote_limit, lanes, now, tally)
  for _, lane in ipairs(lanes) do
    promote_due(keys, p, lane, now, promote_limit)
  end
  -- lanes are served in turn, each round asking for an even share of what is left
  local popped, live = {}, {}
  for i, lane in ipairs(lanes) do
    live[i] = lane
  end
  while #popped < n and #live > 0 do
    local still = {}
    for _, lane in ipairs(live) do
      local want = math.ceil((n - #popped) / #live)
      if want > 0 and pop_fair(keys, p, lane, want, now, tally, popped) then
        still[#still + 1] = lane
      end
    end
    live = still
  end
  local jobs = lease_jobs(keys, p, popped, worker, lease, now)
  local next_due = -1
  for _, lane in ipairs(lanes) do
    if #jobs > 0 and redis.call('ZCARD', lane_key(p, lane, 'fair')) > 0 then
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
--   [id, tenant, prio, task, args, max, bo, to, rc, rf, idem, delay_ms, at_ms, deadline]
-- with nil for an absent delay/at, '' for an absent idem/deadline; a deadline is '+ms'
-- (relative) or absolute ms.
-- Returns a flat list: id, code per job (1 created, 0 existing via idempotency key,
-- -1 deadline already past: nothing written).
local function enqueue(keys, args)
  local p, now = prefix(keys), now_ms()
  local lane = args[1]
  local jobs = cmsgpack.unpack(args[2])
  local out, tally = {}, new_effects()
  local can_hand_off = true
  -- one counter update reserves FIFO numbers for the whole batch (unused ones leave gaps)
  local seq = redis.call('HINCRBY', keys[STATS], 'seq', #jobs) - #jobs
  for _, j in ipairs(jobs) do
    seq = seq + 1
    local id, tenant, prio, idem = j[1], j[2], j[3], j[11]
    local existing = idem ~= '' and redis.call('HGET', keys[IDEM], idem)
    if existing and redis.call('EXISTS', job_key(p, existing)) == 1 then
      out[#out + 1] = existing
      out[#out + 1] = 0
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
          'enq', now, 'run', run_at, 'seq', seq, 'st', st, 'att', 0)
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
          -- the first ready job of a batch goes straight to an idle worker, if one waits
          local idle_worker, idle_lease
          if can_hand_off then
            idle_worker, idle_lease = claim_idle_worker(p, lane, now)
            can_hand_off = false
          end
          if idle_worker then
            -- fields as `runnable` returns them: st, task, args, max, dl, to, tenant, bo, enq, att
            hand_off(keys, p, idle_worker, idle_lease, id,
              {st, j[4], j[5], j[6], dl ~= '' and dl or nil, j[8], tenant, j[7], now, 0}, lane, now)
          else
            push_ready(p, lane, tenant, id, prio, seq)
          end
        end
        out[#out + 1] = id
        out[#out + 1] = 1
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

-- ARGV: msgpack [acks, worker, n, lease_ms, promote_limit, lanes, idle_ms]. One round
-- trip settles a worker's finished attempts and leases it the next batch: first what
-- was handed to its inbox, then up to n more. With idle_ms > 0 and nothing to give,
-- the worker is registered idle for idle_ms (it is about to block on its inbox).
-- Returns msgpack [next_due_ms, ack codes, jobs].
local function exchange(keys, args)
  local p, now = prefix(keys), now_ms()
  local a = cmsgpack.unpack(args[1])
  local worker, n, lease, lanes, idle_ms = a[2], a[3], a[4], a[6], tonumber(a[7]) or 0
  local tally = new_effects()
  local codes = apply_acks(keys, p, a[1], now, tally)
  local member = worker .. '|' .. lease
  for _, lane in ipairs(lanes) do
    redis.call('ZREM', lane_key(p, lane, 'idle'), member)
  end
  local inbox = inbox_key(p, worker)
  local handed = redis.call('LRANGE', inbox, 0, -1)
  local jobs, next_due = {}, -1
  if #handed > 0 then
    redis.call('DEL', inbox)
  end
  if n > #handed then
    jobs, next_due = fetch(keys, p, worker, n - #handed, lease, a[5], lanes, now, tally)
  end
  for i = #handed, 1, -1 do
    table.insert(jobs, 1, cmsgpack.unpack(handed[i]))
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
  redis.call('ZREM', keys[WORKERS], worker)
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
    local f = redis.call('HMGET', jk, 'st', 'att', 'max', 'bo', 'lane')
    if f[1] == 'running' then
      redis.call('HDEL', jk, 'tok', 'wk')
      add_running(p, {[f[5]] = -1})
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
  redis.call('ZREMRANGEBYSCORE', keys[WORKERS], '-inf', now - tonumber(args[3]))
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

-- ARGV: tenant, weight ('' = back to the default, 1). A new weight applies from the
-- tenant's next dispatch.
local function configure_tenant(keys, args)
  if args[2] == '' then
    redis.call('HDEL', keys[WEIGHTS], args[1])
  else
    redis.call('HSET', keys[WEIGHTS], args[1], args[2])
  end
  return 1
end

-- ARGV: id. Cancels a waiting job at once; a running one is asked to stop (its
-- worker learns on its next lease renewal). Returns the status after the call.
local function cancel(keys, args)
  local p, now = prefix(keys), now_ms()
  local id = args[1]
  local jk = job_key(p, id)
  local f = redis.call('HMGET', jk, 'st', 'lane', 'tenant')
  local st = f[1]
  if not st then
    return 'missing'
  end
  if st == 'queued' then
    local q = p .. 'q:' .. f[2] .. ':' .. f[3]
    redis.call('ZREM', q, id)
    if redis.call('ZCARD', q) == 0 then
      -- the tag stays as it was: cancelling and queueing again gains nothing
      local tag = redis.call('ZSCORE', lane_key(p, f[2], 'fair'), f[3])
      if tag then
        deactivate(p, f[2], f[3], tag)
      end
    end
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
    local f = redis.call('HMGET', jk, 'st', 'lane', 'tenant', 'prio', 'seq', 'task')
    if f[1] == 'failed' and redis.call('ZREM', keys[DEAD], id) == 1 then
      redis.call('ZREM', p .. 'kept:' .. (f[6] or '') .. ':failed', id)
      redis.call('HSET', jk, 'st', 'queued', 'att', 0, 'run', now)
      redis.call('HDEL', jk, 'fin', 'err', 'res')
      push_ready(p, f[2], f[3], id, f[4], f[5])
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
