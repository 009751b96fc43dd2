-- Durable workflow runs: loading a slice's history, checkpoints fenced by the
-- run's lease, durable waits on timers, signals and children, and suspension.
-- A suspended run holds no lease, no slot and no reservation: it waits in its
-- lane's delayed set and passes the gate again when woken, like a retry.
--
-- Keys: job:<id>, run:<id>:steps|log|sig|h, lane:<l>:delayed, KEYS[STATS]
-- Calls: core, deadlineorder, admission, runs, records
-- Entry points: workflows.{signal, suspend_run, wf_children, wf_load, wf_step, wf_wait}

local workflows = {}

do
  local DEFAULT_CLASS, STATS, TERMINAL = core.DEFAULT_CLASS, core.STATS, core.TERMINAL
  local job_key, lane_key, log_event = core.job_key, core.lane_key, core.log_event
  local now_ms, prefix, wake = core.now_ms, core.prefix, core.wake
  local release_reservation = admission.release_reservation
  local children_done, find_signal, run_key = runs.children_done, runs.find_signal, runs.run_key
  local wake_run = runs.wake_run
  local EXPIRED_ERR, count, expire = records.EXPIRED_ERR, records.count, records.expire

  -- Whether a run's lease `tok` still holds: only the current holder may write.
  local function holds(jk, tok)
    local f = redis.call('HMGET', jk, 'st', 'tok')
    return f[1] == 'running' and f[2] == tok
  end

  -- The wait in progress at operation `seq`: its deadline and since when, recorded
  -- the first time the run reached it, so that a replay never extends a timeout.
  local function pending_wait(jk, seq, deadline, now)
    local w = redis.call('HGET', jk, 'wfw')
    if w then
      local s, d, since = string.match(w, '^(%d+)|(-?%d+)|(%d+)$')
      if s and tonumber(s) == seq then
        return tonumber(d), tonumber(since)
      end
    end
    redis.call('HSET', jk, 'wfw', seq .. '|' .. deadline .. '|' .. now)
    return deadline, now
  end

  -- Checkpoint one operation: [kind, name, status, value, ms it took, worker, end ms].
  local function checkpoint(p, id, entry)
    redis.call('RPUSH', run_key(p, id, 'steps'), cmsgpack.pack(entry))
  end

  -- ARGV: id, token, worker. Starts a slice: returns LoadReply {1, class, steps, failed
  -- step attempts as name, count, ..}, or {0} when the lease is not the caller's.
  local function wf_load(keys, args)
    local p, now = prefix(keys), now_ms()
    local id, tok = args[WfLoadArg.RUN], args[WfLoadArg.TOKEN]
    local jk = job_key(p, id)
    if not holds(jk, tok) then
      return {[Load.HELD] = 0}
    end
    local f = redis.call('HMGET', jk, 'cls', 'att')
    redis.call('HSET', jk, 'wfr', 1, 'x', '1')
    redis.call('HDEL', jk, 'wf')
    redis.call('RPUSH', run_key(p, id, 'log'),
      cmsgpack.pack({'slice', args[WfLoadArg.WORKER], now, tonumber(f[2]) or 0}))
    local fails = {}
    local h = redis.call('HGETALL', run_key(p, id, 'h'))
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 2) == 'a:' then
        fails[#fails + 1] = string.sub(h[i], 3)
        fails[#fails + 1] = h[i + 1]
      end
    end
    return {[Load.HELD] = 1, [Load.SERVICE_CLASS] = f[1] or DEFAULT_CLASS,
      [Load.STEPS] = redis.call('LRANGE', run_key(p, id, 'steps'), 0, -1), [Load.FAILURES] = fails}
  end

  -- ARGV: id, token, seq, kind, name, status, value, ms, worker. Checkpoints a finished
  -- step as operation `seq`, or with status 'failed' counts a failed attempt of the
  -- step instead. Returns 1, 0 (lease lost: nothing written) or -1 (seq is not next).
  local function wf_step(keys, args)
    local p, now = prefix(keys), now_ms()
    local id, tok, seq = args[WfStepArg.RUN], args[WfStepArg.TOKEN], tonumber(args[WfStepArg.SEQ])
    if not holds(job_key(p, id), tok) then
      return 0
    end
    if args[WfStepArg.STATUS] == 'failed' then
      redis.call('HINCRBY', run_key(p, id, 'h'), 'a:' .. args[WfStepArg.NAME], 1)
      return 1
    end
    if redis.call('LLEN', run_key(p, id, 'steps')) ~= seq then
      return -1
    end
    checkpoint(p, id, {args[WfStepArg.KIND], args[WfStepArg.NAME], args[WfStepArg.STATUS],
      args[WfStepArg.VALUE], tonumber(args[WfStepArg.MS]), args[WfStepArg.WORKER], now})
    return 1
  end

  -- ARGV: id, token, seq, kind (sleep | signal), name, ms, absolute (1: ms is a time),
  -- worker. A durable wait as operation `seq`. Returns {'signal', payload} (consumed and
  -- checkpointed), {'done'} (the timer is over; checkpointed), {'wait', ms left} or
  -- {'fenced'}.
  local function wf_wait(keys, args)
    local p, now = prefix(keys), now_ms()
    local id, tok, seq, kind, name = args[WfWaitArg.RUN], args[WfWaitArg.TOKEN],
      tonumber(args[WfWaitArg.SEQ]), args[WfWaitArg.KIND], args[WfWaitArg.NAME]
    local jk = job_key(p, id)
    if not holds(jk, tok) then
      return {'fenced'}
    end
    local ms = tonumber(args[WfWaitArg.MS])
    local deadline, since = pending_wait(jk, seq, args[WfWaitArg.ABSOLUTE] == '1' and ms or now + ms, now)
    if kind == 'signal' then
      local i, raw, e = find_signal(p, id, name)
      if i then
        redis.call('LREM', run_key(p, id, 'sig'), 1, raw)
        redis.call('HDEL', jk, 'wfw')
        checkpoint(p, id, {'signal', name, 'ok', e[2], now - since, args[WfWaitArg.WORKER], now})
        return {'signal', e[2]}
      end
    end
    if now >= deadline then
      redis.call('HDEL', jk, 'wfw')
      checkpoint(p, id, {kind, name, kind == 'signal' and 'timeout' or 'ok', '', now - since,
        args[WfWaitArg.WORKER], now})
      return {'done'}
    end
    return {'wait', deadline - now}
  end

  -- ARGV: id, token, seq, name, packed child ids, worker. Operation `seq` waits for
  -- children: {'done', [status, payload], ..} once all settled (checkpointed), else
  -- {'wait', settled id, ..} (and the run's `wfk` names the children it waits for).
  local function wf_children(keys, args)
    local p, now = prefix(keys), now_ms()
    local id, tok, seq = args[WfChildrenArg.RUN], args[WfChildrenArg.TOKEN],
      tonumber(args[WfChildrenArg.SEQ])
    local jk = job_key(p, id)
    if not holds(jk, tok) then
      return {'fenced'}
    end
    local _, since = pending_wait(jk, seq, 0, now)
    local ids = cmsgpack.unpack(args[WfChildrenArg.CHILDREN])
    local out, settled, missing = {'done'}, {'wait'}, false
    if #ids > 0 then
      local fields = {}
      for i, cid in ipairs(ids) do
        fields[i] = 'k:' .. cid
      end
      local got = redis.call('HMGET', run_key(p, id, 'h'), unpack(fields))
      for i, v in ipairs(ids) do
        if got[i] then
          out[#out + 1] = got[i]
          settled[#settled + 1] = v
        else
          missing = true
        end
      end
    end
    if missing then
      redis.call('HSET', jk, 'wfk', args[WfChildrenArg.CHILDREN])
      return settled
    end
    redis.call('HDEL', jk, 'wfw', 'wfk')
    local results = {}
    for i = 2, #out do
      results[i - 1] = cmsgpack.unpack(out[i])
    end
    -- JSON, as the other checkpoints' values: [[status, result or error JSON], ..]
    checkpoint(p, id, {'children', args[WfChildrenArg.NAME], 'ok', cjson.encode(results), now - since,
      args[WfChildrenArg.WORKER], now})
    return out
  end

  -- ARGV: id, name, payload (JSON text), signal id ('' for none). Delivers a signal:
  -- 1 delivered (kept until a wait takes it), 2 a duplicate of an id already seen,
  -- 0 the run has finished, -1 no such run.
  local function signal(keys, args)
    local p, now = prefix(keys), now_ms()
    local id, name, sid = args[SignalArg.RUN], args[SignalArg.NAME], args[SignalArg.SIGNAL_ID]
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'st', 'wf', 'lane')
    if not f[1] then
      return -1
    end
    if TERMINAL[f[1]] then
      return 0
    end
    if sid ~= '' and redis.call('HSETNX', run_key(p, id, 'h'), 's:' .. sid, now) == 0 then
      return 2
    end
    redis.call('RPUSH', run_key(p, id, 'sig'), cmsgpack.pack({name, args[SignalArg.PAYLOAD], now}))
    if f[1] == 'scheduled' and f[2] == 'signal:' .. name then
      wake_run(p, id, f[3] or core.DEFAULT_LANE, now)
    end
    return 1
  end

  -- A run gave its slot back (ack kind 'suspend'): it waits `delay` ms in its lane's
  -- delayed set, or less if what it waits for already came. Like a hand-back, the
  -- slice does not count as an attempt; like a retry, its reservation is released and
  -- it passes the gate again when due. It re-enters its tenant's queue behind the
  -- work already there (a new FIFO number), so a continuation neither loses its place
  -- in fair dispatch nor jumps its own tenant's queue; a deadline-ordered run keeps its
  -- deadline order (deadlineorder.lua), which is its place by its tenant's own rule.
  -- `use`: what the slice reported of its time in model and tool calls (acks.lua), kept
  -- in its event.
  local function suspend_run(keys, p, id, wait, delay, now, tally, use)
    local jk = job_key(p, id)
    local f = redis.call('HMGET', jk, 'dl', 'lane', 'mu', 'cls', 'tenant', 'wfk', 'start', 'wk',
      'att', 'qw', 'seq')
    f[2], f[5] = f[2] or core.DEFAULT_LANE, f[5] or core.DEFAULT_TENANT
    if (wait == 'children' and children_done(p, id, f[6])) or
        (string.sub(wait, 1, 7) == 'signal:' and find_signal(p, id, string.sub(wait, 8))) then
      delay = 0
    end
    local run_at = now + math.max(0, delay)
    if f[1] and now >= tonumber(f[1]) then
      expire(keys, p, id, EXPIRED_ERR, now, tally)
      return
    end
    if f[1] then
      -- a wait longer than the run's deadline ends at it, where dispatch expires the run
      run_at = math.min(run_at, tonumber(f[1]))
    end
    if f[3] then
      release_reservation(p, id, f[2], f[4] or DEFAULT_CLASS, f[5] or '', f[3], tally)
      redis.call('HSET', jk, 'readmit', f[3])
    end
    local seq = f[11]
    if not deadlineorder.ordered(seq) then
      seq = redis.call('HINCRBY', keys[STATS], 'fifo', 1)
    end
    redis.call('HINCRBY', jk, 'att', -1)
    redis.call('HSET', jk, 'st', 'scheduled', 'run', run_at, 'wf', wait, 'seq', seq)
    redis.call('ZADD', lane_key(p, f[2], 'delayed'), run_at, id)
    redis.call('RPUSH', run_key(p, id, 'log'), cmsgpack.pack({'suspend', wait, now, run_at}))
    -- the slice's start, worker and attempt: the next slice overwrites them in the record
    log_event(p, id, now, 'suspended', {wait = wait, at = run_at, start = tonumber(f[7]),
      wk = f[8] or nil, att = tonumber(f[9]), qw = f[10] ~= '' and f[10] or nil, use = use})
    count(tally, 'suspended')
    wake(p, f[2])
  end

  workflows.signal = signal
  workflows.suspend_run = suspend_run
  workflows.wf_children = wf_children
  workflows.wf_load = wf_load
  workflows.wf_step = wf_step
  workflows.wf_wait = wf_wait
end
