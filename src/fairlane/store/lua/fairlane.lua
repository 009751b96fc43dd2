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
  KEYS[11] THR      thr       hash    throttle keys, grants, offers, parked jobs (throttle.lua)
  KEYS[12] THRW     thr:wait  zset    throttle waiters, a lex range per key and tenant
followed by the keys of the lanes the caller names (state, cap, delayed, wake, idle
per lane). Per-job hashes (job:<id>), per-tenant queues (q:<lane>:<class>:<tenant>),
per-class fair queues (lane:<l>:c:<class>:fair|vt), throttle tags (<thr>:s|f:<key>), tenant signals
(sig:<tenant>), retention indexes (kept:<task>:<outcome>) and lane keys are derived
from the prefix of KEYS[FENCE], so they always carry the same hash tag (same cluster slot).

Time is always the server's (TIME), never a client's.

Job status: queued, throttled, scheduled, running, completed, failed, cancelled,
expired. A job id is in exactly one of: a tenant queue (queued; one a throttle key
woke holds offers), a throttle waiter group (throttled), a lane's delayed set (scheduled), the
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
-- is logged (fairlane/store/explain.py rebuilds submission, start and end from enq, start,
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

-- The hot path's helpers (fairqueue.lua, records.lua, lease.lua, dispatch.lua): fields of one
-- table, as the library's main chunk is at Lua's limit of 200 locals. A command takes at
-- most ARGS arguments from one unpack (Lua's own limit is near 8000).
local hot = {ARGS = 4000}

-- `cmd` with `key` (nil for none) and the arguments in `list`, in as many commands as
-- Lua's unpack needs (ARGS arguments each).
function hot.chunked(cmd, key, list)
  for i = 1, #list, hot.ARGS do
    local last = math.min(#list, i + hot.ARGS - 1)
    if key then
      redis.call(cmd, key, unpack(list, i, last))
    else
      redis.call(cmd, unpack(list, i, last))
    end
  end
end

-- A whole number as a command argument ('%d'; anything else is passed on as it is, and
-- Redis writes it with '%.17g').
function hot.int(n)
  if type(n) == 'number' and n == math.floor(n) and n > -9e15 and n < 9e15 then
    return string.format('%d', n)
  end
  return n
end

-- The server time `now` as an argument, formatted once per call.
function hot.now_arg(now)
  if hot.now ~= now then
    hot.now, hot.now_s = now, string.format('%d', now)
  end
  return hot.now_s
end

-- Memoised checks and parses, by value: most of a record's fields repeat from job to
-- job (its task, tenant, class, backoff, budget, timeout, width, keys), so each
-- distinct value is parsed once rather than once per job. A memo is emptied when it
-- outgrows MEMO_MAX.
hot.MEMO_MAX = 4096

function hot.memoised(check)
  local seen, n = {}, 0
  return function(v)
    if v == nil or v ~= v then
      return check(v)
    end
    local r = seen[v]
    if r == nil then
      r = check(v)
      if n >= hot.MEMO_MAX then
        seen, n = {}, 0
      end
      seen[v], n = r, n + 1
    end
    return r
  end
end

-- a repeating field's number, false when it is none
hot.num = hot.memoised(function(v) return tonumber(v) or false end)
-- a repeating number as a command argument (a job's budget, timeout, width, charge...):
-- formatting costs about as much as Redis's own, so only a value seen before is a gain
hot.arg = hot.memoised(hot.int)

-- The fields some records have and most do not (a deadline, keys, a trace context, a
-- parent, an idempotency key, a reservation, a throttle grant or offers, a waiter, a
-- run's keys) are read only from a record that may hold one: a field a listpack hash
-- does not hold costs a scan of the whole record, and these were most of what the hot
-- path looked for. Whoever writes one of them sets `x` to '1' in the same command;
-- enqueue writes '' when there are none, and a record without `x` (written before it
-- existed) may hold any. `common` ends with 'x'; the result holds the common fields in
-- their places and the optional ones after them (nil when absent). pcall: a key of the
-- wrong type reads as no record.
function hot.read(key, common, optional)
  local f = redis.pcall('HMGET', key, unpack(common))
  if f.err then
    return {}
  end
  local n = #common
  if f[n] == '' then
    f[n] = nil
  else
    local o = redis.pcall('HMGET', key, unpack(optional))
    for i = 1, #optional do
      f[n - 1 + i] = not o.err and o[i] or nil
    end
  end
  return f
end

-- Whether a hash of tenant settings (weights, concurrency limits) holds any entry, asked
-- once per call (`fx`: the call's effects, records.lua): most apps set none, and asking
-- for each tenant would cost a command per job.
function hot.any(fx, key)
  local v = fx.any[key]
  if v == nil then
    v = redis.call('EXISTS', key) == 1
    fx.any[key] = v
  end
  return v
end

-- A job's width in slots from its record's `sl`: enqueue writes a whole number >= 1,
-- so anything else is damage, read as the default width that enqueue counted it at;
-- the waiting and in-flight counts then return to where they were before the job.
local function slots_of(raw)
  local n = hot.num(raw)
  if n and n >= 1 and n % 1 == 0 then
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
-- @include rates.lua
-- @include throttle.lua

-- @include fairqueue.lua
-- @include fairkeys.lua
-- @include bounds.lua
-- @include admission.lua
-- @include runs.lua
-- @include records.lua
-- @include workflows.lua

---------------------------------------------------------------------------- ack

-- @include acks.lua

---------------------------------------------------------------------------- fetch

-- @include lease.lua
-- @include dispatch.lua

---------------------------------------------------------------------------- enqueue

-- @include enqueue.lua

-- enqueue on a gateway caller's key: KEYS as enqueue's, then the app's API key records
-- (gw:keys, in this shard: the home one) and its audit trail (gw:audit); ARGV lane,
-- jobs, key id, SHA-256 of the key, its tenant, the trail's cap. The check, the enqueue
-- and the audit entry of each job are one step, so a key revoked, rotated, expired or
-- narrowed a moment ago stores nothing: an error reply (NOKEY: not valid or expired;
-- NOSCOPE: no submit scope), and nothing is written (not even an entry). A record
-- without scopes or expires_ms (written before keys had them) has every scope and no
-- expiry.
function hot.enqueue_as(keys, args)
  local trail = table.remove(keys)
  local raw = redis.call('HGET', keys[#keys], args[3])
  local record = raw and cjson.decode(raw)
  if not record or record.sha256 ~= args[4] or record.tenant ~= args[5] then
    return redis.error_reply('NOKEY the API key is not valid (unknown, revoked or rotated)')
  end
  if type(record.expires_ms) == 'number' and now_ms() >= record.expires_ms then
    return redis.error_reply('NOKEY the API key has expired')
  end
  if type(record.scopes) == 'table' then
    local allowed = false
    for _, scope in ipairs(record.scopes) do
      allowed = allowed or scope == 'submit'
    end
    if not allowed then
      return redis.error_reply('NOSCOPE the API key lacks the submit scope')
    end
  end
  keys[#keys] = nil
  local out = enqueue(keys, {args[1], args[2]})
  hot.audit_submits(trail, args[6], args[3], args[5], out)
  return out
end

-- One audit entry per job of enqueue's reply (id, code, detail per job), its fields
-- as fairlane/store/audit.py writes them (same names, same order): the outcome, the
-- reason the gateway answers, and the job id when a job is stored.
function hot.audit_submits(trail, cap, key_id, tenant, out)
  for i = 1, #out, 3 do
    local id, code, detail = out[i], out[i + 1], out[i + 2]
    local outcome = 'refused'
    if code == 1 then
      outcome, detail = 'accepted', ''
    elseif code == 2 then
      outcome = 'deferred'
    elseif code == 0 then
      outcome, detail = detail == 'deferred' and 'deferred' or 'accepted', 'existing'
    elseif code == -1 then
      outcome, detail, id = 'rejected', 'deadline_unmeetable', ''
    elseif code == -4 then
      outcome, detail, id = 'rejected', string.match(detail, '^[^|]*'), ''
    elseif code == -5 then
      outcome, detail, id = 'rejected', 'class_not_entitled', ''
    else
      detail, id = 'refused', ''
    end
    redis.call('XADD', trail, 'MAXLEN', '~', cap, '*', 'action', 'submit', 'key', key_id,
      'tenant', tenant, 'outcome', outcome, 'detail', detail, 'id', id)
  end
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
  hot.forget_settled(p, worker, a[1], codes)
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
  redis.call('ZREM', p .. 'beats', worker)
  redis.call('DEL', hot.worker_jobs(p, worker))
  local inbox = inbox_key(p, worker)
  local jobs = inbox_rows(redis.call('LRANGE', inbox, 0, -1))
  redis.call('DEL', inbox)
  return cmsgpack.pack(jobs)
end

-- The acks of one exchange that settled (code 1) leave the worker's set of leased ids,
-- in one command.
function hot.forget_settled(p, worker, acks, codes)
  local ids = {}
  for i, a in ipairs(acks) do
    if codes[i] == 1 then
      ids[#ids + 1] = a[1]
    end
  end
  if #ids > 0 then
    redis.call('SREM', hot.worker_jobs(p, worker), unpack(ids))
  end
end

-- ARGV: msgpack array of acks, then the worker that sends them (optional: its set of
-- leased ids is kept up to date when given). Returns the codes as a plain array.
local function ack(keys, args)
  local p, now, tally = prefix(keys), now_ms(), new_effects()
  local acks = cmsgpack.unpack(args[1])
  local codes = apply_acks(keys, p, acks, now, tally)
  if args[2] then
    hot.forget_settled(p, args[2], acks, codes)
  end
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
hot.DEAD_ERR = '{"type":"WorkerLost","message":"the worker running attempt %d stopped beating: it died or lost the server","traceback":""}'
hot.RECLAIM = {'st', 'att', 'max', 'bo', 'lane', 'cls', 'sl', 'ttok', 'cu', 'wk', 'start', 'qw'}

-- Take a running job back from its worker (f: its record's hot.RECLAIM fields), whose
-- lease ran out or who stopped beating (`err`): the lost attempt counts; the job is
-- retried after its backoff, or dead-lettered when it has no attempts left. Its lease
-- entry is the caller's to drop.
function hot.reclaim_job(keys, p, id, f, err, now, tally, retried, dead)
  local jk = job_key(p, id)
  redis.call('HDEL', jk, 'tok', 'wk')
  -- the lost attempt's start and why it waited: the next attempt overwrites them
  log_event(p, id, now, 'reclaimed', {wk = f[10] or '', att = tonumber(f[2]) or 0,
    start = tonumber(f[11]), qw = f[12] ~= '' and f[12] or nil})
  settle_running(p, f[5], f[6] or DEFAULT_CLASS, f[7], work_of(f[9]))
  release_throttle(keys, p, id, f[8], now)
  count(tally, 'reclaimed')
  local att = tonumber(f[2]) or 0
  err = string.format(err, att)
  if att >= (tonumber(f[3]) or 1) then
    dead_letter(keys, p, id, err, now, tally)
    dead[#dead + 1] = id
  else
    schedule_retry(keys, p, id, backoff_ms(f[4], att, math.random()), err, now, tally)
    retried[#retried + 1] = id
  end
end

-- A worker gone for good (stale, or dead by its beats): its capacity, its inbox, its
-- set of leased ids.
function hot.forget_worker(keys, p, worker)
  deregister_worker(keys, p, worker)
  redis.call('ZREM', p .. 'beats', worker)
  redis.call('DEL', hot.worker_jobs(p, worker), inbox_key(p, worker))
end

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
    local f = redis.call('HMGET', job_key(p, id), unpack(hot.RECLAIM))
    if f[1] == 'running' then
      if f[10] then
        redis.call('SREM', hot.worker_jobs(p, f[10]), id)
      end
      hot.reclaim_job(keys, p, id, f, LOST_ERR, now, tally, retried, dead)
    end
  end
  apply_effects(keys, p, tally, now)
  local stale = redis.call('ZRANGE', keys[WORKERS], '-inf', now - tonumber(args[3]), 'BYSCORE',
    'LIMIT', 0, limit)
  for _, worker in ipairs(stale) do
    hot.forget_worker(keys, p, worker)
  end
  local specs = redis.call('HGETALL', keys[TASKS])
  for i = 1, #specs, 2 do
    local rc, rf = string.match(specs[i + 1], '^(.-)|(.*)$')
    trim(keys, p, p .. 'kept:' .. specs[i] .. ':ok', rc, now, 100)
    trim(keys, p, p .. 'kept:' .. specs[i] .. ':failed', rf, now, 100)
  end
  return {retried, dead}
end

-- ARGV: worker, dead_ms, limit, random seed. A worker's beat: one call per interval,
-- whatever it runs. A worker that beats and then stays silent for dead_ms is dead: up
-- to `limit` of the jobs leased to it are taken back now (hot.reclaim_job), not when
-- their leases run out; once none is left it is forgotten. Only workers that beat are
-- judged so (one that does not, an older release say, keeps its leases). Returns
-- {reclaimed ids, dead-lettered ids, the dead workers looked at}.
function hot.beat(keys, args)
  local p, now = prefix(keys), now_ms()
  local worker, dead_ms, limit = args[1], tonumber(args[2]), tonumber(args[3])
  math.randomseed(tonumber(args[4]))
  local bk = p .. 'beats'
  redis.call('ZADD', bk, now, worker)
  local silent = redis.call('ZRANGE', bk, '-inf', now - dead_ms, 'BYSCORE', 'LIMIT', 0, 2)
  local retried, dead, gone, tally = {}, {}, {}, new_effects()
  for _, w in ipairs(silent) do
    local left = limit - #retried - #dead
    if w ~= worker and left > 0 then
      gone[#gone + 1] = w
      local wk = hot.worker_jobs(p, w)
      local ids = redis.call('SMEMBERS', wk)
      -- in id order, so that which jobs a bounded pass takes, and a retry's place among
      -- same-time retries, do not depend on the set's own order
      table.sort(ids)
      local seen = {}
      for _, id in ipairs(ids) do
        if #retried + #dead >= limit then
          break
        end
        seen[#seen + 1] = id
        local f = redis.call('HMGET', job_key(p, id), unpack(hot.RECLAIM))
        if f[1] == 'running' and f[10] == w then
          redis.call('ZREM', keys[LEASES], id)
          hot.reclaim_job(keys, p, id, f, hot.DEAD_ERR, now, tally, retried, dead)
        end
      end
      if #seen == #ids then
        hot.forget_worker(keys, p, w)
      else
        hot.chunked('SREM', wk, seen)
      end
    end
  end
  apply_effects(keys, p, tally, now)
  return {retried, dead, gone}
end

---------------------------------------------------------------------------- queries and control

-- @include control.lua

-- Functions that free memory, or must run for a full store to be drained -- a worker's
-- start (its declarations), its exchange, acks, renewals, sweeps, beats and leaving, a
-- cancel, a watch (one field on the record) -- run on a server at its maxmemory
-- (hot.ALLOW_OOM); those that add data (enqueue, workflow steps and children, signals,
-- settings, redrive) do not, and the server refuses them there before they start.
hot.ALLOW_OOM = {'allow-oom'}
redis.register_function{function_name = '__PREFIX__enqueue', callback = enqueue}
redis.register_function{function_name = '__PREFIX__enqueue_as', callback = hot.enqueue_as}
redis.register_function{function_name = '__PREFIX__exchange', callback = exchange,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__ack', callback = ack, flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__leave', callback = leave, flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__renew', callback = renew, flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__sweep', callback = sweep, flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__beat', callback = hot.beat,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_task', callback = declare_task,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__cancel', callback = cancel,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__watch', callback = watch, flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__redrive', callback = redrive}
redis.register_function{function_name = '__PREFIX__configure_tenant', callback = configure_tenant}
redis.register_function{function_name = '__PREFIX__configure_limits', callback = configure_limits}
redis.register_function{function_name = '__PREFIX__configure_classes',
  callback = hot.configure_classes}
redis.register_function{function_name = '__PREFIX__declare_lane', callback = declare_lane,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_admission', callback = declare_admission,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__declare_bounds', callback = queue_bounds.declare,
  flags = hot.ALLOW_OOM}
redis.register_function{function_name = '__PREFIX__tenant_limit_now', callback = tenant_limit_now}
redis.register_function{function_name = '__PREFIX__wf_load', callback = wf_load}
redis.register_function{function_name = '__PREFIX__wf_step', callback = wf_step}
redis.register_function{function_name = '__PREFIX__wf_wait', callback = wf_wait}
redis.register_function{function_name = '__PREFIX__wf_children', callback = wf_children}
redis.register_function{function_name = '__PREFIX__signal', callback = signal}

-- @include tenantsweep.lua
