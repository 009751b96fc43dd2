-- Dispatch: which waiting jobs a worker gets, by the class rules, fair queuing
-- between tenants, throttle keys and rate keys.
--
-- Keys: lane:<l>:state|delayed, lane:<l>:c:<c>:fair|vt, q:<lane>:<class>:<tenant>,
--   job:<id>, trate, KEYS[THR], KEYS[TLIMITS], KEYS[WEIGHTS]
-- Calls: core, classes, rates, throttle, keyruns, pausetable, fairqueue, pauses, records,
--   leasing
-- Entry points: dispatch.{FAIR_WINDOW, bytes_before, charged_units, dispatch_lane, fair_head,
--   fair_idle, fair_moved, fair_tag, fetch, flush_fair, job_rates, lane_load, load_state,
--   new_dispatch, pending, rate_units, state_fields, weight_of}

local dispatch = {}

do
  local THR, TLIMITS, job_key, lane_key = core.THR, core.TLIMITS, core.job_key, core.lane_key
  local log_event, slots_of, wake = core.log_event, core.slots_of, core.wake
  local DEFAULT_CLASSES, choose_class = classes.DEFAULT_CLASSES, classes.choose_class
  local class_levels = classes.class_levels
  local tenant_limit, thr_acquire = throttle.tenant_limit, throttle.thr_acquire
  local class_key, enter_all_woken = fairqueue.class_key, fairqueue.enter_all_woken
  local tenant_queue = fairqueue.tenant_queue
  local count, count_start, finish = records.count, records.count_start, records.finish
  local lease_jobs, promote_due, runnable = leasing.lease_jobs, leasing.promote_due, leasing.runnable

  -- The state hash's fields a dispatch reads for a class table: C, each class's
  -- in-flight and waiting slots (fname, dname), then each class's waiting weight
  -- (fairqueue.lua's activate). Named once per decoded table (core.class_table memoises
  -- them) rather than once per call, which a call of one job (an idle worker's fetch)
  -- paid in full. Nothing writes into them.
  dispatch.state_fields = core.memoised(function(tbl)
    local names = {fields = {'C'}, fname = {}, dname = {}}
    for i, c in ipairs(tbl) do
      local n = #names.fields
      names.fname[i], names.dname[i] = 'f:' .. c[ClassRow.NAME], 'd:' .. c[ClassRow.NAME]
      names.fields[n + 1], names.fields[n + 2] = names.fname[i], names.dname[i]
    end
    for _, c in ipairs(tbl) do
      names.fields[#names.fields + 1] = 'W:' .. c[ClassRow.NAME]
    end
    return names
  end)

  -- One dispatch's view of a lane: what it read once (class table, capacity, weights,
  -- tenant settings, virtual times) and what it changed but has not written yet (the
  -- classes' in-flight and waiting slots as deltas, V), so that a job costs a few
  -- commands instead of one per fact. `flush` writes the deltas.
  local function new_dispatch(keys, p, lane, budget, now, tally)
    local sk = lane_key(p, lane, 'state')
    local cx = {keys = keys, p = p, lane = lane, now = now, tally = tally, sk = sk,
      weights = {}, tlimits = {}, trates = {}, vt = {}, delta = {}, runs = {},
      f = {}, d = {}, heads = {}, w = {}, age = {}, cap = 0, batch = math.min(budget, 100),
      parks = 0, recs = {}, peeks = {}, active = {}, wins = {}, pend = {}, wsum = {},
      wgone = {}}
    local declared = redis.call('HMGET', sk, 'table', 'charge', 'P')
    cx.tbl = core.class_table(declared[1] or DEFAULT_CLASSES)
    cx.cost_mode = declared[2] == 'cost'
    cx.has_pauses = declared[3] ~= false
    local names = dispatch.state_fields(cx.tbl)
    cx.fields, cx.fname, cx.dname = names.fields, names.fname, names.dname
    return cx
  end

  -- an empty list that is never written: the common answer, at no allocation
  local NO_WAKES = {}
  -- the window of an empty fair set (fair_head), never written either: read again at
  -- the next ask, as any window whose tenants are used up
  local NO_WINDOW = {t = NO_WAKES, s = NO_WAKES, i = 1, n = 0, full = false}

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
      dispatch.fair_tag(cx, cls, run.tenant, run.tag)
      run.tag_dirty = false
    end
  end

  local function read_run(cx, cls, run)
    run.ids = redis.call('ZRANGE', tenant_queue(cx.p, cx.lane, cls, run.tenant), 0, cx.batch - 1)
    run.pos = 1
    -- fewer than asked for: the whole queue, so nothing is left to read once they are taken
    run.whole = #run.ids < cx.batch
  end

  -- The fair set of a class, as a dispatch call sees it (start-time fair queuing between
  -- its tenants, fairqueue.lua). Its head comes from a window of its first FAIR_WINDOW
  -- tenants, read in one command and kept in order here as taken tenants move on, so
  -- that rotating between many tenants reads the set once per window rather than once
  -- per job. The tags the call gives and the tenants it idles are written when the call's
  -- view is (flush_dispatch) or before the set is read again: one command each.
  dispatch.FAIR_WINDOW = 32

  function dispatch.pending(cx, cls)
    local pend = cx.pend[cls]
    if not pend then
      pend = {tags = {}, idle = {}, finish = {}, wdrop = 0}
      cx.pend[cls] = pend
    end
    return pend
  end

  -- tenant's tag is `tag` (it stays in the set)
  function dispatch.fair_tag(cx, cls, tenant, tag)
    local t = dispatch.pending(cx, cls).tags
    t[#t + 1] = tag
    t[#t + 1] = tenant
  end

  -- tenant leaves the set, its tag kept as its finish tag (fairqueue.lua's deactivate)
  function dispatch.fair_idle(cx, cls, tenant, tag)
    local pend = dispatch.pending(cx, cls)
    pend.idle[#pend.idle + 1] = tenant
    pend.finish[#pend.finish + 1] = 'f:' .. tenant
    pend.finish[#pend.finish + 1] = tag
    local w = dispatch.weight_of(cx, tenant)
    pend.wdrop = pend.wdrop + w
    cx.wgone[cls] = (cx.wgone[cls] or 0) + w
  end

  function dispatch.flush_fair(cx, cls)
    local pend = cx.pend[cls]
    if not pend then
      return
    end
    cx.pend[cls] = nil
    local fair = class_key(cx.p, cx.lane, cls, 'fair')
    -- in the order given: a tenant tagged, then idled, leaves the set
    core.chunked('ZADD', fair, pend.tags)
    core.chunked('ZREM', fair, pend.idle)
    local vt = class_key(cx.p, cx.lane, cls, 'vt')
    core.chunked('HSET', vt, pend.finish)
    if #pend.idle > 0 then
      -- the tenants that left take their weight with them; the set known empty starts
      -- its sum again from nought
      fairqueue.unweigh(cx.p, cx.lane, cls, nil, pend.wdrop, cx.active[cls] == 0)
    end
  end

  -- The waiting weight of the lane as this view leaves it: over its classes with slots
  -- still waiting, the weight read less what tenants took away since.
  local function lane_weight(cx)
    local sum = 0
    for i, c in ipairs(cx.tbl) do
      local cls = c[ClassRow.NAME]
      if cx.d[i] > 0 and cx.active[cls] ~= 0 then
        sum = sum + math.max(0, (cx.wsum[i] or 0) - (cx.wgone[cls] or 0))
      end
    end
    return sum
  end

  -- The waiting weight of a lane this call did not dispatch from (its budget was spent
  -- on the lanes before it): read as it is stored.
  local function stored_weight(p, lane)
    local sk = lane_key(p, lane, 'state')
    local fields = {}
    for _, c in ipairs(classes.class_table(sk)) do
      fields[#fields + 1] = 'd:' .. c[ClassRow.NAME]
      fields[#fields + 1] = 'W:' .. c[ClassRow.NAME]
    end
    local v, sum = redis.call('HMGET', sk, unpack(fields)), 0
    for i = 1, #v, 2 do
      if (tonumber(v[i]) or 0) > 0 then
        sum = sum + math.max(0, tonumber(v[i + 1]) or 0)
      end
    end
    return sum
  end

  -- Whether `a` sorts before `b` byte by byte, as a sorted set orders members of equal
  -- score (Lua's own string order follows the server's locale).
  function dispatch.bytes_before(a, b)
    local n = #a < #b and #a or #b
    for k = 1, n do
      local x, y = string.byte(a, k), string.byte(b, k)
      if x ~= y then
        return x < y
      end
    end
    return #a < #b
  end

  -- The set's head (tenant, start tag), or nil when it is empty.
  function dispatch.fair_head(cx, cls)
    local w = cx.wins[cls]
    if not w or w.i > w.n then
      dispatch.flush_fair(cx, cls)
      local fair = class_key(cx.p, cx.lane, cls, 'fair')
      local r = redis.call('ZRANGE', fair, 0, dispatch.FAIR_WINDOW - 1, 'WITHSCORES')
      if #r == 0 then
        -- most classes of a lane have no tenant waiting: no window to build
        cx.wins[cls] = NO_WINDOW
        return nil
      end
      if #r > 2 then
        -- re-tagging a tenant is a write per job taken (core.keep_large)
        core.keep_large(cx.tally, fair, true)
      end
      w = {t = {}, s = {}, i = 1, n = #r / 2, full = #r / 2 >= dispatch.FAIR_WINDOW}
      for k = 1, w.n do
        w.t[k], w.s[k] = r[2 * k - 1], tonumber(r[2 * k])
      end
      cx.wins[cls] = w
    end
    return w.t[w.i], w.s[w.i]
  end

  -- The head tenant was taken: it moves to `tag` (nil: it left the set). It goes back
  -- into the window at its place in the set's order (tag, then name, as a sorted set
  -- orders), or out of it when that place is past the window's last tenant of a set the
  -- window does not hold whole (the next read finds it there).
  function dispatch.fair_moved(cx, cls, tenant, tag)
    local w = cx.wins[cls]
    if not w then
      return
    end
    if w.t[w.i] ~= tenant then
      cx.wins[cls] = nil
      return
    end
    w.i = w.i + 1
    if not tag then
      return
    end
    -- the window is in the set's order, so a tenant that sorts after its last tenant
    -- sorts after all of them: between many tenants, where a taken tenant's tag moves
    -- past the others', that is the common case, told without a scan
    local n = w.n
    if w.full and (w.i > n or w.s[n] < tag
        or (w.s[n] == tag and dispatch.bytes_before(w.t[n], tenant))) then
      return
    end
    local j = w.i
    while j <= w.n and (w.s[j] < tag or (w.s[j] == tag and dispatch.bytes_before(w.t[j], tenant))) do
      j = j + 1
    end
    if j > w.n and w.full then
      return
    end
    -- shift the window's tail one place up and put the tenant at j (one slot before the
    -- current head is free, so the window keeps its size)
    w.i = w.i - 1
    for k = w.i, j - 2 do
      w.t[k], w.s[k] = w.t[k + 1], w.s[k + 1]
    end
    w.t[j - 1], w.s[j - 1] = tenant, tag
  end

  -- How many tenants of class `cls` have work waiting (its fair set's size), read once per
  -- call and kept as tenants leave it here: rotating between many tenants reads it once,
  -- not once per job.
  local function active_tenants(cx, cls)
    local n = cx.active[cls]
    if not n then
      n = redis.call('ZCARD', class_key(cx.p, cx.lane, cls, 'fair'))
      cx.active[cls] = n
    end
    return n
  end

  local function flush_dispatch(cx)
    for cls in pairs(cx.runs) do
      flush_run(cx, cls)
    end
    for cls in pairs(cx.pend) do
      dispatch.flush_fair(cx, cls)
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

  function dispatch.weight_of(cx, tenant)
    local wt = cx.weights[tenant]
    if not wt then
      wt = core.tenant_weight(cx.tally, cx.keys, tenant)
      cx.weights[tenant] = wt
    end
    return wt
  end

  -- A paused tenant at the head of class `cls` leaves its fair set as if its queue had
  -- emptied, and is held there until resumed (fairlane/policy/pauses.py, P2). Returns
  -- the new head.
  local function hold_head(cx, cls, tenant, tag)
    dispatch.fair_idle(cx, cls, tenant, tag)
    dispatch.fair_moved(cx, cls, tenant, nil)
    cx.active[cls] = active_tenants(cx, cls) - 1
    pauses.hold(cx.p, cx.lane, cls, tenant)
    return dispatch.fair_head(cx, cls)
  end

  -- The head job of class i: the queue head of the active tenant with the smallest start
  -- tag (a job a throttle key woke is back in its tenant's queue). Returns {kind ('q'),
  -- id, width, tenant, tag}, or false when the class has nothing waiting.
  local function class_head(cx, i)
    local p, lane, cls = cx.p, cx.lane, cx.tbl[i][ClassRow.NAME]
    local run = cx.runs[cls]
    local tenant, tag, id
    if cx.pz and pausetable.class_held(cx.pz, lane, cls) then
      return false
    end
    -- no slots waiting in the class (nor, on a shard that keeps it, weight in its fair
    -- set): nothing to read. Every job enters a queue through fairqueue.push_ready, which
    -- counts its slots into d as it does, and a paused tenant's jobs stay counted while
    -- they are held, so d is never below what waits. Most classes of a lane are empty most
    -- of the time, and reading their fair sets was most of what a dispatch of one job read.
    if not run and cx.d[i] <= 0 and cx.wsum[i] - (cx.wgone[cls] or 0) <= 0 then
      return false
    end
    if run and run.sole then
      tenant, tag, id = run.tenant, run.tag, run.ids[run.pos]
    else
      tenant, tag = dispatch.fair_head(cx, cls)
      while tenant and cx.pz and pausetable.tenant_held(cx.pz, tenant) do
        tenant, tag = hold_head(cx, cls, tenant, tag)
      end
      if not tenant then
        return false
      end
      if run and run.tenant == tenant then
        id = run.ids[run.pos]
      else
        -- its first two ids: enough to start its run when it is taken (most runs between
        -- many tenants are one job long) and to know whether that empties its queue
        local ids = redis.call('ZRANGE', tenant_queue(p, lane, cls, tenant), 0, 1)
        cx.peeks[cls] = {tenant = tenant, ids = ids}
        id = ids[1]
      end
    end
    -- the whole record, kept for `runnable` when the job is taken (nothing writes it in
    -- between: whatever could, makes `load_state` read the heads again). A job key of the
    -- wrong type reads as width 1; `runnable` then drops it. Its age (since run, else enq)
    -- is for a class that ages (max_wait, classes.lua).
    local jf = NO_WAKES
    if id then
      jf = leasing.read_runnable(p, id)
      cx.recs[id] = jf
    end
    -- memoised: the jobs of a batch enqueue share their times, and parsing one costs
    local since = core.num(jf[15]) or core.num(jf[8])
    return {'q', id, slots_of(jf[10]), tenant, tag, age = since and math.max(0, cx.now - since) or 0}
  end

  local function load_state(cx)
    flush_dispatch(cx)
    cx.runs, cx.recs, cx.peeks, cx.active, cx.wins, cx.pend = {}, {}, {}, {}, {}, {}
    cx.wgone, cx.why_x = {}, nil
    local v = redis.call('HMGET', cx.sk, unpack(cx.fields))
    cx.cap = tonumber(v[1]) or 0
    local n = #cx.tbl
    for i = 1, n do
      cx.wsum[i] = tonumber(v[1 + 2 * n + i]) or 0
    end
    if not cx.levels or cx.levels.cap ~= cx.cap then
      cx.levels = class_levels(cx.tbl, cx.cap)
    end
    for i = 1, #cx.tbl do
      cx.f[i] = math.max(0, tonumber(v[2 * i]) or 0)
      cx.d[i] = math.max(0, tonumber(v[2 * i + 1]) or 0)
    end
    for i = 1, #cx.tbl do
      cx.heads[i] = class_head(cx, i)
      cx.w[i] = cx.heads[i] and cx.heads[i][3] or nil
      cx.age[i] = cx.heads[i] and cx.heads[i].age or 0
    end
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
    if f[17] then
      limits = cmsgpack.unpack(f[17])
    end
    local tenant = f[6]
    local configured = cx.tlimits[tenant]
    if configured == nil then
      configured = core.any(cx.tally, cx.keys[TLIMITS])
        and redis.call('HEXISTS', cx.keys[TLIMITS], tenant) == 1
      cx.tlimits[tenant] = configured
    end
    if configured then
      local load = lane_load(cx.levels, cx.f, cx.d)
      local own = tenant_limit(cx.keys, cx.p, tenant, cx.cap, load, cx.now)
      if own then
        limits[#limits + 1] = {'tenant:' .. tenant, own}
        table.sort(limits, function(x, y) return x[1] < y[1] end)
      end
    end
    return limits
  end

  -- The rate keys of a job ({{key, limit, per_ms, burst, units}, ..}): its own `rk`, and
  -- its tenant's key when the tenant has a rate (one read per call tells whether any has).
  function dispatch.job_rates(cx, f)
    local rl = f[23] and cmsgpack.unpack(f[23]) or NO_WAKES
    if cx.any_trate == nil then
      cx.any_trate = redis.call('EXISTS', cx.p .. 'trate') == 1
    end
    if not cx.any_trate then
      return rl
    end
    local tenant = f[6] or ''
    local own = cx.trates[tenant]
    if own == nil then
      own = rates.parse(redis.call('HGET', cx.p .. 'trate', tenant)) or false
      cx.trates[tenant] = own
    end
    if own then
      local out = {{'tenant:' .. tenant, own.limit, own.per, own.burst, own.units and 1 or 0}}
      for _, r in ipairs(rl) do
        out[#out + 1] = r
      end
      return out
    end
    return rl
  end

  -- The units a job is charged in its tenant's tag and in a wake: one, or in 'cost' mode
  -- what it is expected to cost (its record's `cu`, in milli-units).
  local function charged_units(cost_mode, cu)
    return cost_mode and (core.num(cu) or 1) / 1000 or 1
  end
  dispatch.charged_units = charged_units

  -- What a job's rate keys counting units take: its `rmu`, else what its tenant is charged
  -- or admission reserved for it (`emu`), else one unit. `f`: the record as
  -- leasing.read_runnable reads it.
  function dispatch.rate_units(f)
    return (tonumber(f[24]) or tonumber(f[14]) or tonumber(f[25]) or 1000) / 1000
  end

  -- The signature of a job's keys for a run of them (keyruns.lua): its own limits and
  -- rates as stored, when it holds no offers and its tenant is known to have neither a
  -- limit nor a rate of its own (those move from job to job); nil otherwise.
  local function run_signature(cx, f)
    if f[21] or cx.tlimits[f[6]] ~= false or cx.any_trate ~= false then
      return nil
    end
    return (f[17] or '') .. '\0' .. (f[23] or '')
  end

  -- The grant rides on the record's write when the job is leased (lease_jobs).
  local function admitted(cx, f, grant)
    -- each job's keys are lookups in their hash (the hash exists once a call with grants
    -- has returned: its view is written back then)
    core.keep_large(cx.tally, cx.keys[THR])
    f.ttok = grant
  end

  -- Pass a job popped from the fair queue, with its lane slot, through its throttle keys:
  -- a job a key woke converts its offers (its keys are the ones it parked with), any
  -- other is admitted on all its keys or parks. Returns whether it was admitted and the
  -- waiters woken on the way. A job without keys or offers costs nothing here.
  local function admit(cx, id, f)
    -- a job of the call's run on its keys: its own rates are its only ones
    local sig = run_signature(cx, f)
    if sig then
      local units = f[23] and dispatch.rate_units(f) or 1
      local grant = keyruns.acquire(cx.keys, sig, units, cx.now)
      if grant then
        admitted(cx, f, grant)
        return true, NO_WAKES
      end
    end
    local offered = f[21]
    local limits = offered and NO_WAKES or job_limits(cx, f)
    local rl = offered and NO_WAKES or dispatch.job_rates(cx, f)
    if #limits == 0 and #rl == 0 and not offered then
      return true, NO_WAKES
    end
    local charge = charged_units(cx.cost_mode, f[14])
    local units = #rl > 0 and dispatch.rate_units(f) or 1
    local grant, wakes, blocker, names = thr_acquire(cx.keys, id, limits, f[12] or 0,
      f[13] or 0, f[6] or '', charge, rl, units, cx.now)
    if offered then
      redis.call('HDEL', job_key(cx.p, id), 'toff')
    end
    if grant then
      keyruns.remember(cx.keys, sig, names, limits, rl, cx.now)
      admitted(cx, f, grant)
      return true, wakes
    end
    core.keep_large(cx.tally, cx.keys[THR])
    redis.call('HSET', job_key(cx.p, id), 'st', 'throttled')
    log_event(cx.p, id, cx.now, 'parked', {key = blocker or ''})
    count(cx.tally, 'throttled')
    cx.parks = cx.parks + 1
    return false, wakes
  end

  -- Take a class's fair head: take the tenant's head job and pass it through its throttle
  -- keys (`admit`); admitted, move V up to the tenant's tag and charge the tenant one
  -- work unit over its weight (1 per job until estimates exist) -- a job that parks is
  -- not charged. A tenant left with no waiting job becomes idle. Returns the job's id,
  -- fields (nil fields when it does not start now), how many other tenants of the class
  -- had work waiting when its run began (for `queued_why`) and the waiters its throttle
  -- keys woke on the way (the caller enters them once the run is written).
  local function take_fair_head(cx, cls, h)
    local p, lane, tenant, tag = cx.p, cx.lane, h[4], h[5]
    local run = cx.runs[cls]
    if not run or run.tenant ~= tenant then
      flush_run(cx, cls)
      local active = active_tenants(cx, cls)
      run = {tenant = tenant, taken = {}, sole = active == 1, rivals = active - 1}
      local peek = cx.peeks[cls]
      if peek and peek.tenant == tenant then
        run.ids, run.pos, run.whole = peek.ids, 1, #peek.ids < 2
      else
        read_run(cx, cls, run)
      end
      cx.runs[cls] = run
    end
    cx.peeks[cls] = nil
    local id = run.ids[run.pos]
    local f
    if id then
      run.pos = run.pos + 1
      run.taken[#run.taken + 1] = id
      f = runnable(cx.keys, p, id, cx.now, cx.tally, cx.recs[id])
      cx.recs[id] = nil
    end
    local wakes = NO_WAKES
    -- a job of a paused task or key parks, uncharged (P3)
    local fld = f and cx.pz and pausetable.job_field(cx.pz, f[2], f[6] or '', f[22])
    if fld then
      wakes = pauses.park(cx.keys, p, id, f, fld, cx.now)
      cx.parks = cx.parks + 1
      f = nil
    end
    -- a job without keys or offers whose tenant is known to have neither a limit nor a
    -- rate passes at no cost: `admit` would say so, at three calls' cost
    if f and (f[17] or f[21] or f[23] or cx.tlimits[f[6]] ~= false or cx.any_trate ~= false) then
      local admitted
      admitted, wakes = admit(cx, id, f)
      if not admitted then
        f = nil
      end
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
      tag = tag + charged_units(cx.cost_mode, f[14]) / dispatch.weight_of(cx, tenant)
    end
    if not run.ids[run.pos] then
      flush_run(cx, cls)
      if run.whole then
        run.ids, run.pos = NO_WAKES, 1
      else
        read_run(cx, cls, run)
      end
    end
    run.tag = tag
    if run.ids[run.pos] then
      if run.sole then
        run.tag_dirty = true
        cx.wins[cls] = nil
      else
        dispatch.fair_tag(cx, cls, tenant, tag)
        dispatch.fair_moved(cx, cls, tenant, tag)
      end
    else
      dispatch.fair_idle(cx, cls, tenant, tag)
      dispatch.fair_moved(cx, cls, tenant, nil)
      cx.active[cls] = active_tenants(cx, cls) - 1
      cx.runs[cls] = nil
    end
    return id, f, run.rivals, wakes
  end

  -- `qw` of a job that waited only for other tenants (cjson's text for {ten = n}): between
  -- many tenants that is nearly every job, and the encoder's table and call cost more
  -- than a memoised string
  local ten_only = core.memoised(function(n)
    return '{"ten":' .. string.format('%d', n) .. '}'
  end)

  -- Why a job that waited starts only now, as `explain` tells it: the record's `qw`, JSON
  -- {by = {class = [held, assured]}, ten = n}. `by` names the other classes holding more
  -- than their assured slots just before it started (counting what this call's acks gave
  -- back: those slots were held until a moment ago), which borrowed the capacity its class
  -- was owed; `ten` counts the other tenants fair dispatch was sharing its class with.
  -- nil when the job did not wait or neither applies (a lone tenant's backlog): no bytes.
  local function queued_why(cx, x, jf, rivals)
    if (core.num(jf[8]) or cx.now) >= cx.now then
      return nil
    end
    -- the other classes' holdings change only when one of them takes a job, or the view
    -- is read again (load_state): a run of one class's starts computes them once
    local by
    if cx.why_x == x then
      by = cx.why_by or nil
    else
      local ended, assured = cx.tally.ended, cx.levels.a
      ended = ended and ended[cx.lane]
      for i = 1, #cx.tbl do
        local held = cx.f[i] + (ended and ended[cx.tbl[i][ClassRow.NAME]] or 0)
        if i ~= x and held > assured[i] then
          by = by or {}
          by[cx.tbl[i][ClassRow.NAME]] = {held, assured[i]}
        end
      end
      cx.why_x, cx.why_by = x, by or false
    end
    if not by and (rivals or 0) < 1 then
      return nil
    end
    if not by then
      return ten_only(rivals)
    end
    return cjson.encode({by = by, ten = rivals and rivals > 0 and rivals or nil})
  end

  -- The pauses in force for this call (nil: none), read once per call; pauses that ended
  -- are lifted first (pauses.lua), a bounded part of them.
  local function pause_view(p, now, tally)
    if tally.pz == nil then
      local t = pausetable.load(p, now)
      if #t.ended > 0 then
        pauses.lift_ended(p, t)
      end
      tally.pz = next(t.on) and t or false
    end
    return tally.pz or nil
  end

  -- Dispatch up to `budget` slots of a lane's work to a worker. Each step asks the
  -- class rules (classes.lua) which class's head job may start given the lane's cached
  -- capacity C, its classes' in-flight and waiting slots; a head wider than what is
  -- left of the budget ends the step (nothing in a class overtakes its head). A job
  -- popped from the fair queue then passes its throttle keys with its lane slot: it is
  -- admitted (taking both in this step), or it parks (status 'throttled', holding
  -- nothing, its tenant not charged) and the next head is tried. Waiters the keys woke
  -- go back into their tenants' queues, and the lane's state is read again.
  -- Appends {id, fields, lane, why it waited (queued_why)} to `popped`, and counts each
  -- start into the call's effects (records.count_start). Returns the slots
  -- given, whether the lane stopped for want of budget (so it might give more) and the
  -- lane's waiting weight it leaves (lane_weight).
  local function dispatch_lane(keys, p, lane, budget, now, tally, popped)
    local cx = new_dispatch(keys, p, lane, budget, now, tally)
    if cx.has_pauses then
      cx.pz = pause_view(p, now, tally)
      if cx.pz and pausetable.class_held(cx.pz, lane, '') then
        return 0, false, 0
      end
    end
    load_state(cx)
    local given = 0
    while true do
      local x = choose_class(cx.levels, cx.f, cx.w, cx.d, cx.age)
      local h = x and cx.heads[x]
      -- a backlog parking on its keys parks a bounded part per call: the rest is left for
      -- the next fetch, which the lane's wake signal brings
      if not h or h[3] > budget - given or cx.parks >= rates.PARK_BUDGET then
        local waiting = lane_weight(cx)
        flush_dispatch(cx)
        return given, h and true or false, waiting
      end
      local cls, dname, fname = cx.tbl[x][ClassRow.NAME], cx.dname[x], cx.fname[x]
      cx.delta[dname] = (cx.delta[dname] or 0) - h[3]
      cx.d[x] = math.max(0, cx.d[x] - h[3])
      local id, jf, rivals, wakes = take_fair_head(cx, cls, h)
      -- offers a job that cannot run gave back woke waiters too (runnable keeps them)
      local dirty = #wakes > 0 or tally.woken ~= nil
      if dirty then
        flush_dispatch(cx)
        enter_all_woken(p, wakes, now, keys)
        if tally.woken then
          enter_all_woken(p, tally.woken, now, keys)
          tally.woken = nil
        end
      end
      if jf then
        popped[#popped + 1] = {id, jf, lane, queued_why(cx, x, jf, rivals)}
        -- a retry (its record's att: attempts before this one) counted apart, for explain
        count_start(tally, lane, cls, jf[9])
        given = given + h[3]
        cx.f[x] = cx.f[x] + h[3]
        if cx.why_x ~= x then
          cx.why_x = nil -- what the other classes hold changed (queued_why)
        end
        -- (cx.delta anew: a flush above may have written and replaced it)
        cx.delta[fname] = (cx.delta[fname] or 0) + h[3]
      end
      if dirty then
        load_state(cx)
      else
        cx.heads[x] = class_head(cx, x)
        cx.w[x] = cx.heads[x] and cx.heads[x][3] or nil
        cx.age[x] = cx.heads[x] and cx.heads[x].age or 0
      end
    end
  end

  -- Lease up to `n` slots of work from `lanes` (taken in turn) to `worker`. Returns the
  -- jobs, each [id, token, attempt, task, args, timeout, deadline, tenant, max, backoff,
  -- enqueued, slots, class, trace context], the ms until the lanes' next scheduled job
  -- (-1 when none) and the lanes' waiting weight (the sum of the weights of the tenants
  -- with jobs waiting, over the lanes and their classes: fairlane/policy/shardshare.py).
  local function fetch(keys, p, worker, n, lease, promote_limit, lanes, now, tally)
    -- rate keys whose waiters' tokens or pause's end have come (the only timer they have)
    local rate_due = throttle.thr_next_due(keys)
    if rate_due and rate_due <= now then
      enter_all_woken(p, throttle.thr_wake_due(keys, now), now, keys)
      rate_due = throttle.thr_next_due(keys)
    end
    for _, lane in ipairs(lanes) do
      promote_due(keys, p, lane, now, promote_limit, tally)
    end
    -- lanes are served in turn, each round asking for an even share of what is left
    local popped, live, given, busy, weight = {}, {}, 0, {}, {}
    for i, lane in ipairs(lanes) do
      live[i] = lane
    end
    while given < n and #live > 0 do
      local still = {}
      for _, lane in ipairs(live) do
        local want = math.ceil((n - given) / #live)
        if want > 0 then
          local got, more, waiting = dispatch_lane(keys, p, lane, want, now, tally, popped)
          weight[lane] = waiting
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
    local next_due = rate_due and math.max(0, rate_due - now) or -1
    local waiting = 0
    local sharded = core.sharded(p)
    for _, lane in ipairs(lanes) do
      waiting = waiting + (weight[lane] or sharded and stored_weight(p, lane) or 0)
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
    return jobs, next_due, waiting
  end

  dispatch.dispatch_lane = dispatch_lane
  dispatch.fetch = fetch
  dispatch.lane_load = lane_load
  dispatch.load_state = load_state
  dispatch.new_dispatch = new_dispatch
end
