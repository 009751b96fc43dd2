#!lua name=__LIBRARY__
--[[
Fairlane's store: every state change of a job, each one atomic.

Keys. Every function receives the app's fixed keys first, in this order
(fairlane/store/keys.py, AppKeys.common), each indexed by the Lua constant named here:
  KEYS[1]  FENCE    fence     string  fencing-token counter
  KEYS[2]  LEASES   leases    zset    running job id -> lease expiry (server ms)
  KEYS[3]  STATS    stats     hash    counters; also the 'seq' FIFO counter
  KEYS[4]  IDEM     idem      hash    idempotency key -> job id
  KEYS[5]  DEAD     dead      zset    dead-lettered job id -> time (ms)
  KEYS[6]  WORKERS  workers   zset    worker id -> last heartbeat (ms)
  KEYS[7]  TASKS    tasks     hash    task name -> 'rc|rf' retention of its records
  KEYS[8]  WEIGHTS  weights   hash    tenant -> fair-share weight (absent = 1)
  KEYS[9]  FLEET    fleet     hash    worker -> its slots and lanes ('slots|lane,lane')
  KEYS[10] TLIMITS  tlimits   hash    tenant -> concurrency 'floor,max,burst_floor,burst_pct'
  KEYS[11] THR      thr       hash    throttle keys, grants and parked jobs (throttle.lua)
  KEYS[12] THRW     thr:wait  zset    throttle waiters, one lex range per key (throttle.lua)
followed by the keys of the lanes the caller names (state, cap, delayed, wake, idle
per lane). Per-job hashes (job:<id>), per-tenant queues (q:<lane>:<class>:<tenant>),
per-class fair queues (lane:<l>:c:<class>:fair|vt|granted), tenant signals
(sig:<tenant>), retention indexes (kept:<task>:<outcome>) and lane keys are derived
from the prefix of KEYS[FENCE], so they always carry the same hash tag (same cluster slot).

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

-- The app's prefix: KEYS[FENCE] less the fence key's own name (keys.py's, written in
-- by library.py), so that the prefix never hangs on how long that name is.
local FENCE_NAME = '__FENCE_NAME__'

local function prefix(keys)
  local k = keys[FENCE]
  return string.sub(k, 1, #k - #FENCE_NAME)
end

local function lane_key(p, lane, what)
  return p .. 'lane:' .. lane .. ':' .. what
end

local function job_key(p, id)
  return p .. 'job:' .. id
end

-- A job's lifecycle events (ev:<id>): a list of msgpack [ms, kind, detail], kept to the
-- last EVENT_CAP entries and deleted with the record. Only what the record cannot tell
-- is logged (fairlane/explain.py rebuilds submission, start and end from enq, start,
-- wk, att, fin, st and err), so a job accepted, dispatched and completed logs nothing.
-- One RPUSH per event; the list is trimmed only when it outgrows the cap.
local EVENT_CAP = 64

local function ev_key(p, id)
  return p .. 'ev:' .. id
end

local function log_event(p, id, now, kind, detail)
  local k = ev_key(p, id)
  if redis.call('RPUSH', k, cmsgpack.pack({now, kind, detail or {}})) > EVENT_CAP then
    redis.call('LTRIM', k, -EVENT_CAP, -1)
  end
end

-- The type of an error JSON ('{"type":"X",...}'), for events; '' when it has none.
local function error_type(err)
  return err and string.match(err, '"type"%s*:%s*"([^"]*)"') or ''
end

-- A job's width in slots from its record's `sl`: enqueue writes a whole number >= 1,
-- so anything else is damage, read as the default width that enqueue counted it at;
-- the waiting and in-flight counts then return to where they were before the job.
local function slots_of(raw)
  local n = tonumber(raw)
  if n and n >= 1 and n == math.floor(n) then
    return n
  end
  return 1
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

-- @include fairqueue.lua
-- @include admission.lua
-- @include runs.lua
-- @include records.lua
-- @include workflows.lua

---------------------------------------------------------------------------- ack

-- How a lane learns costs: {cost_mode, learn, window}, read once per call and lane.
-- `cache` also gathers a call's cost samples per key and tag corrections per tenant,
-- written once each by `flush_costs`.
local function lane_costing(p, lane, cache)
  local c = cache[lane]
  if not c then
    local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'charge', 'adm')
    local window = 500
    if v[2] then
      window = cjson.decode(v[2]).window or window
    end
    c = {cost_mode = v[1] == 'cost', learn = v[1] == 'cost' or v[2] ~= false, window = window}
    cache[lane] = c
  end
  return c
end

-- An attempt ended having used `cost` units: its key's learned cost moves towards it,
-- the job records it next to what it was charged, and in 'cost' mode the tenant's tag
-- takes the difference.
local function feed_back_cost(p, id, lane, cls, tenant, cost_key, charged_mu, cost, cache, keys)
  local c = lane_costing(p, lane, cache)
  if not c.learn then
    return
  end
  local actual_mu = math.max(MIN_CHARGE_MU, math.floor(cost * 1000 + 0.5))
  redis.call('HSET', job_key(p, id), 'amu', actual_mu)
  if cost_key then
    local samples = cache.samples[cost_key]
    if not samples then
      samples = {window = c.window}
      cache.samples[cost_key] = samples
    end
    samples[#samples + 1] = actual_mu
  end
  if c.cost_mode then
    local key = lane .. '\0' .. cls .. '\0' .. tenant
    local e = cache.tags[key] or {lane, cls, tenant, 0}
    e[4] = e[4] + (actual_mu - (tonumber(charged_mu) or 1)) / 1000
    cache.tags[key] = e
  end
end

local function flush_costs(p, cache, keys)
  for cost_key, samples in pairs(cache.samples) do
    learn_costs(p, cost_key, samples, samples.window)
  end
  for _, e in pairs(cache.tags) do
    local weight = tonumber(redis.call('HGET', keys[WEIGHTS], e[3])) or 1
    adjust_tag(p, e[1], e[2], e[3], e[4] / weight)
  end
end

-- Apply a batch of outcomes, each fenced by its lease token. `acks` is an array of
-- [id, token, kind (ok | retry | dead | cancel | release | suspend), payload, delay_ms, cost]
-- (a workflow run suspends with what it waits for as its payload).
-- (cost: the work units the attempt used, -1 when it did not run).
-- Returns one code per entry: 1 applied; 2 the settlement this lease made already, sent
-- again after its reply was lost (not applied twice; counted 'resettled'); 0 rejected as
-- stale (counted 'fenced'). A job keeps the token that settled it until its next lease
-- (a reclaim removes it), so the two cannot be confused.
local function apply_acks(keys, p, acks, now, tally)
  local codes, released, freed, limited, settled = {}, {}, {}, {}, {}
  local costing = {samples = {}, tags = {}}
  for i, a in ipairs(acks) do
    local id, kind, payload = a[1], a[3], a[4]
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'tok', 'task', 'rc', 'rf', 'w', 'att', 'max', 'lane',
      'cls', 'sl', 'ttok', 'tenant', 'start', 'mu', 'ck', 'cu', 'par', 'wfr')
    if f[1] ~= 'running' and f[2] == a[2] then
      count(tally, 'resettled')
      codes[i] = 2
    elseif f[1] ~= 'running' or f[2] ~= a[2] then
      count(tally, 'fenced')
      codes[i] = 0
    else
      -- the status leaves 'running' below, which alone fences any later write of this token
      released[#released + 1] = id
      add_settled(settled, f[9], f[10] or DEFAULT_CLASS, f[11], work_of(f[17]))
      -- slots held until this call still count when dispatch tells a waiting job who
      -- held its class's capacity (queued_why)
      local ek = f[9] .. '\0' .. (f[10] or DEFAULT_CLASS)
      tally.ended = tally.ended or {}
      tally.ended[ek] = (tally.ended[ek] or 0) + slots_of(f[11])
      freed[f[9]] = true
      release_throttle(keys, p, id, f[12], now)
      local tenant = f[13] or ''
      if limited[tenant] == nil then
        limited[tenant] = redis.call('HEXISTS', keys[TLIMITS], tenant) == 1
      end
      if kind ~= 'release' and limited[tenant] then
        note_duration(p, f[13], math.max(0, now - (tonumber(f[14]) or now)) / 1000)
      end
      local cost = tonumber(a[6]) or -1
      if cost >= 0 and kind ~= 'release' then
        feed_back_cost(p, id, f[9], f[10] or DEFAULT_CLASS, f[13] or '', f[16], f[17], cost,
          costing, keys)
      end
      local meta = {f[3], f[4], f[5], f[6], f[15], f[9], f[10], f[13], f[18], f[19]}
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
      elseif kind == 'suspend' then
        suspend_run(keys, p, id, payload, tonumber(a[5]) or 0, now, tally)
      else -- release: handed back unstarted by a stopping worker; the attempt is not counted
        local r = redis.call('HMGET', jk, 'lane', 'tenant', 'prio', 'seq', 'start', 'wk')
        -- written first, so that the job handed back sees the lane's true load
        flush_settled(p, settled)
        redis.call('HINCRBY', jk, 'att', -1)
        redis.call('HSET', jk, 'st', 'queued')
        log_event(p, id, now, 'released', {start = tonumber(r[5]), wk = r[6] or nil})
        push_ready(p, r[1], f[10], r[2], id, r[3], r[4], f[11])
        wake(p, r[1])
      end
      codes[i] = 1
    end
  end
  -- dropped before anything is fetched, so a job settled and leased again in one
  -- exchange keeps its new lease
  flush_settled(p, settled)
  flush_costs(p, costing, keys)
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

-- @include lease.lua
-- @include dispatch.lua

---------------------------------------------------------------------------- enqueue

-- ARGV: lane, msgpack array of jobs, each
--   [id, tenant, prio, task, args, max, bo, to, rc, rf, idem, delay_ms, at_ms, deadline,
--    class, slots, limits, declared milli-units, cost key, declared (1) or default (0),
--    parent run id ('' for none), W3C trace context ('' or absent for none: field tp)]
-- with nil for an absent delay/at, '' for an absent idem/deadline; a deadline is '+ms'
-- (relative) or absolute ms; limits is {{key, limit}, ..} sorted by key.
-- Returns a flat list: id, code, detail per job. Codes: 1 accepted, 2 deferred (stored,
-- admitted when room frees), 0 existing via idempotency key, -1 deadline already
-- past, -2 class unknown in the lane, -4 rejected by admission (detail
-- 'reason|earlier rejections'): nothing written for negative codes.
local function enqueue(keys, args)
  local p, now = prefix(keys), now_ms()
  local lane = args[1]
  local jobs = cmsgpack.unpack(args[2])
  local out, tally = {}, new_effects()
  local tbl, cost_mode, adm = lane_declarations(p, lane)
  local learned = {}
  local ready, submitted, pushes = false, {}, {active = {}, d = {}}
  -- one counter update reserves FIFO numbers for the whole batch (unused ones leave gaps)
  local seq = redis.call('HINCRBY', keys[STATS], 'seq', #jobs) - #jobs
  for _, j in ipairs(jobs) do
    seq = seq + 1
    local id, tenant, prio, idem = j[1], j[2], j[3], j[11]
    local cls, slots = j[15] or DEFAULT_CLASS, tonumber(j[16]) or 1
    local existing = idem ~= '' and redis.call('HGET', keys[IDEM], idem)
    local verdict, reason, mu = 'accepted', nil, nil
    local existing_st = existing and redis.call('HGET', job_key(p, existing), 'st')
    if existing_st then
      -- the detail says whether the job the key names still waits for admission
      out[#out + 1], out[#out + 2], out[#out + 3] =
        existing, 0, existing_st == 'deferred' and 'deferred' or ''
    elseif not class_index(tbl, cls) then
      out[#out + 1], out[#out + 2], out[#out + 3] = id, -2, ''
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
      local base_mu = tonumber(j[18]) or 1000
      if adm then
        base_mu = expected_mu(p, base_mu, j[20] == 1, j[19], learned)
      end
      if adm and not (dl ~= '' and (dl <= now or dl < run_at)) then
        verdict, reason, mu = admit_new(p, lane, adm, cls, tenant, base_mu)
        count_decision(tally, lane, cls, verdict, reason)
      end
      if dl ~= '' and (dl <= now or dl < run_at) then
        out[#out + 1], out[#out + 2], out[#out + 3] = id, -1, ''
      elseif verdict == 'rejected' then
        local earlier = note_rejection(p, lane, tenant, now)
        out[#out + 1], out[#out + 2], out[#out + 3] = id, -4, reason .. '|' .. earlier
        count(tally, 'rejected')
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
        if j[19] and j[19] ~= '' then
          redis.call('HSET', jk, 'ck', j[19])
        end
        if j[21] and j[21] ~= '' then
          redis.call('HSET', jk, 'par', j[21])
        end
        -- only traced enqueues send a context: an untraced job costs no command here
        if j[22] and j[22] ~= '' then
          redis.call('HSET', jk, 'tp', j[22])
        end
        if cost_mode then
          redis.call('HSET', jk, 'cu', charge_mu(p, tonumber(j[18]) or 0, j[20] == 1, j[19], learned))
        end
        -- an accepted job's submission is in its record (enq, cls): only a deferral,
        -- and why, needs an event
        if verdict == 'deferred' then
          log_event(p, id, now, 'submitted', {v = verdict, why = reason, cls = cls})
        end
        -- a deferred job is scheduled when admitted (its 'admitted' event says until when)
        if st == 'scheduled' and verdict ~= 'deferred' then
          log_event(p, id, now, 'scheduled', {at = run_at})
        end
        if verdict == 'deferred' then
          redis.call('HSET', jk, 'dmu', mu)
          defer(p, lane, cls, id, seq)
          count(tally, 'deferred')
        elseif mu then
          reserve(p, lane, cls, tenant, id, mu)
        end
        -- a deferred job waits in its class's deferred queue until room frees
        if verdict ~= 'deferred' and st == 'scheduled' then
          redis.call('ZADD', lane_key(p, lane, 'delayed'), run_at, id)
        elseif verdict ~= 'deferred' then
          push_ready(p, lane, cls, tenant, id, prio, seq, slots, pushes)
          ready = true
        end
        submitted[tenant] = (submitted[tenant] or 0) + 1
        out[#out + 1], out[#out + 2], out[#out + 3] =
          id, verdict == 'deferred' and 2 or 1, reason or ''
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

-- The jobs in an inbox. Only hand-offs write there; anything else is dropped, not handed
-- on: a job's row is only a copy, so a job whose row is lost is reclaimed with its lease.
local function inbox_rows(raw)
  local rows = {}
  for _, packed in ipairs(raw) do
    local ok, row = pcall(cmsgpack.unpack, packed)
    if ok and type(row) == 'table' and type(row[1]) == 'string' then
      rows[#rows + 1] = row
    end
  end
  return rows
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
  local raw = redis.call('LRANGE', inbox, 0, -1)
  local jobs, next_due, left = {}, -1, n
  if #raw > 0 then
    redis.call('DEL', inbox)
  end
  local handed = inbox_rows(raw)
  for i = 1, #handed do
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
  local jobs = inbox_rows(redis.call('LRANGE', inbox, 0, -1))
  redis.call('DEL', inbox)
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
    local f = redis.call('HMGET', jk, 'st', 'att', 'max', 'bo', 'lane', 'cls', 'sl', 'ttok', 'cu',
      'wk', 'start', 'qw')
    if f[1] == 'running' then
      redis.call('HDEL', jk, 'tok', 'wk')
      -- the lost attempt's start and why it waited: the next attempt overwrites them
      log_event(p, id, now, 'reclaimed', {wk = f[10] or '', att = tonumber(f[2]) or 0,
        start = tonumber(f[11]), qw = f[12] ~= '' and f[12] or nil})
      settle_running(p, f[5], f[6] or DEFAULT_CLASS, f[7], work_of(f[9]))
      release_throttle(keys, p, id, f[8], now)
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

-- @include control.lua

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
redis.register_function('__PREFIX__declare_admission', declare_admission)
redis.register_function('__PREFIX__tenant_limit_now', tenant_limit_now)
redis.register_function('__PREFIX__wf_load', wf_load)
redis.register_function('__PREFIX__wf_step', wf_step)
redis.register_function('__PREFIX__wf_wait', wf_wait)
redis.register_function('__PREFIX__wf_children', wf_children)
redis.register_function('__PREFIX__signal', signal)
