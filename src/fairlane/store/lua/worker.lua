-- A worker's calls: its exchange (settle, then lease the next batch), acks, lease
-- renewals, beats, leaving, the lease sweep, and the fleet's capacity per lane; and
-- enqueue on a gateway caller's key.
--
-- Keys: lane:<l>:cap|idle|state, inbox:<worker>, wj:<worker>, beats, job:<id>,
--   kept:<task>:<outcome>, KEYS[WORKERS], KEYS[FLEET], KEYS[LEASES], KEYS[TASKS]; gw:keys
--   and gw:audit (enqueue_as)
-- Calls: core, fairqueue, records, settling, leasing, dispatch, enqueuing
-- Entry points: workers.{DEAD_ERR, RECLAIM, ack, audit_submits, beat, enqueue_as,
--   drop_leases, exchange, forget_settled, forget_worker, leave, reclaim_job, renew, sweep}

local workers = {}

do
  local DEFAULT_CLASS, FLEET, LEASES = core.DEFAULT_CLASS, core.FLEET, core.LEASES
  local TASKS, WORKERS, job_key, lane_key = core.TASKS, core.WORKERS, core.job_key, core.lane_key
  local log_event, now_ms, prefix = core.log_event, core.now_ms, core.prefix
  local release_throttle, settle_running = fairqueue.release_throttle, fairqueue.settle_running
  local work_of = fairqueue.work_of
  local apply_effects, backoff_ms, count = records.apply_effects, records.backoff_ms, records.count
  local dead_letter, new_effects, schedule_retry = records.dead_letter, records.new_effects, records.schedule_retry
  local trim = records.trim
  local apply_acks = settling.apply_acks
  local inbox_key = leasing.inbox_key
  local fetch = dispatch.fetch
  local enqueue = enqueuing.enqueue

  -- enqueue on a gateway caller's key: KEYS as enqueue's, then the app's API key records
  -- (gw:keys, in this shard: the home one) and its audit trail (gw:audit); ARGV lane,
  -- jobs, key id, SHA-256 of the key, its tenant, the trail's cap. The check, the enqueue
  -- and the audit entry of each job are one step, so a key revoked, rotated, expired or
  -- narrowed a moment ago stores nothing: an error reply (NOKEY: not valid or expired;
  -- NOSCOPE: no submit scope), and nothing is written (not even an entry). A record
  -- without scopes or expires_ms (written before keys had them) has every scope and no
  -- expiry.
  function workers.enqueue_as(keys, args)
    local trail = table.remove(keys)
    local raw = redis.call('HGET', keys[#keys], args[EnqueueAsArg.KEY_ID])
    local record = raw and cjson.decode(raw)
    if not record or record.sha256 ~= args[EnqueueAsArg.KEY_HASH] or record.tenant ~= args[EnqueueAsArg.TENANT] then
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
    -- enqueue's arguments are this call's first, in their places (EnqueueArg)
    local out = enqueue(keys, {args[EnqueueAsArg.LANE], args[EnqueueAsArg.JOBS]})
    workers.audit_submits(trail, args[EnqueueAsArg.AUDIT_CAP], args[EnqueueAsArg.KEY_ID],
      args[EnqueueAsArg.TENANT], out)
    return out
  end

  -- One audit entry per job of enqueue's reply (id, code, detail per job), its fields
  -- as fairlane/store/audit.py writes them (same names, same order): the outcome, the
  -- reason the gateway answers, and the job id when a job is stored.
  function workers.audit_submits(trail, cap, key_id, tenant, out)
    for i = 1, #out, 3 do
      local id, code, detail = out[i], out[i + 1], out[i + 2]
      local outcome = 'refused'
      if code == Reply.ACCEPTED then
        outcome, detail = 'accepted', ''
      elseif code == Reply.DEFERRED then
        outcome = 'deferred'
      elseif code == Reply.EXISTING then
        outcome, detail = detail == 'deferred' and 'deferred' or 'accepted', 'existing'
      elseif code == Reply.DEADLINE_UNMEETABLE then
        outcome, detail, id = 'rejected', 'deadline_unmeetable', ''
      elseif code == Reply.REJECTED then
        outcome, detail, id = 'rejected', string.match(detail, '^[^|]*'), ''
      elseif code == Reply.CLASS_NOT_ENTITLED then
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
      local ok, fetched = pcall(cmsgpack.unpack, packed)
      if ok and type(fetched) == 'table' and type(fetched[Row.ID]) == 'string' then
        rows[#rows + 1] = fetched
      end
    end
    return rows
  end

  local NO_IDS = {}

  -- The leases of the attempts an exchange settled (`ids`) go once its new leases are
  -- written, from the lease set and the worker's set of leased ids, but for a job leased
  -- again in the same call (a retry due at once, a job handed back): its new lease stays.
  -- Dropped after rather than before the new ones are added, neither set empties between
  -- the two while a worker is busy, so the server keeps them in their large encodings,
  -- where adding and removing an id costs O(log n) or O(1); built up again from empty on
  -- each exchange, they would be listpacks, where each costs O(n).
  function workers.drop_leases(keys, p, worker, ids, jobs)
    if #ids == 0 then
      return
    end
    local again = nil
    for i = 1, #jobs do
      again = again or {}
      again[jobs[i][Row.ID]] = true
    end
    local gone = ids
    if again then
      gone = {}
      for i = 1, #ids do
        if not again[ids[i]] then
          gone[#gone + 1] = ids[i]
        end
      end
    end
    if #gone > 0 then
      redis.call('ZREM', keys[LEASES], unpack(gone))
      redis.call('SREM', leasing.worker_jobs(p, worker), unpack(gone))
    end
  end

  -- ARGV: msgpack [acks, worker, n, lease_ms, promote_limit, lanes, idle_ms, slots]. One
  -- round trip settles a worker's finished attempts and leases it the next batch: first
  -- what was handed to its inbox, then up to n more slots of work. `slots` is the
  -- worker's whole size, counted in its lanes' capacity. With idle_ms > 0 and nothing to give,
  -- the worker is registered idle for idle_ms (it is about to block on its inbox).
  -- Returns msgpack FetchReply [next_due_ms, ack codes, jobs, waiting weight (-1: no
  -- fetch was made, the inbox filled the ask)].
  local function exchange(keys, args)
    local p, now = prefix(keys), now_ms()
    local ex = cmsgpack.unpack(args[ExchangeArg.PACKED])
    local worker, n, lease = ex[Exchange.WORKER], ex[Exchange.WANT], ex[Exchange.LEASE_MS]
    local lanes, idle_ms = ex[Exchange.LANES], tonumber(ex[Exchange.IDLE_MS]) or 0
    local tally = new_effects()
    register_worker(keys, p, worker, tonumber(ex[Exchange.SLOTS]) or n, lanes, now)
    tally.unleased = NO_IDS
    local codes = apply_acks(keys, p, ex[Exchange.OUTCOMES], now, tally)
    local member = worker .. '|' .. lease
    for _, lane in ipairs(lanes) do
      redis.call('ZREM', lane_key(p, lane, 'idle'), member)
    end
    local inbox = inbox_key(p, worker)
    local raw = redis.call('LRANGE', inbox, 0, -1)
    local jobs, next_due, left, waiting = {}, -1, n, -1
    if #raw > 0 then
      redis.call('DEL', inbox)
    end
    local handed = inbox_rows(raw)
    for i = 1, #handed do
      left = left - (tonumber(handed[i][Row.SLOTS]) or 1)
    end
    if left > 0 then
      jobs, next_due, waiting =
        fetch(keys, p, worker, left, lease, ex[Exchange.PROMOTE_LIMIT], lanes, now, tally)
    end
    for i = #handed, 1, -1 do
      table.insert(jobs, 1, handed[i])
    end
    workers.drop_leases(keys, p, worker, tally.unleased, jobs)
    if #jobs == 0 and idle_ms > 0 then
      for _, lane in ipairs(lanes) do
        redis.call('ZADD', lane_key(p, lane, 'idle'), now + idle_ms, member)
      end
    end
    apply_effects(keys, p, tally, now)
    return cmsgpack.pack({[Fetch.NEXT_DUE_MS] = next_due, [Fetch.ACK_CODES] = codes, [Fetch.JOBS] = jobs,
      [Fetch.WAITING] = waiting})
  end

  -- ARGV: msgpack LeaveField [worker, lease_ms, lanes]. A stopping worker leaves: it is
  -- no longer idle nor alive, and the jobs handed to its inbox meanwhile are returned
  -- (still leased to it) so that it can hand them back.
  local function leave(keys, args)
    local p = prefix(keys)
    local leaving = cmsgpack.unpack(args[LeaveArg.PACKED])
    local worker = leaving[Leave.WORKER]
    local member = worker .. '|' .. leaving[Leave.LEASE_MS]
    for _, lane in ipairs(leaving[Leave.LANES]) do
      redis.call('ZREM', lane_key(p, lane, 'idle'), member)
    end
    deregister_worker(keys, p, worker)
    redis.call('ZREM', p .. 'beats', worker)
    redis.call('DEL', leasing.worker_jobs(p, worker))
    local inbox = inbox_key(p, worker)
    local jobs = inbox_rows(redis.call('LRANGE', inbox, 0, -1))
    redis.call('DEL', inbox)
    return cmsgpack.pack(jobs)
  end

  -- The acks of one exchange that settled (code 1) leave the worker's set of leased ids,
  -- in one command.
  function workers.forget_settled(p, worker, acks, codes)
    local ids = {}
    for i = 1, #codes do -- one code per ack apply_acks read (a numeric loop: no C call each)
      local ack = acks[i]
      if codes[i] == AckCode.APPLIED then
        ids[#ids + 1] = ack[Ack.ID]
      end
    end
    if #ids > 0 then
      redis.call('SREM', leasing.worker_jobs(p, worker), unpack(ids))
    end
  end

  -- ARGV: msgpack array of acks, then the worker that sends them (optional: its set of
  -- leased ids is kept up to date when given). Returns the codes as a plain array.
  local function ack(keys, args)
    local p, now, tally = prefix(keys), now_ms(), new_effects()
    local acks = cmsgpack.unpack(args[AckArg.OUTCOMES])
    local codes = apply_acks(keys, p, acks, now, tally)
    if args[AckArg.WORKER] then
      workers.forget_settled(p, args[AckArg.WORKER], acks, codes)
    end
    apply_effects(keys, p, tally, now)
    return codes
  end

  ---------------------------------------------------------------------------- leases

  -- ARGV: worker, lease_ms, then pairs (id, token). Extends every lease still held
  -- and records the worker's heartbeat. Returns {lost ids, ids whose cancellation was requested}.
  local function renew(keys, args)
    local p, now = prefix(keys), now_ms()
    local worker, lease = args[RenewArg.WORKER], tonumber(args[RenewArg.LEASE_MS])
    redis.call('ZADD', keys[WORKERS], now, worker)
    local lost, cancel = {}, {}
    for i = RenewArg.FIRST_HELD, #args, 2 do
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
  workers.DEAD_ERR = '{"type":"WorkerLost","message":"the worker running attempt %d stopped beating: it died or lost the server","traceback":""}'
  workers.RECLAIM = {'st', 'att', 'max', 'bo', 'lane', 'cls', 'sl', 'ttok', 'cu', 'wk', 'start', 'qw'}

  -- Take a running job back from its worker (f: its record's workers.RECLAIM fields), whose
  -- lease ran out or who stopped beating (`err`): the lost attempt counts; the job is
  -- retried after its backoff, or dead-lettered when it has no attempts left. Its lease
  -- entry is the caller's to drop.
  function workers.reclaim_job(keys, p, id, f, err, now, tally, retried, dead)
    local jk = job_key(p, id)
    -- fields enqueue left out at their defaults (core.lua)
    f[3], f[5] = f[3] or core.DEFAULT_MAX, f[5] or core.DEFAULT_LANE
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
  function workers.forget_worker(keys, p, worker)
    deregister_worker(keys, p, worker)
    redis.call('ZREM', p .. 'beats', worker)
    redis.call('DEL', leasing.worker_jobs(p, worker), inbox_key(p, worker))
  end

  -- ARGV: limit, random seed, stale_worker_ms. Reclaims up to `limit` expired leases:
  -- each counts as an attempt; a job out of attempts is dead-lettered, others are
  -- retried after their backoff. Also trims retention indexes by age.
  -- Returns {reclaimed ids, dead-lettered ids}.
  local function sweep(keys, args)
    local p, now = prefix(keys), now_ms()
    local limit = tonumber(args[SweepArg.LIMIT])
    math.randomseed(tonumber(args[SweepArg.SEED]))
    local expired = redis.call('ZRANGE', keys[LEASES], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
    local retried, dead, tally = {}, {}, new_effects()
    for _, id in ipairs(expired) do
      redis.call('ZREM', keys[LEASES], id)
      local f = redis.call('HMGET', job_key(p, id), unpack(workers.RECLAIM))
      if f[1] == 'running' then
        if f[10] then
          redis.call('SREM', leasing.worker_jobs(p, f[10]), id)
        end
        workers.reclaim_job(keys, p, id, f, LOST_ERR, now, tally, retried, dead)
      end
    end
    apply_effects(keys, p, tally, now)
    local stale = redis.call('ZRANGE', keys[WORKERS], '-inf', now - tonumber(args[SweepArg.STALE_WORKER_MS]), 'BYSCORE',
      'LIMIT', 0, limit)
    for _, worker in ipairs(stale) do
      workers.forget_worker(keys, p, worker)
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
  -- to `limit` of the jobs leased to it are taken back now (workers.reclaim_job), not when
  -- their leases run out; once none is left it is forgotten. Only workers that beat are
  -- judged so (one that does not, an older release say, keeps its leases). Returns
  -- {reclaimed ids, dead-lettered ids, the dead workers looked at}.
  function workers.beat(keys, args)
    local p, now = prefix(keys), now_ms()
    local worker, dead_ms, limit = args[BeatArg.WORKER], tonumber(args[BeatArg.DEAD_MS]),
      tonumber(args[BeatArg.LIMIT])
    math.randomseed(tonumber(args[BeatArg.SEED]))
    local bk = p .. 'beats'
    redis.call('ZADD', bk, now, worker)
    local silent = redis.call('ZRANGE', bk, '-inf', now - dead_ms, 'BYSCORE', 'LIMIT', 0, 2)
    local retried, dead, gone, tally = {}, {}, {}, new_effects()
    for _, w in ipairs(silent) do
      local left = limit - #retried - #dead
      if w ~= worker and left > 0 then
        gone[#gone + 1] = w
        local wk = leasing.worker_jobs(p, w)
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
          local f = redis.call('HMGET', job_key(p, id), unpack(workers.RECLAIM))
          if f[1] == 'running' and f[10] == w then
            redis.call('ZREM', keys[LEASES], id)
            workers.reclaim_job(keys, p, id, f, workers.DEAD_ERR, now, tally, retried, dead)
          end
        end
        if #seen == #ids then
          workers.forget_worker(keys, p, w)
        else
          core.chunked('SREM', wk, seen)
        end
      end
    end
    apply_effects(keys, p, tally, now)
    return {retried, dead, gone}
  end

  workers.ack = ack
  workers.exchange = exchange
  workers.leave = leave
  workers.renew = renew
  workers.sweep = sweep
end
