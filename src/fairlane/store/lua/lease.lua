-- Handing jobs out: promotion of due scheduled jobs, checks on a popped record,
-- leases with fencing tokens, and direct hand-off to idle workers.
--
-- Keys: job:<id>, inbox:<worker>, wj:<worker>, lane:<l>:delayed|idle|state,
--   lane:<l>:c:<c>:vt, KEYS[FENCE] (tokens), KEYS[LEASES]
-- Calls: core, classes, fairqueue, fairkeys, admission, records, estimating
-- Entry points: leasing.{NOT_ENTITLED_ERR, RUNNABLE, backoff_ok, finite_ok,
--   hand_off, inbox_key, lease_jobs, limits_ok, lost_class, peek_idle_worker,
--   promote_due, rates_ok, read_runnable, runnable, slots_ok, text_ok, to_ok, whole_ok,
--   worker_jobs, write_keyed}

local leasing = {}

do
  local DEFAULT_CLASS, FENCE, LEASES = core.DEFAULT_CLASS, core.FENCE, core.LEASES
  local job_key, lane_key, log_event = core.job_key, core.lane_key, core.log_event
  local class_index, class_table = classes.class_index, classes.class_table
  local class_key, push_ready, release_throttle = fairqueue.class_key, fairqueue.push_ready, fairqueue.release_throttle
  local take_back_offers, work_of = fairqueue.take_back_offers, fairqueue.work_of
  local admission_of, defer, reserve = admission.admission_of, admission.defer, admission.reserve
  local room_for = admission.room_for
  local EXPIRED_ERR, count, dead_letter = records.EXPIRED_ERR, records.count, records.dead_letter
  local expire = records.expire
  local expected_ms = estimating.expected_ms
  local DEADLINE_SAFETY = __DEADLINE_SAFETY__
  local UNMEETABLE_ERR = '{"type":"DeadlineUnmeetable","message":"expected to run %d ms '
    .. '(its learned length), and %d ms were left before its deadline","traceback":""}'

  -- Why a job with deadline `dl` cannot start at `now`: the deadline has passed, or its
  -- learned length no longer fits before it (fairlane.policy.startpredict.unmeetable);
  -- nil when it can. Only a job with a deadline pays the one read.
  local function too_late(p, task, tenant, dl, now)
    if dl < now then
      return EXPIRED_ERR
    end
    local expected = expected_ms(p, task, tenant)
    if expected and now > dl - expected * DEADLINE_SAFETY then
      return string.format(UNMEETABLE_ERR, expected, dl - now)
    end
    return nil
  end

  -- Whether a due job's class is restricted and its tenant no longer entitled to it (the
  -- entitlement lifted since the job was admitted): a retry, or a job scheduled for later,
  -- passes enqueue's gate again when it enters its queue. The lane's table is read once
  -- per call (`memo`), and only when a job is due.
  function leasing.lost_class(keys, p, lane, cls, tenant, fx, memo)
    memo.tbl = memo.tbl or class_table(lane_key(p, lane, 'state'))
    local i = class_index(memo.tbl, cls)
    if not i or memo.tbl[i][ClassRow.RESTRICTED] ~= 1 then
      return false
    end
    return not classes.may_use(memo.tbl[i], classes.entitlement(fx, keys, p, memo.seen, tenant))
  end

  leasing.NOT_ENTITLED_ERR = '{"type":"ClassNotEntitled","message":"the job\'s class is restricted and its tenant is no longer entitled to it, so it was not run again: entitle the tenant (app.tenants.configure(tenant, classes=[...])) or submit it in another class","traceback":""}'

  local function promote_due(keys, p, lane, now, limit, tally)
    local dk = lane_key(p, lane, 'delayed')
    local due = redis.call('ZRANGE', dk, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
    local memo = {seen = {}}
    for _, id in ipairs(due) do
      redis.call('ZREM', dk, id)
      local jk = job_key(p, id)
      -- pcall: a job key of the wrong type reads as no record, so it is only unlisted
      local f = redis.pcall('HMGET', jk, 'st', 'tenant', 'prio', 'seq', 'cls', 'sl', 'readmit',
        'att', 'fk')
      local cls = f[5] or DEFAULT_CLASS
      f[2] = f[2] or core.DEFAULT_TENANT
      local cfg = f[7] and f[1] == 'scheduled' and admission_of(keys, p, lane)
      if f[1] == 'scheduled' and leasing.lost_class(keys, p, lane, cls, f[2], tally, memo) then
        if f[7] then
          redis.call('HDEL', jk, 'readmit')
        end
        dead_letter(keys, p, id, leasing.NOT_ENTITLED_ERR, now, tally)
      elseif cfg then
        -- a retry passes the gate again; it is durable already, so it waits rather than fail
        redis.call('HDEL', jk, 'readmit')
        local mu = tonumber(f[7])
        local why = room_for(p, lane, cfg, cls, f[2], mu, false)
        if why == 'accepted' then
          reserve(p, lane, cls, f[2], id, mu)
          redis.call('HSET', jk, 'st', 'queued')
          log_event(p, id, now, 'due', {})
          push_ready(p, lane, cls, f[2], id, f[3], f[4], f[6])
        else
          redis.call('HSET', jk, 'dmu', mu, 'retry', '1')
          log_event(p, id, now, 'due', {v = 'deferred', why = why, cls = cls})
          defer(p, lane, cls, id, f[4])
        end
      elseif f[1] == 'scheduled' then
        redis.call('HDEL', jk, 'readmit')
        -- a keyed job entering its tenant's queue for the first time (attempt 0: a retry
        -- keeps the order it has) takes its key's fair order number now (fairkeys.lua);
        -- a job without a key costs no command more
        if f[9] and (tonumber(f[8]) or 0) == 0 then
          f[4] = fairkeys.order(p, lane, cls, f[2], f[9], tonumber(f[4]))
          redis.call('HSET', jk, 'st', 'queued', 'seq', f[4])
        else
          redis.call('HSET', jk, 'st', 'queued')
        end
        log_event(p, id, now, 'due', {})
        push_ready(p, lane, cls, f[2], id, f[3], f[4], f[6])
      end
    end
  end

  -- %s: the first field found unusable (field names are plain ASCII: no JSON escaping)
  local MALFORMED_ERR = '{"type":"MalformedJob","message":"the stored job record is incomplete or corrupt (field %s); it was not executed","traceback":""}'

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

  -- `v` as a number when it is one and finite (tonumber takes 'inf' and 'nan' too; n - n
  -- is 0 for a finite n only).
  local function finite(v)
    local n = tonumber(v)
    if n and n - n == 0 then
      return n
    end
    return nil
  end

  local function whole(v)
    local n = tonumber(v)
    return n ~= nil and n - n == 0 and n % 1 == 0
  end

  local JITTERS = {full = true, equal = true, none = true}

  -- 'base,cap,jitter' as Backoff.encode writes it ('' is the default); the cap may be infinite.
  local function backoff_ok(spec)
    local base, cap, jitter = string.match(spec, '^([^,]+),([^,]+),(%a+)$')
    base, cap = tonumber(base), tonumber(cap)
    return base ~= nil and base == base and base >= 0 and cap ~= nil and cap == cap
      and cap >= 0 and JITTERS[jitter] == true
  end

  -- A packed {{key, limit}, ..} list, as enqueue stores it; dispatch unpacks it as is.
  -- A 'lim' (each entry a key and 1 or 2 numbers) or, with `rate` set, an 'rk' list (a
  -- key and 4 numbers, the rate's 3 above 0).
  local function limits_ok(raw, rate)
    local ok, limits = pcall(cmsgpack.unpack, raw)
    if not ok or type(limits) ~= 'table' then
      return false
    end
    local n = 0
    for _ in pairs(limits) do
      n = n + 1
    end
    if n ~= #limits then
      return false
    end
    for _, kl in ipairs(limits) do
      -- a limit's first three places are a rate's too (LimitField): checked once for both
      if type(kl) ~= 'table' or type(kl[Limit.KEY]) ~= 'string' or not utf8_ok(kl[Limit.KEY])
        or not finite(kl[Limit.LIMIT]) or (kl[Limit.MIN] ~= nil and not finite(kl[Limit.MIN])) then
        return false
      end
      if rate and not (finite(kl[RateKey.BURST]) and finite(kl[RateKey.UNITS])
        and tonumber(kl[RateKey.LIMIT]) > 0 and tonumber(kl[RateKey.PER_MS]) > 0
        and tonumber(kl[RateKey.BURST]) > 0) then
        return false
      end
    end
    return true
  end

  leasing.text_ok = core.memoised(utf8_ok)
  leasing.whole_ok = core.memoised(whole)
  leasing.finite_ok = core.memoised(function(v) return finite(v) ~= nil end)
  leasing.to_ok = core.memoised(function(v) return finite(v) ~= nil and tonumber(v) >= 0 end)
  leasing.slots_ok = core.memoised(function(v) return whole(v) and tonumber(v) >= 1 end)
  leasing.backoff_ok = core.memoised(function(v) return v == '' or (utf8_ok(v) and backoff_ok(v)) end)
  leasing.limits_ok = core.memoised(function(v) return limits_ok(v) end)
  leasing.rates_ok = core.memoised(function(v) return limits_ok(v, true) end)

  -- What makes a queued job's record (as `runnable` reads it) unusable, field by field in
  -- the order they are checked: text the worker decodes strictly, numbers it decodes as
  -- integers, specs the scripts parse. Each entry: its place in the record (`at`), its
  -- name, whether it must be there, whether its value is sound (`ok`), whether it repeats
  -- from job to job. Absent optional fields fall back to their defaults where read.
  local function is_finite(v)
    return finite(v) ~= nil
  end

  local SOUND = {
    {at = 2, name = 'task', needed = true, ok = leasing.text_ok, repeats = true},
    {at = 3, name = 'args', needed = true, ok = utf8_ok, repeats = false},
    {at = 4, name = 'max', needed = false, ok = leasing.whole_ok, repeats = true},
    {at = 16, name = 'dl', needed = false, ok = whole, repeats = false},
    {at = 5, name = 'to', needed = false, ok = leasing.to_ok, repeats = true},
    -- not memoised: between many tenants nearly every one is new (unsound_field)
    {at = 6, name = 'tenant', needed = false, ok = utf8_ok, repeats = true},
    {at = 7, name = 'bo', needed = false, ok = leasing.backoff_ok, repeats = true},
    {at = 8, name = 'enq', needed = false, ok = leasing.whole_ok, repeats = false},
    {at = 9, name = 'att', needed = false, ok = leasing.whole_ok, repeats = false},
    {at = 10, name = 'sl', needed = false, ok = leasing.slots_ok, repeats = true},
    {at = 11, name = 'cls', needed = false, ok = leasing.text_ok, repeats = true},
    {at = 17, name = 'lim', needed = false, ok = leasing.limits_ok, repeats = false},
    {at = 12, name = 'prio', needed = false, ok = leasing.finite_ok, repeats = true},
    {at = 13, name = 'seq', needed = false, ok = is_finite, repeats = false},
    {at = 14, name = 'cu', needed = false, ok = leasing.finite_ok, repeats = true},
    {at = 23, name = 'rk', needed = false, ok = leasing.rates_ok, repeats = false},
    {at = 24, name = 'rmu', needed = false, ok = is_finite, repeats = false},
  }
  -- the entries of the fields that do not repeat; and those with the tenant's, in order
  local SOUND_OTHERS, SOUND_TENANT = {}, {}
  for i = 1, #SOUND do
    if not SOUND[i].repeats then
      SOUND_OTHERS[#SOUND_OTHERS + 1] = SOUND[i]
    end
    if not SOUND[i].repeats or SOUND[i].at == 6 then
      SOUND_TENANT[#SOUND_TENANT + 1] = SOUND[i]
    end
  end

  -- The first unusable field of `checks` in record `f`, nil when none is.
  local function first_unsound(f, checks)
    for i = 1, #checks do
      local check = checks[i]
      local v = f[check.at]
      if (not v and check.needed) or (v and not check.ok(v)) then
        return check.name
      end
    end
    return nil
  end

  -- The repeating fields of the last sound record: a record holding the very same values
  -- has them sound too, so only its other fields are checked, in the same order (the
  -- field named is the same). Most jobs of a batch repeat the one before; between many
  -- tenants, all but the tenant does, and only the tenant is checked with the others.
  local seen_task, seen_max, seen_to, seen_tenant, seen_bo, seen_sl, seen_cls, seen_prio, seen_cu

  local function unsound_field(f)
    if f[2] == seen_task and f[4] == seen_max and f[5] == seen_to and f[7] == seen_bo
        and f[10] == seen_sl and f[11] == seen_cls and f[12] == seen_prio and f[14] == seen_cu then
      if f[6] == seen_tenant then
        return first_unsound(f, SOUND_OTHERS)
      end
      local bad = first_unsound(f, SOUND_TENANT)
      if not bad then
        seen_tenant = f[6]
      end
      return bad
    end
    local bad = first_unsound(f, SOUND)
    if not bad then
      seen_task, seen_max, seen_to, seen_tenant, seen_bo = f[2], f[4], f[5], f[6], f[7]
      seen_sl, seen_cls, seen_prio, seen_cu = f[10], f[11], f[12], f[14]
    end
    return bad
  end

  -- The running record of a job dispatch admitted on its throttle keys: the grant it
  -- holds (`ttok`) with the lease, in one write. The ack reads the grant with the
  -- record's common fields (settling.SETTLING), so the mark of optional fields an ack
  -- reads (`x`, core.read) that the enqueue wrote stands.
  function leasing.write_keyed(jk, token, att, worker, start, qw, ttok)
    if qw or att > 1 then
      redis.call('HSET', jk, 'st', 'running', 'tok', token, 'att', core.arg(att), 'wk', worker,
        'start', start, 'qw', qw or '', 'ttok', ttok)
    else
      redis.call('HSET', jk, 'st', 'running', 'tok', token, 'att', '1', 'wk', worker,
        'start', start, 'ttok', ttok)
    end
  end

  -- Lease popped jobs ({id, fields, lane} as `runnable` returns them) to `worker`: one
  -- fencing token each, the attempt counted, one ZADD for all the leases; the classes'
  -- in-flight work grows (their in-flight slots grew when the jobs were taken). Returns
  -- the rows a worker receives, in FetchedJob's places (`Row.*`; a place added goes
  -- last, so that a reader of the shorter row still decodes it).
  local function lease_jobs(keys, p, popped, worker, lease, now)
    local jobs = {}
    if #popped == 0 then
      return jobs
    end
    local tok = redis.call('INCRBY', keys[FENCE], #popped) - #popped
    local zargs, running, ids = {}, {}, {}
    local start, expiry = core.now_arg(now), core.int(now + lease)
    -- the timeout, budget and width of the job before, as stored and as numbers: most
    -- jobs of a call repeat them, and a comparison costs less than a call of core.num
    local to_s, to_n, max_s, max_n, sl_s, sl_n = false, 0, false, nil, false, 1
    for i = 1, #popped do -- a numeric loop: ipairs costs a C call per job
      local e = popped[i]
      local id, f, lane = e[1], e[2], e[3]
      ids[i] = id
      local cls = f[11] or DEFAULT_CLASS
      local by_class = running[lane]
      if not by_class then
        by_class = {}
        running[lane] = by_class
      end
      by_class[cls] = (by_class[cls] or 0) + work_of(f[14])
      tok = tok + 1
      local token = string.format('%d', tok)
      local att = f[9] and (core.num(f[9]) or 0) + 1 or 1
      if f[5] ~= to_s then
        to_s, to_n = f[5], core.num(f[5]) or 0
      end
      if f[4] ~= max_s then
        max_s, max_n = f[4], core.num(f[4]) or nil
      end
      if f[10] ~= sl_s then
        sl_s, sl_n = f[10], core.num(f[10]) or 1
      end
      -- no event: start, wk and att say when and where. Why it waited (`qw`, dispatch's
      -- view) rides on this write, so it costs no command either; a first attempt with
      -- nothing to say writes none (a later one clears what an earlier one said)
      if f.ttok then
        leasing.write_keyed(job_key(p, id), token, att, worker, start, e[4], f.ttok)
      elseif e[4] or att > 1 then
        redis.call('HSET', job_key(p, id), 'st', 'running', 'tok', token, 'att', core.arg(att),
          'wk', worker, 'start', start, 'qw', e[4] or '')
      else
        redis.call('HSET', job_key(p, id), 'st', 'running', 'tok', token, 'att', '1',
          'wk', worker, 'start', start)
      end
      zargs[2 * i - 1] = expiry
      zargs[2 * i] = id
      -- a trace context that is not valid UTF-8 is dropped: tracing never costs the job. An
      -- absent field is '' without a call: most jobs have none of the three
      jobs[i] = {[Row.ID] = id, [Row.TOKEN] = token, [Row.ATTEMPT] = att, [Row.TASK] = f[2],
        [Row.ARGS] = f[3], [Row.TIMEOUT] = to_n,
        [Row.DEADLINE_MS] = tonumber(f[16]) or 0, [Row.TENANT] = f[6] or '',
        [Row.MAX_ATTEMPTS] = max_n, [Row.BACKOFF] = f[7] or '',
        [Row.ENQUEUED_MS] = core.num(f[8]) or 0, [Row.SLOTS] = sl_n,
        [Row.SERVICE_CLASS] = cls, [Row.TRACE_CONTEXT] = f[19] and utf8_ok(f[19]) and f[19] or '',
        [Row.PARENT] = f[20] and utf8_ok(f[20]) and f[20] or '',
        [Row.FAIRNESS_KEY] = f[22] and leasing.text_ok(f[22]) and f[22] or ''}
    end
    redis.call('ZADD', keys[LEASES], unpack(zargs))
    redis.call('SADD', leasing.worker_jobs(p, worker), unpack(ids))
    for lane, by_class in pairs(running) do
      for cls, work in pairs(by_class) do
        redis.call('HINCRBYFLOAT', class_key(p, lane, cls, 'vt'), 'run', work)
      end
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

  -- The ids leased to a worker (`wj:<w>`): when it stops beating they are taken back at
  -- once, not when their leases run out. An id stays there after its lease ends by a path
  -- that does not know the worker (a lone ack, a sweep): whoever reads the set checks the
  -- record's `wk`. The set goes with the worker (leave, death, staleness).
  function leasing.worker_jobs(p, worker)
    return p .. 'wj:' .. worker
  end

  local function peek_idle_worker(p, lane, now)
    local idle = lane_key(p, lane, 'idle')
    -- lapsed registrations are dropped only when one heads the set: an enqueue that finds
    -- a live idle worker, or none, costs one command here
    local head = redis.call('ZRANGE', idle, 0, 0, 'WITHSCORES')
    if head[2] and tonumber(head[2]) <= now then
      redis.call('ZREMRANGEBYSCORE', idle, '-inf', now)
      head = redis.call('ZRANGE', idle, 0, 0, 'WITHSCORES')
    end
    local found = head[1]
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

  -- A popped job that will not run gives back the offers a throttle key woke it with;
  -- the waiters that wakes are kept in `tally.woken` for dispatch to enter once its own
  -- view of the lane is written (they may join the very queue it is reading).
  local function drop_offers(keys, p, id, offered, tally, now)
    if offered then
      local woken = take_back_offers(keys, p, id, now)
      if #woken > 0 then
        tally.woken = tally.woken or {}
        for _, w in ipairs(woken) do
          tally.woken[#tally.woken + 1] = w
        end
      end
    end
  end

  -- Check a job popped from a tenant queue. Returns its fields (as leasing.read_runnable
  -- reads them) when it
  -- can run; settles it (and gives back any offers it held) and returns nil when it
  -- cannot (expired, malformed, or a stale entry).
  -- A record as `runnable` checks it: f[1..15] st, task, args, max, to, tenant, bo, enq,
  -- att, sl, cls, prio, seq, cu, run; f[16..24] the fields few records hold: dl, lim,
  -- ttok, tp, par, toff, fk, rk, rmu; f[25] emu, what admission reserved, which a job's
  -- rate keys counting units take when it has neither rmu nor cu (dispatch.rate_units);
  -- f[26] x, the mark that any of f[16..25] may be there (core.read_whole).
  leasing.RUNNABLE = core.places{'st', 'task', 'args', 'max', 'to', 'tenant', 'bo', 'enq', 'att',
    'sl', 'cls', 'prio', 'seq', 'cu', 'run', 'dl', 'lim', 'ttok', 'tp', 'par', 'toff', 'fk', 'rk',
    'rmu', 'emu', 'x'}
  local RUNNABLE_OPTIONAL, RUNNABLE_MARK = leasing.RUNNABLE.dl, leasing.RUNNABLE.x

  function leasing.read_runnable(p, id)
    local f = core.read_whole(job_key(p, id), leasing.RUNNABLE, RUNNABLE_OPTIONAL, RUNNABLE_MARK)
    if f[1] then
      -- fields enqueue left out at their defaults (core.lua); an absent run is enq
      f[4], f[5], f[6] = f[4] or core.DEFAULT_MAX, f[5] or core.DEFAULT_TO, f[6] or core.DEFAULT_TENANT
      f[11], f[15] = f[11] or DEFAULT_CLASS, f[15] or f[8]
    end
    return f
  end

  -- `pre`: the record as `read_runnable` read it in this call, when dispatch read it
  -- already to see the job at its class's head (one read per job, not two).
  local function runnable(keys, p, id, now, tally, pre)
    local f = pre or leasing.read_runnable(p, id)
    local bad = f[1] == 'queued' and unsound_field(f)
    if bad then
      count(tally, 'malformed')
      release_throttle(keys, p, id, f[18], now)
      drop_offers(keys, p, id, f[21], tally, now)
      dead_letter(keys, p, id, string.format(MALFORMED_ERR, bad), now, tally)
    elseif f[1] == 'queued' then
      local late = f[16] and too_late(p, f[2], f[6], tonumber(f[16]), now)
      if late then
        release_throttle(keys, p, id, f[18], now)
        drop_offers(keys, p, id, f[21], tally, now)
        expire(keys, p, id, late, now, tally)
      else
        return f
      end
    elseif not f[1] then
      count(tally, 'missing')
    end
    return nil
  end

  leasing.hand_off = hand_off
  leasing.inbox_key = inbox_key
  leasing.lease_jobs = lease_jobs
  leasing.peek_idle_worker = peek_idle_worker
  leasing.promote_due = promote_due
  leasing.runnable = runnable
end
