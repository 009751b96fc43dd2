-- Settling attempts: a batch of outcomes applied, each fenced by its lease token, and
-- what each attempt used fed back into its key's learned cost and, in 'cost' mode, its
-- tenant's fair-queue tag.
--
-- Keys: job:<id>, lane:<l>:state, KEYS[LEASES], KEYS[TLIMITS], KEYS[WEIGHTS]
-- Calls: core, throttle, fairqueue, admission, records, workflows
-- Entry points: settling.{SETTLING, SETTLING_X, apply_acks, hand_back, push_back_key}

local settling = {}

do
  local DEFAULT_CLASS, LEASES, TLIMITS = core.DEFAULT_CLASS, core.LEASES, core.TLIMITS
  local DEFAULT_LANE, DEFAULT_MAX, DEFAULT_TENANT = core.DEFAULT_LANE, core.DEFAULT_MAX, core.DEFAULT_TENANT
  local job_key, lane_key, log_event = core.job_key, core.lane_key, core.log_event
  local slots_of, wake = core.slots_of, core.wake
  local note_duration = throttle.note_duration
  local add_settled, flush_settled = fairqueue.add_settled, fairqueue.flush_settled
  local lane_waiting, push_ready, release_grant = fairqueue.lane_waiting, fairqueue.push_ready, fairqueue.release_grant
  local enter_all_woken = fairqueue.enter_all_woken
  local work_of = fairqueue.work_of
  local MIN_CHARGE_MU, adjust_tag, learn_costs = admission.MIN_CHARGE_MU, admission.adjust_tag, admission.learn_costs
  local count, dead_letter, expire, finish = records.count, records.dead_letter, records.expire,
    records.finish
  local schedule_retry = records.schedule_retry
  local suspend_run = workflows.suspend_run

  -- How a lane learns costs: {cost_mode, learn, window, classes}, read once per call and
  -- lane (`cache.lanes`). `cache` also gathers a call's cost samples per key (`samples`)
  -- and, per class, tag corrections per tenant, written once each by `flush_costs`.
  local function lane_costing(p, lane, cache)
    local c = cache.lanes[lane]
    if not c then
      local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'charge', 'adm')
      local window = 500
      if v[2] then
        window = cjson.decode(v[2]).window or window
      end
      c = {cost_mode = v[1] == 'cost', learn = v[1] == 'cost' or v[2] ~= false, window = window,
        classes = {}}
      cache.lanes[lane] = c
    end
    return c
  end

  -- What a call gathers for one class of a lane (`c`, lane_costing): its counters' names,
  -- made once, the milli-units estimated and used that it counts under them once, at the
  -- end, and its tenants' tag corrections (a name joined per job costs the interpreter a
  -- new string each time, and a count a call; a lookup and a sum do not).
  local function class_costing(c, lane, cls)
    local k = c.classes[cls]
    if not k then
      local where = lane .. ':' .. cls
      k = {est = 'units:est:' .. where, used = 'units:used:' .. where, est_mu = 0, used_mu = 0,
        tags = {}}
      c.classes[cls] = k
    end
    return k
  end

  -- The usual cost key of a tenant's task (core.usual_cost_key), made once per call.
  local function usual_key(cache, tenant, task)
    local by_task = cache.usual[tenant]
    if not by_task then
      by_task = {}
      cache.usual[tenant] = by_task
    end
    local ck = by_task[task]
    if not ck then
      ck = core.usual_cost_key(tenant, task)
      by_task[task] = ck
    end
    return ck
  end

  -- An attempt ended having used `cost` units: its key's learned cost moves towards it
  -- and in 'cost' mode the tenant's tag takes the difference. Returns what the job records
  -- next to what it was charged (`amu`, milli-units; the caller writes it with the
  -- record's end), or nil when the lane learns nothing.
  local function feed_back_cost(p, lane, cls, tenant, cost_key, charged_mu, cost, cache)
    local c = lane_costing(p, lane, cache)
    if not c.learn then
      return nil
    end
    local actual_mu = math.max(MIN_CHARGE_MU, math.floor(cost * 1000 + 0.5))
    if cost_key then
      local samples = cache.samples[cost_key]
      if not samples then
        samples = {window = c.window}
        cache.samples[cost_key] = samples
      end
      samples[#samples + 1] = actual_mu
    end
    if c.cost_mode then
      local tags = class_costing(c, lane, cls).tags
      tags[tenant] = (tags[tenant] or 0) + (actual_mu - (tonumber(charged_mu) or 1)) / 1000
    end
    return actual_mu
  end

  local function flush_costs(p, cache, keys, fx)
    for cost_key, samples in pairs(cache.samples) do
      learn_costs(p, cost_key, samples, samples.window)
    end
    for lane, c in pairs(cache.lanes) do
      for cls, k in pairs(c.classes) do
        if k.est_mu ~= 0 or k.used_mu ~= 0 then
          records.count(fx, k.est, k.est_mu)
          records.count(fx, k.used, k.used_mu)
        end
        for tenant, delta in pairs(k.tags) do
          -- a tenant charged what its jobs used has nothing to correct
          if delta ~= 0 then
            adjust_tag(p, lane, cls, tenant, delta / core.tenant_weight(fx, keys, tenant))
          end
        end
      end
    end
  end

  -- The upstream behind a key pushed back on an attempt (kind 'throttle', payload
  -- '<key>\n<error JSON>'): the key is paused `delay` ms for everyone (thr_push_back) if
  -- the job's `grant` holds it. Returns the error, whether the pushback applied, and the key.
  function settling.push_back_key(keys, grant, payload, delay, now)
    local key, err = string.match(payload or '', '^([^\n]*)\n(.*)$')
    if not key then
      return payload, false
    end
    local ok, decoded = pcall(cjson.decode, err)
    local cause = ok and type(decoded) == 'table' and tostring(decoded.message or '') or ''
    return err, grant ~= nil and throttle.thr_push_back(keys, grant, key, now + delay, now, cause),
      key
  end

  -- A worker could not run the job (kind 'handback': the task is unknown to it, or the
  -- stored arguments do not fit its signature), as happens while a deploy rolls out, so
  -- another worker, perhaps on the other version, may take it: the job is due again in
  -- `delay` ms, its attempt given back, until `window` ms after its first hand-back
  -- (field hb); then, or at once for a window of 0, it is dead-lettered with the final
  -- error. Payload '<window ms>\n<error JSON>\n<final error JSON>' (JSON has no raw
  -- newline). Returns what became of the job: 'scheduled', 'expired' or 'failed'.
  function settling.hand_back(keys, p, id, payload, delay, now, tally, meta)
    local window, err, final = string.match(payload or '', '^(%d+)\n([^\n]*)\n(.*)$')
    local jk = job_key(p, id)
    if not window then
      -- not a hand-back this library can read: no worker sends one, so no retry can help
      dead_letter(keys, p, id, payload, now, tally, meta)
      return 'failed'
    end
    window = tonumber(window)
    local first = tonumber(redis.call('HGET', jk, 'hb'))
    if window == 0 or (first and now - first >= window) then
      -- a re-driven job starts a window of its own
      redis.call('HDEL', jk, 'hb')
      dead_letter(keys, p, id, final, now, tally, meta)
      return 'failed'
    end
    if not first then
      redis.call('HSET', jk, 'hb', core.now_arg(now))
    end
    -- logged with the attempt it ended, then the attempt is given back
    local verdict = schedule_retry(keys, p, id, delay, err, now, tally, 'handback')
    redis.call('HINCRBY', jk, 'att', -1)
    return verdict
  end

  -- What the attempt reported of its time in model calls and in tool calls, as the job
  -- keeps it: '<model ms>,<tool ms>' (field and event detail `use`), nil when it reported
  -- none (or its worker, of an earlier release, sends acks without the two).
  local function reported(ack)
    local m, t = tonumber(ack[Ack.MODEL_MS]), tonumber(ack[Ack.TOOL_MS])
    if not (m and t) or (m < 0 and t < 0) then
      return nil
    end
    return core.int(math.floor(math.max(0, m))) .. ',' .. core.int(math.floor(math.max(0, t)))
  end

  -- A running job's record as an ack reads it: f[1..15] st, tok, task, rc, rf, att, max,
  -- lane, cls, sl, tenant, start, ck, cu, ttok; f[16..21] the optional w, mu, par, wfr,
  -- idem, dl (core.read). The grant (`ttok`) is read with the common fields: one field
  -- more on a plain record's read costs the server less than a keyed record's second read
  -- and the mark its lease would have to write for it.
  settling.SETTLING = {'st', 'tok', 'task', 'rc', 'rf', 'att', 'max', 'lane', 'cls', 'sl', 'tenant',
    'start', 'ck', 'cu', 'ttok', 'x'}
  settling.SETTLING_X = {'w', 'mu', 'par', 'wfr', 'idem', 'dl'}

  -- What settling an attempt that ran does before its kind's own step: its slots leave its
  -- class's in-flight count (`settled`, and the call's `tally.ended` that dispatch reads in
  -- queued_why), a pushback pauses its key, its throttle grant is released, its tenant's
  -- durations and its key's learned cost take what it used. Returns the payload (a
  -- pushback's error), whether the pushback applied and its key, and the units used
  -- (milli-units, nil when the lane learns nothing). `f`: the record as apply_acks read
  -- it, the fields enqueue left out at their defaults filled in.
  local function account(keys, p, id, kind, ack, f, now, tally, settled, freed, limited, costing)
    -- an outcome's places at their defaults at its end are left off (wire.Outcome)
    local payload = ack[Ack.PAYLOAD] or ''
    local cls = f[9]
    local slots = slots_of(f[10])
    add_settled(settled, f[8], cls, slots, work_of(f[14]))
    tally.ended = tally.ended or {}
    local ended = tally.ended[f[8]]
    if not ended then
      ended = {}
      tally.ended[f[8]] = ended
    end
    ended[cls] = (ended[cls] or 0) + slots
    freed[f[8]] = true
    local cost = tonumber(ack[Ack.COST]) or -1
    local pushed, pushed_key = false, nil
    if kind == Kind.THROTTLE then
      payload, pushed, pushed_key =
        settling.push_back_key(keys, f[15], payload, tonumber(ack[Ack.DELAY_MS]) or 0, now)
    end
    if f[15] then
      -- a job handed back unstarted used nothing of what its rate keys gave it
      local unstarted = kind == Kind.RELEASE or kind == Kind.HANDBACK
      local used = unstarted and 0 or (cost >= 0 and cost or nil)
      tally.quiet = tally.quiet or {}
      local wakes = release_grant(keys, p, id, f[15], now, used, kind == Kind.OK, tally.quiet)
      if #wakes > 0 then
        -- a tenant the waiters woken activate starts from its class's in-flight work:
        -- this batch's ends are settled first
        flush_settled(p, settled)
        enter_all_woken(p, wakes, now, keys)
      end
    end
    local tenant = f[11]
    if limited[tenant] == nil then
      limited[tenant] = core.any(tally, keys[TLIMITS])
        and redis.call('HEXISTS', keys[TLIMITS], tenant) == 1
    end
    if kind ~= Kind.RELEASE and kind ~= Kind.HANDBACK and limited[tenant] then
      note_duration(p, f[11], math.max(0, now - (tonumber(f[12]) or now)) / 1000)
    end
    local amu = nil
    if cost >= 0 and kind ~= Kind.RELEASE then
      -- an absent cost key (false, as HMGET reads it) is the usual one, '' none (enqueue
      -- leaves the usual one out)
      local ck = f[13]
      if not ck then
        ck = usual_key(costing, tenant, f[3] or '')
      elseif ck == '' then
        ck = nil
      end
      amu = feed_back_cost(p, f[8], cls, tenant, ck, f[14], cost, costing)
      -- for the metrics, the estimate the store held for the job (admission's
      -- reservation, else the charge in cost mode) next to what it used; counted with
      -- the call's other counters: one HINCRBY per lane and class per call, and only
      -- in lanes that learn costs (an attempt handed back unrun is no measure)
      local est = amu and kind ~= Kind.HANDBACK and (tonumber(f[17]) or tonumber(f[14]))
      if est then
        local k = class_costing(lane_costing(p, f[8], costing), f[8], cls)
        k.est_mu, k.used_mu = k.est_mu + math.floor(est + 0.5), k.used_mu + amu
      end
    end
    return payload, pushed, pushed_key, amu
  end

  -- The attempt's end by its kind: completed, retried, dead-lettered, cancelled, expired
  -- (stopped by its worker at the job's deadline: counted as expired, never as a failure,
  -- and not retried), a run suspended, handed back, or released (handed back unstarted by
  -- a stopping worker: the attempt is not counted). The store holds the attempt budget
  -- itself: a retry past it is a dead letter. What the attempt reported of its time
  -- (`meta.use`) rides on the write that ends the job, or on the event that ends the attempt.
  local function conclude(keys, p, id, kind, ack, f, payload, pushed, pushed_key, meta, now, tally,
      settled)
    local delay, use = tonumber(ack[Ack.DELAY_MS]) or 0, meta.use
    -- the attempt budget is read only by the kinds that retry (a number read costs)
    if kind == Kind.THROTTLE and pushed then
      records.push_back(keys, p, id, delay or 0, payload, now, tally, meta, pushed_key, use)
    elseif kind == Kind.THROTTLE and (tonumber(f[6]) or 0) >= (tonumber(f[7]) or 1) then
      dead_letter(keys, p, id, payload, now, tally, meta)
    elseif kind == Kind.THROTTLE then
      -- a pushback on a key the job does not hold is an ordinary failure
      schedule_retry(keys, p, id, delay or 0, payload, now, tally, nil, nil, use)
    elseif kind == Kind.OK then
      finish(keys, p, id, 'completed', 'res', payload, now, tally, meta)
    elseif kind == Kind.RETRY and (tonumber(f[6]) or 0) >= (tonumber(f[7]) or 1) then
      dead_letter(keys, p, id, payload, now, tally, meta)
    elseif kind == Kind.RETRY then
      schedule_retry(keys, p, id, delay, payload, now, tally, nil, nil, use)
    elseif kind == Kind.DEAD then
      dead_letter(keys, p, id, payload, now, tally, meta)
    elseif kind == Kind.CANCEL then
      finish(keys, p, id, 'cancelled', 'err', payload, now, tally, meta)
    elseif kind == Kind.EXPIRE then
      expire(keys, p, id, payload, now, tally, meta)
    elseif kind == Kind.SUSPEND then
      suspend_run(keys, p, id, payload, delay or 0, now, tally, use)
    elseif kind == Kind.HANDBACK then
      settling.hand_back(keys, p, id, payload, delay or 0, now, tally, meta)
    else
      local jk = job_key(p, id)
      local r = redis.call('HMGET', jk, 'lane', 'tenant', 'prio', 'seq', 'start', 'wk')
      r[1], r[2] = r[1] or core.DEFAULT_LANE, r[2] or core.DEFAULT_TENANT
      -- written first, so that the job handed back sees the lane's true load
      flush_settled(p, settled)
      redis.call('HINCRBY', jk, 'att', -1)
      redis.call('HSET', jk, 'st', 'queued')
      log_event(p, id, now, 'released', {start = tonumber(r[5]), wk = r[6] or nil})
      push_ready(p, r[1], f[9], r[2], id, r[3], r[4], f[10])
      wake(p, r[1])
    end
  end

  -- Apply a batch of outcomes, each fenced by its lease token. The leases of the jobs it
  -- settles are dropped here, or, when `tally.unleased` is set (an exchange), listed there
  -- for the caller to drop. `acks` is an array of
  -- [id, token, kind (ok | retry | dead | cancel | expire | release | suspend | throttle
  -- | handback), payload, delay_ms, cost] (a workflow run suspends with what it waits for
  -- as its payload; a pushback names its key and the pause; a hand-back its window,
  -- settling.hand_back). (cost: the work units the attempt used, -1 when it did not run).
  -- Returns one code per entry: 1 applied; 2 the settlement this lease made already, sent
  -- again after its reply was lost (not applied twice; counted 'resettled'); 0 rejected as
  -- stale (counted 'fenced'). A job keeps the token that settled it until its next lease
  -- (a reclaim removes it), so the two cannot be confused.
  local function apply_acks(keys, p, acks, now, tally)
    local codes, released, read = {}, {}, core.read
    local fields, optional = settling.SETTLING, settling.SETTLING_X
    -- what the call gathers: lanes freed, tenants' limits read, ends to settle, costs
    local freed, limited, settled, costing = {}, {}, {}, {lanes = {}, samples = {}, usual = {}}
    -- numeric loops on the per-job paths: ipairs costs a C call per element
    for i = 1, #acks do
      local ack = acks[i]
      if ack == nil then
        break -- where ipairs would stop
      end
      local f = read(job_key(p, ack[Ack.ID]), fields, optional)
      if f[1] ~= 'running' and f[2] == ack[Ack.TOKEN] then
        count(tally, 'resettled')
        codes[i] = AckCode.RESETTLED
      elseif f[1] ~= 'running' or f[2] ~= ack[Ack.TOKEN] then
        count(tally, 'fenced')
        codes[i] = AckCode.FENCED
      else
        -- settled here rather than in a function of its own: a call per job costs the
        -- server. The status leaves 'running' in its kind's step (conclude), which alone
        -- fences any later write of its token.
        local id, kind = ack[Ack.ID], ack[Ack.KIND]
        released[#released + 1] = id
        -- fields enqueue left out at their defaults (core.lua)
        f[7], f[8], f[9], f[11] = f[7] or DEFAULT_MAX, f[8] or DEFAULT_LANE, f[9] or DEFAULT_CLASS,
          f[11] or DEFAULT_TENANT
        local payload, pushed, pushed_key, amu =
          account(keys, p, id, kind, ack, f, now, tally, settled, freed, limited, costing)
        local meta = {f[3], f[4], f[5], f[16], f[17], f[8], f[9], f[11], f[18], f[19], nil, f[20],
          f[21], use = kind ~= Kind.RELEASE and kind ~= Kind.HANDBACK
          -- an attempt that reported nothing sends neither place (wire.Outcome): no call
          and ack[Ack.MODEL_MS] ~= nil and reported(ack) or nil}
        local ends = kind == Kind.OK or kind == Kind.DEAD or kind == Kind.CANCEL
          or kind == Kind.EXPIRE
          or (kind == Kind.RETRY and (core.num(f[6]) or 0) >= (core.num(f[7]) or 1))
        if ends then
          meta.amu = amu
        elseif amu then
          redis.call('HSET', job_key(p, id), 'amu', amu)
        end
        conclude(keys, p, id, kind, ack, f, payload, pushed, pushed_key, meta, now, tally, settled)
        codes[i] = AckCode.APPLIED
      end
    end
    flush_settled(p, settled)
    flush_costs(p, costing, keys, tally)
    if tally.unleased then
      -- an exchange drops them once its own leases are written (workers.drop_leases)
      tally.unleased = released
    elseif #released > 0 then
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

  settling.apply_acks = apply_acks
end
