-- Storing submitted jobs: idempotency keys, deadlines, class entitlements, the admission
-- gate, the job's record, its tenant queue or its lane's delayed set, and the hand-off to
-- an idle worker.
--
-- Keys: job:<id>, q:<lane>:<class>:<tenant>, lane:<l>:delayed|idle|dl, KEYS[IDEM],
--   KEYS[STATS] (seq), KEYS[TLIMITS]
-- Calls: core, classes, throttle, pausetable, deadlineorder, fairqueue, fairkeys,
--   queue_bounds, admission, records, leasing, dispatch, handoff
-- Entry points: enqueuing.{enqueue}

local enqueuing = {}

do
  local DEFAULT_CLASS, IDEM, STATS, TLIMITS = core.DEFAULT_CLASS, core.IDEM, core.STATS, core.TLIMITS
  local job_key, lane_key, log_event = core.job_key, core.lane_key, core.log_event
  local now_ms, prefix, wake = core.now_ms, core.prefix, core.wake
  local arg, tenant_class = core.arg, classes.tenant_class
  local note_submissions = throttle.note_submissions
  local flush_pushes, push_ready, tenant_queue = fairqueue.flush_pushes, fairqueue.push_ready, fairqueue.tenant_queue
  local admit_new, charge_mu, count_decision = admission.admit_new, admission.charge_mu, admission.count_decision
  local defer, expected_mu, lane_declarations = admission.defer, admission.expected_mu, admission.lane_declarations
  local note_rejection, reserve = admission.note_rejection, admission.reserve
  local apply_effects, count, new_effects = records.apply_effects, records.count, records.new_effects
  local hand_off, peek_idle_worker = leasing.hand_off, leasing.peek_idle_worker
  local dispatch_lane = dispatch.dispatch_lane

  -- One call's view, shared by its jobs' steps: what it read once (the lane's
  -- declarations, learned costs, entitlements) and what it gathers for its end (the ready
  -- pushes, the effects, the jobs stored per tenant). Held in these locals for the call's
  -- length rather than in a table: a script runs alone, so no two calls overlap, and a
  -- table costs a hash insertion per field per call and a lookup per read, which in calls
  -- of a job or two (a call per tenant) cost the server more than the steps saved.
  local call_keys, call_p, call_now, call_now_s, call_lane
  local call_tbl, call_cost_mode, call_adm, call_qb
  local call_learned, call_seen, call_submitted, call_pushes, call_tally, call_pauses
  local function begin_call(keys, lane)
    call_keys, call_p, call_now, call_lane = keys, prefix(keys), now_ms(), lane
    call_now_s = core.now_arg(call_now)
    call_learned, call_seen, call_submitted = {}, {}, {}
    call_pushes, call_tally = fairqueue.new_pushes(), new_effects()
    local paused
    call_tbl, call_cost_mode, call_adm, call_qb, paused = lane_declarations(keys, call_p, lane)
    call_pauses = paused and pausetable.load(call_p, call_now) or nil
  end

  -- The gate: whether job `j` (FIFO number `seq` of a call of `n` jobs) is stored, and how.
  -- Returns its reply code and detail when it is not (an existing job's id first), else nil
  -- and the class it takes, the admission verdict, reason and reservation, when it is due,
  -- its deadline, and whether the class orders its tenants' jobs by deadline. Every
  -- refusal is counted with its reason, in every lane (accepted jobs only in lanes with
  -- a pool: a plain lane's enqueue pays no counter for them).
  local function gate(j, tenant, slots, seq, n)
    local keys, p, lane, now, tally = call_keys, call_p, call_lane, call_now, call_tally
    local tbl, idem = call_tbl, j[Job.IDEMPOTENCY_KEY]
    local cls = j[Job.SERVICE_CLASS] or DEFAULT_CLASS
    local existing = idem ~= '' and redis.call('HGET', keys[IDEM], idem)
    local existing_st = existing and redis.call('HGET', job_key(p, existing), 'st')
    if existing_st then
      -- the detail says whether the job the key names still waits for admission
      return Reply.EXISTING, existing_st == 'deferred' and 'deferred' or '', existing
    end
    -- a quarantined tenant's submission is refused before anything is stored
    local refused_until = call_pauses and pausetable.refusal(call_pauses, tenant)
    if refused_until then
      count_decision(tally, lane, cls, 'rejected', 'tenant_paused')
      return Reply.TENANT_PAUSED, 'tenant_paused|' .. (refused_until > 0 and refused_until - now or 0)
    end
    local entitled, index
    cls, entitled, index = tenant_class(tally, keys, p, call_seen, tbl, tenant, cls,
      j[Job.CLASS_NAMED] ~= 0)
    if not index then
      return Reply.UNKNOWN_CLASS, ''
    elseif not entitled then
      count_decision(tally, lane, cls, 'rejected', 'class_not_entitled')
      return Reply.CLASS_NOT_ENTITLED, 'class_not_entitled'
    end
    -- when the job is due, and its deadline as absolute ms ('' none); one that has passed
    -- or comes before the job is due cannot be met
    local run_at, dl = now, j[Job.DEADLINE]
    if j[Job.AT_MS] then
      run_at = tonumber(j[Job.AT_MS])
    elseif j[Job.DELAY_MS] then
      run_at = now + tonumber(j[Job.DELAY_MS])
    end
    if string.sub(dl, 1, 1) == '+' then
      dl = now + tonumber(string.sub(dl, 2))
    elseif dl ~= '' then
      dl = tonumber(dl)
    end
    -- or whose expected end, its estimated wait and learned length (Job.NEEDS_MS, 0: not
    -- estimated; fairlane.policy.startpredict), lands after it
    local needs = tonumber(j[Job.NEEDS_MS]) or 0
    local seen = tonumber(j[Job.NEEDS_SEEN]) or -1
    if needs > 0 and seen >= 0 then
      -- what its tenant queued since its estimate waits ahead of it too: the estimates of a
      -- burst race, this settles them (fairlane.policy.startpredict.needs_at_enqueue)
      local queued = redis.call('ZCARD', tenant_queue(p, lane, cls, tenant))
      needs = needs + math.max(0, queued - seen) * (tonumber(j[Job.NEEDS_PER_JOB_MS]) or 0)
    end
    local meetable = not (dl ~= '' and (dl <= now or dl < run_at or (needs > 0 and now + needs > dl)))
    local verdict, reason, mu = 'accepted', nil, nil
    local adm, qb = call_adm, call_qb
    local base_mu = tonumber(j[Job.DECLARED_MU]) or 1000
    if adm then
      base_mu = expected_mu(p, base_mu, j[Job.DECLARED] == 1, j[Job.COST_KEY], call_learned)
    end
    if adm and meetable then
      verdict, reason, mu = admit_new(p, lane, adm, cls, tenant, base_mu)
      count_decision(tally, lane, cls, verdict, reason)
    elseif qb and meetable then
      -- a lane without a pool: its default queue bounds (bounds.lua)
      verdict, reason = queue_bounds.room(p, lane, qb, tbl, cls, tenant,
        slots, run_at > now, call_pushes, seq, n)
      if verdict == 'rejected' then
        count_decision(tally, lane, cls, verdict, reason)
      end
    end
    if not meetable then
      -- a refusal like the others, in the same counters (the gate's rule 2)
      count_decision(tally, lane, cls, 'rejected', 'deadline_unmeetable')
      return Reply.DEADLINE_UNMEETABLE, ''
    elseif verdict == 'rejected' then
      local earlier = note_rejection(p, lane, tenant, now)
      count(tally, 'rejected')
      return Reply.REJECTED, reason .. '|' .. earlier
    end
    return nil, cls, verdict, reason, mu, run_at, dl, tbl[index][ClassRow.DEADLINE_ORDER] == 1
  end

  -- The fields of job `j` that are not at their defaults, appended to the record's HSET
  -- `h`; returns its new length (core.lua: what an absent one reads as).
  local function unusual_fields(h, j, tenant, slots)
    local n = #h
    if tenant ~= core.DEFAULT_TENANT then
      h[n + 1], h[n + 2], n = 'tenant', tenant, n + 2
    end
    if call_lane ~= core.DEFAULT_LANE then
      h[n + 1], h[n + 2], n = 'lane', call_lane, n + 2
    end
    if arg(j[Job.MAX_ATTEMPTS]) ~= core.DEFAULT_MAX then
      h[n + 1], h[n + 2], n = 'max', arg(j[Job.MAX_ATTEMPTS]), n + 2
    end
    if arg(j[Job.TIMEOUT]) ~= core.DEFAULT_TO then
      h[n + 1], h[n + 2], n = 'to', arg(j[Job.TIMEOUT]), n + 2
    end
    if tonumber(j[Job.PRIORITY]) ~= 0 then
      h[n + 1], h[n + 2], n = 'prio', arg(j[Job.PRIORITY]), n + 2
    end
    if slots ~= 1 then
      h[n + 1], h[n + 2], n = 'sl', arg(slots), n + 2
    end
    if j[Job.BACKOFF] ~= core.DEFAULT_BACKOFF then
      h[n + 1], h[n + 2], n = 'bo', j[Job.BACKOFF], n + 2
    end
    if j[Job.KEEP_COMPLETED] .. '|' .. j[Job.KEEP_FAILED] ~= records.DEFAULT_RETENTION then
      h[n + 1], h[n + 2], h[n + 3], h[n + 4], n = 'rc', j[Job.KEEP_COMPLETED], 'rf',
        j[Job.KEEP_FAILED], n + 4
    end
    local ck = j[Job.COST_KEY] or ''
    if ck ~= core.usual_cost_key(tenant, j[Job.TASK]) then
      h[n + 1], h[n + 2], n = 'ck', ck, n + 2
    end
    return n
  end

  -- The record: one write of the whole job hash, the optional fields riding on it, and
  -- the events only a deferral or a schedule needs (an accepted job's submission is in its
  -- record: enq, cls).
  local function record(j, id, tenant, cls, st, order, verdict, reason, mu, run_at, dl, slots)
    local p, lane, now, now_s = call_p, call_lane, call_now, call_now_s
    local idem = j[Job.IDEMPOTENCY_KEY]
    local fkey = j[Job.FAIRNESS_KEY]
    -- A field at its default is left out (core.lua says what an absent one reads
    -- as): most jobs keep the default retention and backoff, one slot, priority 0 and the
    -- usual cost key, and each field left out is bytes a waiting job does not hold
    local h = {'HSET', job_key(p, id), 'task', j[Job.TASK], 'args', j[Job.ARGS], 'enq', now_s,
      'seq', order, 'st', st}
    local n, extra = unusual_fields(h, j, tenant, slots), false
    if run_at ~= now then
      h[n + 1], h[n + 2], n = 'run', run_at, n + 2
    end
    if cls ~= core.DEFAULT_CLASS then
      h[n + 1], h[n + 2], n = 'cls', cls, n + 2
    end
    if fkey and fkey ~= '' then
      h[n + 1], h[n + 2], n, extra = 'fk', fkey, n + 2, true
    end
    if j[Job.LIMITS] and #j[Job.LIMITS] > 0 then
      h[n + 1], h[n + 2], n, extra = 'lim', cmsgpack.pack(j[Job.LIMITS]), n + 2, true
    end
    if j[Job.RATES] and #j[Job.RATES] > 0 then
      h[n + 1], h[n + 2], n, extra = 'rk', cmsgpack.pack(j[Job.RATES]), n + 2, true
    end
    if (tonumber(j[Job.RATE_MU]) or 0) > 0 then
      -- what the job is expected to cost, at most the least burst of its units keys
      -- (the caller was refused if its own estimate did not fit)
      local rmu = expected_mu(p, tonumber(j[Job.RATE_MU]), j[Job.DECLARED] == 1, j[Job.COST_KEY], call_learned)
      for _, rate in ipairs(j[Job.RATES]) do
        if tonumber(rate[RateKey.UNITS]) == 1 then
          rmu = math.min(rmu, math.floor(tonumber(rate[RateKey.BURST]) * 1000))
        end
      end
      h[n + 1], h[n + 2], n, extra = 'rmu', rmu, n + 2, true
    end
    -- whether an optional field the ack reads is written (core.read)
    local acked = false
    if dl ~= '' then
      h[n + 1], h[n + 2], n, extra, acked = 'dl', dl, n + 2, true, true
      -- the lane's deadline index, which the slots its deadlines need are read from, until
      -- the job finishes (records.finish): a job without a deadline writes nothing to it
      redis.call('ZADD', lane_key(p, lane, 'dl'), dl, id)
    end
    if idem ~= '' then
      h[n + 1], h[n + 2], n, extra, acked = 'idem', idem, n + 2, true, true
      redis.call('HSET', call_keys[IDEM], idem, id)
    end
    if j[Job.PARENT] and j[Job.PARENT] ~= '' then
      h[n + 1], h[n + 2], n, extra, acked = 'par', j[Job.PARENT], n + 2, true, true
    end
    -- only traced enqueues send a context: an untraced job carries no field for it
    if j[Job.TRACE_CONTEXT] and j[Job.TRACE_CONTEXT] ~= '' then
      h[n + 1], h[n + 2], n, extra = 'tp', j[Job.TRACE_CONTEXT], n + 2, true
    end
    if call_cost_mode then
      h[n + 1], h[n + 2], n = 'cu',
        arg(charge_mu(p, tonumber(j[Job.DECLARED_MU]) or 0, j[Job.DECLARED] == 1, j[Job.COST_KEY], call_learned)), n + 2
    end
    if verdict == 'deferred' then
      h[n + 1], h[n + 2], n = 'dmu', mu, n + 2
    end
    -- `x` (core.read): whether the record holds an optional field, and, when it holds none
    -- an ack reads (its keys or its fairness key alone), core.ACK_NONE, so that its ack
    -- looks for none (a reservation, written below, sets '1' itself)
    if extra then
      h[n + 1], h[n + 2], n = 'x', acked and '1' or core.ACK_NONE, n + 2
    end
    redis.call(unpack(h))
    if verdict == 'deferred' then
      log_event(p, id, now, 'submitted', {v = verdict, why = reason, cls = cls})
    elseif st == 'scheduled' then
      -- a deferred job is scheduled when admitted (its 'admitted' event says until when)
      log_event(p, id, now, 'scheduled', {at = run_at})
    end
  end

  -- A call's one job, ready now, handed straight to an idle worker (handoff.lua) when it
  -- is of the plain kind that module models: one slot, no deadline, no keys, in a lane
  -- without pauses, of a tenant without limits, in an app of one shard. Returns
  -- handoff.direct's answer, nil for a job it does not model.
  local function hand_direct(j, id, tenant, cls, slots, dl)
    if slots ~= 1 or dl ~= '' or call_pauses or (j[Job.FAIRNESS_KEY] or '') ~= ''
        or (j[Job.LIMITS] and #j[Job.LIMITS] > 0) or (j[Job.RATES] and #j[Job.RATES] > 0)
        or core.sharded(call_p) or core.any(call_tally, call_keys[TLIMITS]) then
      return nil
    end
    return handoff.direct(call_keys, call_p, call_lane, call_tbl, id, tenant, cls,
      call_cost_mode, call_tally, call_now)
  end

  -- The call's end: the ready pushes written, the tenants' submissions noted, the lane's
  -- next job handed to a worker blocked on its inbox (one slot's worth), the effects
  -- applied, and a worker woken: a scheduled job may be due sooner than a blocked worker's
  -- timeout, so one is woken either way, unless the call's one job went to an idle
  -- worker's inbox (a wake would only send that worker round for an exchange that finds
  -- nothing).
  local function hand_over(n, ready, handed)
    local keys, p, lane, now, tally = call_keys, call_p, call_lane, call_now, call_tally
    flush_pushes(p, lane, call_pushes)
    for tenant, k in pairs(call_submitted) do
      if core.any(tally, keys[TLIMITS]) and redis.call('HEXISTS', keys[TLIMITS], tenant) == 1 then
        note_submissions(p, tenant, k, now)
      end
    end
    if ready then
      local member, worker, lease = peek_idle_worker(p, lane, now)
      if member then
        local popped = {}
        dispatch_lane(keys, p, lane, 1, now, tally, popped)
        if #popped > 0 then
          redis.call('ZREM', lane_key(p, lane, 'idle'), member)
          hand_off(keys, p, worker, lease, popped, now)
          handed = true
        end
      end
    end
    apply_effects(keys, p, tally, now)
    if n > 0 and not (handed and n == 1) then
      wake(p, lane)
    end
  end

  -- ARGV: lane, msgpack array of jobs, each
  --   [id, tenant, prio, task, args, max, bo, to, rc, rf, idem, delay_ms, at_ms, deadline,
  --    class, slots, limits, declared milli-units, cost key, declared (1) or default (0),
  --    parent run id ('' for none), W3C trace context ('' or absent for none: field tp),
  --    fairness key ('' or absent for none: field fk), rate keys ({{key, limit, per_ms,
  --    burst, units}, ..} or absent: field rk), milli-units its units rate keys take
  --    (0 or absent for none: field rmu), 0 when nobody named its class (it then takes its
  --    tenant's default class, classes.tenant_class; 1 or absent: the class is as given)]
  -- with nil for an absent delay/at, '' for an absent idem/deadline; a deadline is '+ms'
  -- (relative) or absolute ms; limits is {{key, limit}, ..} sorted by key.
  -- Returns a flat list: id, code, detail per job. Codes: 1 accepted, 2 deferred (stored,
  -- admitted when room frees), 0 existing via idempotency key, -1 deadline already
  -- past, -2 class unknown in the lane, -4 rejected by admission (detail
  -- 'reason|earlier rejections'), -5 the class is restricted and the tenant not entitled
  -- to it (detail 'class_not_entitled'; a default class is taken only where usable, so
  -- the class refused is the one given): nothing written for negative codes.
  local function enqueue(keys, args)
    begin_call(keys, args[EnqueueArg.LANE])
    local jobs, out, submitted = cmsgpack.unpack(args[EnqueueArg.JOBS]), {}, call_submitted
    local p, lane, now, n, ready, handed = call_p, call_lane, call_now, #jobs, false, false
    -- one counter update reserves FIFO numbers for the whole batch (unused ones leave gaps)
    local first = redis.call('HINCRBY', keys[STATS], 'fifo', n) - n
    -- each job gated, recorded, then placed, its reply entry added: place runs inline, as
    -- every function called per job costs the server a call per job
    for i = 1, n do
      local j = jobs[i]
      if j == nil then
        break -- where ipairs would stop
      end
      local seq, k, id, tenant = first + i, #out, j[Job.ID], j[Job.TENANT]
      local slots = tonumber(j[Job.SLOTS]) or 1
      local code, detail, verdict, reason, mu, run_at, dl, by_deadline =
        gate(j, tenant, slots, seq, n)
      if code then
        local existing = verdict
        out[k + Submitted.ID], out[k + Submitted.CODE], out[k + Submitted.DETAIL] =
          code == Reply.EXISTING and existing or id, code, detail
      else
        local cls = detail
        local st = run_at > now and 'scheduled' or 'queued'
        -- a job with a deadline whose task or class orders by deadline takes its order
        -- number from it now, whenever it enters its queue (deadlineorder.lua); a keyed
        -- job entering its tenant's queue now takes its key's fair order number
        -- (fairkeys.lua); a scheduled or deferred one takes it when it first enters the
        -- queue (promote_due in lease.lua, the readmission pass in records.lua), and a
        -- job without a key costs no command here
        local fkey, order = j[Job.FAIRNESS_KEY], seq
        if dl ~= '' and (by_deadline or j[Job.DEADLINE_ORDER] == 1) then
          order = deadlineorder.deadline_order(dl)
        elseif fkey and fkey ~= '' and st == 'queued' and verdict ~= 'deferred' then
          fairqueue.flush_queue(call_pushes, tenant_queue(p, lane, cls, tenant))
          order = fairkeys.order(p, lane, cls, tenant, fkey, seq)
        end
        record(j, id, tenant, cls, st, order, verdict, reason, mu, run_at, dl, slots)
        -- place: where the stored job waits: its class's deferred queue until room frees,
        -- its lane's delayed set, or its tenant queue (ready); an admitted job holds its
        -- reservation
        if verdict == 'deferred' then
          defer(p, lane, cls, id, seq)
          count(call_tally, 'deferred')
        else
          if mu then
            reserve(p, lane, cls, tenant, id, mu)
          end
          if st == 'scheduled' then
            redis.call('ZADD', lane_key(p, lane, 'delayed'), run_at, id)
          else
            local direct = n == 1 and hand_direct(j, id, tenant, cls, slots, dl)
            handed = direct == 'handed'
            if not handed then
              push_ready(p, lane, cls, tenant, id, j[Job.PRIORITY], order, slots, call_pushes)
              -- (a direct look that found no hand-off possible leaves none to try)
              ready = direct ~= 'none'
            end
          end
        end
        submitted[tenant] = (submitted[tenant] or 0) + 1
        out[k + Submitted.ID], out[k + Submitted.CODE], out[k + Submitted.DETAIL] =
          id, verdict == 'deferred' and Reply.DEFERRED or Reply.ACCEPTED, reason or ''
      end
    end
    hand_over(n, ready, handed)
    return out
  end

  enqueuing.enqueue = enqueue
end
