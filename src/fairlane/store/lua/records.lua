-- Job records once they settle: retention trimming, per-call effects, finishing,
-- dead letters, expiry, and retries with backoff.
--
-- Keys: job:<id>, ev:<id>, kept:<task>:<outcome> and its side set, done, gone,
--   run:<id>:log, lane:<l>:delayed|dl, lane:<l>:c:<c>:dfair|starts, KEYS[DEAD], KEYS[IDEM],
--   KEYS[STATS], KEYS[WEIGHTS]
-- Calls: core, rates, fairqueue, fairkeys, admission, runs
-- Entry points: records.{DEFAULT_RETENTION, EXPIRED_ERR, GONE, GONE_MAX, add_counts,
--   apply_effects, backoff_ms, count, count_start, dead_letter, expire, finish, links_key, mark_gone,
--   new_effects, push_back, readmit_class, remove_records, schedule_retry, trim}

local records = {}

do
  local DEAD, DEFAULT_CLASS, IDEM, STATS = core.DEAD, core.DEFAULT_CLASS, core.IDEM, core.STATS
  local WEIGHTS, error_type, ev_key, job_key = core.WEIGHTS, core.error_type, core.ev_key, core.job_key
  local lane_key, log_event, wake = core.lane_key, core.log_event, core.wake
  local class_key, give_back_offers = fairqueue.class_key, fairqueue.give_back_offers
  local push_ready = fairqueue.push_ready
  local admission_of, deferral, release_reservation = admission.admission_of, admission.deferral, admission.release_reservation
  local reserve, room_for = admission.reserve, admission.room_for
  local drop_run_keys, notify_parent, run_key = runs.drop_run_keys, runs.notify_parent, runs.run_key

  -- defined below: admitting a deferred job may expire it instead
  local admit_deferred

  local function split2(spec)
    local a, b = string.match(spec, '^(-?%d+),(-?%d+)$')
    return tonumber(a), tonumber(b)
  end

  -- The side set of a retention index: the ids kept there whose removal takes more than
  -- deleting their keys (an idempotency key to release, a run's keys to drop). Only such
  -- records are read again when trimmed; the others go in one DEL.
  function records.links_key(idx)
    return idx .. ':links'
  end

  -- Remove trimmed records: `ids` popped from the retention index `idx`.
  function records.remove_records(keys, p, idx, ids, failed)
    if #ids == 0 then
      return
    end
    local lk = records.links_key(idx)
    local linked = redis.call('EXISTS', lk) == 1 and redis.call('SMISMEMBER', lk, unpack(ids))
    local doomed = {}
    for i = 1, #ids do -- a numeric loop: ipairs costs a C call per job
      local id = ids[i]
      local jk = job_key(p, id)
      if linked and linked[i] == 1 then
        local f = redis.call('HMGET', jk, 'idem', 'wfr')
        if f[1] and redis.call('HGET', keys[IDEM], f[1]) == id then
          redis.call('HDEL', keys[IDEM], f[1])
        end
        if f[2] then
          drop_run_keys(p, id)
        end
        redis.call('SREM', lk, id)
      end
      doomed[#doomed + 1] = jk
      doomed[#doomed + 1] = ev_key(p, id)
    end
    if failed then
      redis.call('ZREM', keys[DEAD], unpack(ids))
    end
    core.chunked('DEL', nil, doomed)
  end

  -- What retention removed, so that a reader asking for a trimmed job is told why
  -- (`gone`: job id -> removal ms * 4 + records.GONE code), the newest GONE_MAX kept.
  records.GONE_MAX = 10000
  records.GONE = {ok_count = 0, ok_age = 1, failed_count = 2, failed_age = 3}

  function records.mark_gone(p, ids, now, code)
    local gk, zargs, score = p .. 'gone', {}, now * 4 + code
    for i = 1, #ids do -- a numeric loop: ipairs costs a C call per job
      local id = ids[i]
      zargs[2 * i - 1] = score
      zargs[2 * i] = id
    end
    core.chunked('ZADD', gk, zargs)
    redis.call('ZREMRANGEBYRANK', gk, 0, -records.GONE_MAX - 1)
  end

  -- Add `counts` (name -> n) to the counters of hash `key`: one HINCRBY for one counter,
  -- else one read and one write for them all (a call counts several: settled, completed,
  -- the units it used), which nothing can interleave inside a script.
  function records.add_counts(key, counts)
    local names = {}
    for name in pairs(counts) do
      names[#names + 1] = name
    end
    if #names == 1 then
      redis.call('HINCRBY', key, names[1], counts[names[1]])
    elseif #names > 1 then
      local now, hargs = redis.call('HMGET', key, unpack(names)), {}
      for i, name in ipairs(names) do
        hargs[2 * i - 1] = name
        hargs[2 * i] = core.int((tonumber(now[i]) or 0) + counts[name])
      end
      redis.call('HSET', key, unpack(hargs))
    end
  end

  -- Bounded trim of one retention index: at most `budget` records per call, so the
  -- cost per finished job stays constant and the index still converges to its bounds.
  local function trim(keys, p, idx, spec, now, budget)
    local count, age = split2(spec)
    local failed = string.sub(idx, -7) == ':failed'
    local outcome = failed and 'failed_' or 'ok_'
    if count and count >= 0 then
      local over = redis.call('ZCARD', idx) - count
      if over > 0 then
        local popped = redis.call('ZPOPMIN', idx, math.min(over, budget))
        local ids = {}
        for i = 1, #popped, 2 do
          ids[#ids + 1] = popped[i]
        end
        records.remove_records(keys, p, idx, ids, failed)
        records.mark_gone(p, ids, now, records.GONE[outcome .. 'count'])
      end
    end
    if age and age >= 0 then
      local old = redis.call('ZRANGE', idx, '-inf', now - age, 'BYSCORE', 'LIMIT', 0, budget)
      if #old > 0 then
        redis.call('ZREM', idx, unpack(old))
        records.remove_records(keys, p, idx, old, failed)
        records.mark_gone(p, old, now, records.GONE[outcome .. 'age'])
      end
    end
  end

  -- Effects gathered during one call and written once at its end, so that a batch
  -- costs one command per effect instead of one per job: counters, and finished jobs
  -- to add to each retention index.
  local function new_effects()
    return {counts = {}, kept = {}, readmit = {}, any = {}, kept_keys = {}, large = {}}
  end

  local function count(fx, name, n)
    fx.counts[name] = (fx.counts[name] or 0) + (n or 1)
  end

  -- A class's starts by the second (fairlane/policy/starts.py), so that `explain` can tell
  -- a job how many retries of other jobs took its class's slots while it waited: hash
  -- lane:<l>:c:<c>:starts, a field per second of server time holding that second's starts
  -- plus RETRY_START times its retry starts (an attempt after the first), so that one
  -- HINCRBY counts both. Dispatch counts each job it starts into the call's effects
  -- (`count_start`: no command, `fx.starts` made on a call's first start); the call writes
  -- one HINCRBY per lane and class that started any (`write_starts`). A second's first write drops the second that leaves the
  -- ring, and seconds skipped leave a stale field or a few, swept once the hash holds more
  -- than the ring: it never holds more than STARTS_BUCKETS + 1 fields.
  local STARTS_WIDTH_MS, STARTS_BUCKETS = __STARTS_WIDTH_MS__, __STARTS_BUCKETS__
  local RETRY_START = __RETRY_START__

  -- fx.starts[lane][cls]: nested, as fairqueue.add_settled says why
  function records.count_start(fx, lane, cls, att)
    fx.starts = fx.starts or {}
    local by_class = fx.starts[lane]
    if not by_class then
      by_class = {}
      fx.starts[lane] = by_class
    end
    by_class[cls] = (by_class[cls] or 0) + (att and (tonumber(att) or 0) > 0 and RETRY_START + 1 or 1)
  end

  -- The starts of one lane and class into the second `index` of their ring.
  local function write_start(p, lane, cls, index, n)
    local key = class_key(p, lane, cls, 'starts')
    if redis.call('HINCRBY', key, core.int(index), core.int(n)) == n then
      redis.call('HDEL', key, core.int(index - STARTS_BUCKETS))
      if redis.call('HLEN', key) > STARTS_BUCKETS then
        local old = {}
        for _, f in ipairs(redis.call('HKEYS', key)) do
          if (tonumber(f) or 0) <= index - STARTS_BUCKETS then
            old[#old + 1] = f
          end
        end
        core.chunked('HDEL', key, old)
      end
    end
  end

  local function write_starts(p, fx, now)
    if not fx.starts then
      return
    end
    local index = math.floor(now / STARTS_WIDTH_MS)
    for lane, by_class in pairs(fx.starts) do
      for cls, n in pairs(by_class) do
        write_start(p, lane, cls, index, n)
      end
    end
  end

  -- `linked`: removing the record takes more than deleting its keys (links_key).
  local function keep(fx, idx, spec, id, linked)
    local k = fx.kept[idx]
    if not k then
      k = {spec = spec or '-1,-1', ids = {}}
      fx.kept[idx] = k
    end
    k.ids[#k.ids + 1] = id
    if linked then
      k.links = k.links or {}
      k.links[#k.links + 1] = id
    end
  end

  local function apply_effects(keys, p, fx, now)
    -- first, as admitting deferred work may settle some of it (counted below)
    for lane in pairs(fx.readmit) do
      admit_deferred(keys, p, lane, now, fx)
    end
    records.add_counts(keys[STATS], fx.counts)
    write_starts(p, fx, now)
    for idx, k in pairs(fx.kept) do
      local zargs, at = {}, core.now_arg(now)
      for i, id in ipairs(k.ids) do
        zargs[2 * i - 1] = at
        zargs[2 * i] = id
      end
      redis.call('ZADD', idx, unpack(zargs))
      if k.links then
        redis.call('SADD', records.links_key(idx), unpack(k.links))
      end
      -- trims at most a few more records than it adds, so a steady flow stays bounded
      trim(keys, p, idx, k.spec, now, #k.ids + 10)
    end
  end

  -- Settle a job for good. `meta` holds its task, rc, rf, w, mu, lane, cls, tenant, par,
  -- wfr, toff and idem fields (and `amu`, what the attempt used, `use`, what it reported
  -- of its time in model and tool calls) when the caller already read them (the hot path);
  -- otherwise they are read here. A reservation the job held is released.
  -- What a job's record holding no retention keeps (enqueue leaves the default out):
  -- 'rc|rf' as a task's declaration stores it.
  records.DEFAULT_RETENTION = '__DEFAULT_RETENTION__'
  -- its two halves, for a record that leaves them out
  local DEFAULT_RC, DEFAULT_RF = '__DEFAULT_RC__', '__DEFAULT_RF__'

  -- The retention indexes of a task's ends, made once per call ({ok, failed}).
  local function kept_keys(fx, p, task)
    local k = fx.kept_keys[task]
    if not k then
      local base = p .. 'kept:' .. task
      k = {base .. ':ok', base .. ':failed'}
      fx.kept_keys[task] = k
    end
    return k
  end

  local function finish(keys, p, id, status, field, payload, now, tally, meta)
    local jk = job_key(p, id)
    -- what the attempt used (`amu`) and reported (`use`, acks.lua) ride on this write
    local amu, use, fin = meta and meta.amu, meta and meta.use, core.now_arg(now)
    if field and amu and not use then
      -- the hot path's end (a completion that reported no time): no table to unpack
      redis.call('HSET', jk, 'st', status, 'fin', fin, field, payload, 'amu', core.arg(amu))
    elseif field and (amu or use) then
      local hargs = {'st', status, 'fin', fin, field, payload}
      if amu then
        hargs[#hargs + 1], hargs[#hargs + 2] = 'amu', core.arg(amu)
      end
      if use then
        hargs[#hargs + 1], hargs[#hargs + 2] = 'use', use
      end
      redis.call('HSET', jk, unpack(hargs))
    elseif field then
      redis.call('HSET', jk, 'st', status, 'fin', fin, field, payload)
    else
      redis.call('HSET', jk, 'st', status, 'fin', fin)
    end
    count(tally, status)
    -- no event: the record's st, fin and err say how and when it ended
    if not meta then
      meta = redis.call('HMGET', jk, 'task', 'rc', 'rf', 'w', 'mu', 'lane', 'cls', 'tenant', 'par',
        'wfr', 'toff', 'idem', 'dl')
      meta[6], meta[8] = meta[6] or core.DEFAULT_LANE, meta[8] or core.DEFAULT_TENANT
    end
    if meta[11] then
      -- a job a throttle key woke (cancelled or expired while back in its queue) gives its
      -- offers back; the hot path's settled jobs ran, so they hold none
      give_back_offers(keys, p, id, now)
    end
    if meta[9] then
      notify_parent(p, meta[9], id, status, payload, now)
    end
    if meta[10] then
      redis.call('RPUSH', run_key(p, id, 'log'), cmsgpack.pack({'end', status, now}))
    end
    if meta[5] then
      release_reservation(p, id, meta[6], meta[7] or DEFAULT_CLASS, meta[8] or '', meta[5], tally)
    end
    local task = meta[1] or '' -- a corrupt record without a task name must still settle
    local linked = meta[10] or meta[12]
    local rc, rf = meta[2], meta[3]
    if not (rc and rf) then
      rc, rf = DEFAULT_RC, DEFAULT_RF
    end
    local idx = kept_keys(tally, p, task)
    if status == 'completed' then
      keep(tally, idx[1], rc, id, linked)
    else
      keep(tally, idx[2], rf, id, linked)
    end
    if meta[4] then
      redis.call('PUBLISH', p .. 'done', id)
    end
    if meta[13] and meta[6] then
      redis.call('ZREM', lane_key(p, meta[6], 'dl'), id)
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

  -- Schedule a retry `delay` ms from now, unless that is past the job's deadline (`what`:
  -- the event and counter, 'retry' unless it is a pushback by `key` or a hand-back; `use`:
  -- what the attempt reported of its time, acks.lua, kept in the event).
  local function schedule_retry(keys, p, id, delay, err, now, tally, what, key, use)
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'dl', 'lane', 'mu', 'cls', 'tenant', 'start', 'wk', 'att',
      'qw')
    f[2], f[5] = f[2] or core.DEFAULT_LANE, f[5] or core.DEFAULT_TENANT
    local run_at = now + delay
    -- a deadline that is not a number is no deadline here; the next lease dead-letters it
    if tonumber(f[1]) and run_at > tonumber(f[1]) then
      redis.call('HSET', jk, 'err', err)
      expire(keys, p, id, EXPIRED_ERR, now, tally)
      return 'expired'
    end
    if f[3] then
      -- a retry is new demand: it gives its reservation back now and passes the gate
      -- again when it is due
      release_reservation(p, id, f[2], f[4] or DEFAULT_CLASS, f[5] or '', f[3], tally)
      redis.call('HSET', jk, 'readmit', f[3])
    end
    redis.call('HSET', jk, 'st', 'scheduled', 'run', run_at, 'err', err)
    redis.call('ZADD', lane_key(p, f[2], 'delayed'), run_at, id)
    -- the next attempt overwrites start, wk, att and qw: the event keeps this attempt's
    log_event(p, id, now, what or 'retry', {delay = delay, err = error_type(err), at = run_at,
      start = tonumber(f[6]), wk = f[7] or nil, att = tonumber(f[8]),
      qw = f[9] ~= '' and f[9] or nil, key = key, use = use})
    count(tally, what == 'pushback' and 'pushed_back' or what == 'handback' and 'handed_back'
      or 'retried')
    -- the retry may be due sooner than a blocked worker's timeout: wake one to re-read it
    wake(p, f[2])
    return 'scheduled'
  end

  -- A pushback (Throttled on a key the job holds): the job is due again when the key's
  -- pause ends, its attempt given back, up to rates.MAX_PUSHBACKS pushbacks; past them a
  -- pushback is a failed attempt like any other (its budget applies).
  function records.push_back(keys, p, id, delay, err, now, tally, meta, key, use)
    local jk = job_key(p, id)
    local v = redis.call('HMGET', jk, 'pb', 'att', 'max')
    local pushes = (tonumber(v[1]) or 0) + 1
    if pushes > rates.MAX_PUSHBACKS then
      if (tonumber(v[2]) or 0) >= (tonumber(v[3] or core.DEFAULT_MAX) or 1) then
        dead_letter(keys, p, id, err, now, tally, meta)
        return 'failed'
      end
      return schedule_retry(keys, p, id, delay, err, now, tally, nil, nil, use)
    end
    redis.call('HSET', jk, 'pb', pushes)
    -- logged with the attempt it ended, then the attempt is given back
    local verdict = schedule_retry(keys, p, id, delay, err, now, tally, 'pushback', key, use)
    redis.call('HINCRBY', jk, 'att', -1)
    return verdict
  end

  -- The backoff of fairlane/policy/backoff.py: min(cap, base * 2^(n-1)) with jitter u in [0,1).
  local function backoff_ms(spec, attempt, u)
    -- an absent spec is the default (enqueue leaves it out of the record)
    local base, cap, jitter = string.match(spec or core.DEFAULT_BACKOFF, '^([^,]+),([^,]+),(%a+)$')
    base, cap = tonumber(base), tonumber(cap)
    -- a spec that does not parse (a record corrupted while it ran): retry at once
    if not (base and cap and base == base and cap == cap) then
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

  -- One readmission pass over a class's deferred queue (fair deferral: the contract's Fair
  -- deferral, fairlane/policy/admission/deferral.py): heads by their tenants' fair tags,
  -- a head that does not fit passed over for the pass, a held class's pinned head alone,
  -- at most deferral.PASS_BUDGET heads. A job no longer deferred (cancelled) leaves
  -- uncharged; one whose deadline passed while it waited is expired and spends nothing.
  function records.readmit_class(keys, p, lane, cfg, cls, now, fx, weights)
    if redis.call('EXISTS', class_key(p, lane, cls, 'dfair')) == 0 then
      return
    end
    local ps = deferral.pass(p, lane, cls, keys[WEIGHTS], weights)
    while true do
      local id, tenant, held = deferral.next(ps)
      if not tenant then
        break
      end
      local jk = job_key(p, id or '')
      local f = id and redis.call('HMGET', jk, 'st', 'tenant', 'dmu', 'dl', 'run', 'prio', 'seq',
        'sl', 'retry', 'fk', 'enq') or {}
      f[5] = f[5] or f[11] -- an absent run is enq
      local mu = tonumber(f[3]) or 0
      local late = f[4] and tonumber(f[4]) and tonumber(f[4]) <= now
      if not id or f[1] ~= 'deferred' or late then
        if id then
          deferral.take(ps, id, tenant, mu, false)
        else -- an empty group left active (never written so): the tenant leaves
          redis.call('ZREM', ps.fair, tenant)
        end
        if late and f[1] == 'deferred' then
          expire(keys, p, id, EXPIRED_ERR, now, fx)
        end
      elseif room_for(p, lane, cfg, cls, tenant, mu, f[9] ~= '1', true) ~= 'accepted' then
        if held then
          break
        end
        deferral.pass_over(ps, id, tenant, deferral.ever_fits(cfg, cls, mu, f[9] ~= '1'))
      else
        deferral.take(ps, id, tenant, mu, true)
        reserve(p, lane, cls, tenant, id, mu)
        redis.call('HDEL', jk, 'dmu', 'retry')
        count(fx, 'admitted')
        log_event(p, id, now, 'admitted', {at = tonumber(f[5]) or now})
        if (tonumber(f[5]) or now) > now then
          redis.call('HSET', jk, 'st', 'scheduled')
          redis.call('ZADD', lane_key(p, lane, 'delayed'), tonumber(f[5]), id)
        elseif f[10] and f[9] ~= '1' then
          -- a keyed job entering its tenant's queue for the first time takes its key's fair
          -- order number now (fairkeys.lua); a retry keeps the order it has
          f[7] = fairkeys.order(p, lane, cls, tenant, f[10], tonumber(f[7]))
          redis.call('HSET', jk, 'st', 'queued', 'seq', f[7])
          push_ready(p, lane, cls, tenant, id, f[6], f[7], f[8])
        else
          redis.call('HSET', jk, 'st', 'queued')
          push_ready(p, lane, cls, tenant, id, f[6], f[7], f[8])
        end
        wake(p, lane)
      end
    end
    deferral.end_pass(ps)
  end

  -- Admit a lane's deferred jobs that fit, classes in declared order, each class by fair
  -- deferral (readmit_class).
  admit_deferred = function(keys, p, lane, now, fx)
    local cfg = admission_of(keys, p, lane)
    if not cfg then
      return
    end
    local weights = {}
    for _, c in ipairs(cfg.utable) do
      records.readmit_class(keys, p, lane, cfg, c[ClassRow.NAME], now, fx, weights)
    end
  end

  records.EXPIRED_ERR = EXPIRED_ERR
  records.apply_effects = apply_effects
  records.backoff_ms = backoff_ms
  records.count = count
  records.dead_letter = dead_letter
  records.expire = expire
  records.finish = finish
  records.new_effects = new_effects
  records.schedule_retry = schedule_retry
  records.trim = trim
end
