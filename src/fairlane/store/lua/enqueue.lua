-- Storing submitted jobs: idempotency keys, deadlines, class entitlements, the admission
-- gate, the job's record, its tenant queue or its lane's delayed set, and the hand-off to
-- an idle worker.

-- Tenants' class entitlements (tclasses: tenant -> JSON {c = restricted classes it may
-- use, d = its default class}; fairlane.policy.classes.Entitlement is the rule).

-- Whether any tenant has an entitlement. Asked with tlimits in one EXISTS: enqueue asks
-- for tlimits anyway, so an app that sets neither pays one command for both.
function hot.any_entitled(fx, keys, p)
  local ek = p .. 'tclasses'
  if fx.any[ek] == nil and fx.any[keys[TLIMITS]] == nil
      and redis.call('EXISTS', keys[TLIMITS], ek) == 0 then
    fx.any[ek], fx.any[keys[TLIMITS]] = false, false
  end
  return hot.any(fx, ek)
end

-- The tenant's entitlement (false: none), read once per call into `seen`.
function hot.entitlement(fx, keys, p, seen, tenant)
  local ent = seen[tenant]
  if ent == nil then
    local raw = hot.any_entitled(fx, keys, p) and redis.call('HGET', p .. 'tclasses', tenant)
    ent = raw and cjson.decode(raw) or false
    seen[tenant] = ent
  end
  return ent
end

-- Whether a tenant of entitlement `ent` may use class row `c` (a row of classes.lua's table).
function hot.may_use(c, ent)
  if c[8] ~= 1 then
    return true
  end
  for _, name in ipairs(ent and ent.c or {}) do
    if name == c[1] then
      return true
    end
  end
  return false
end

-- The class a job of `tenant` takes in table `tbl`, and whether the tenant may use it:
-- the given `cls`, unless nobody named it and the tenant's default class is in the
-- table and usable; a class the table lacks is left to the caller (-2). A named
-- unrestricted class costs no command.
function hot.tenant_class(fx, keys, p, seen, tbl, tenant, cls, named)
  local i = class_index(tbl, cls)
  if not i or (named and tbl[i][8] ~= 1) then
    return cls, true
  end
  local ent = hot.entitlement(fx, keys, p, seen, tenant)
  local d = not named and ent and ent.d
  local di = d and class_index(tbl, d)
  if di and hot.may_use(tbl[di], ent) then
    return d, true
  end
  return cls, hot.may_use(tbl[i], ent)
end

-- ARGV: lane, msgpack array of jobs, each
--   [id, tenant, prio, task, args, max, bo, to, rc, rf, idem, delay_ms, at_ms, deadline,
--    class, slots, limits, declared milli-units, cost key, declared (1) or default (0),
--    parent run id ('' for none), W3C trace context ('' or absent for none: field tp),
--    fairness key ('' or absent for none: field fk), rate keys ({{key, limit, per_ms,
--    burst, units}, ..} or absent: field rk), milli-units its units rate keys take
--    (0 or absent for none: field rmu), 0 when nobody named its class (it then takes its
--    tenant's default class, hot.tenant_class; 1 or absent: the class is as given)]
-- with nil for an absent delay/at, '' for an absent idem/deadline; a deadline is '+ms'
-- (relative) or absolute ms; limits is {{key, limit}, ..} sorted by key.
-- Returns a flat list: id, code, detail per job. Codes: 1 accepted, 2 deferred (stored,
-- admitted when room frees), 0 existing via idempotency key, -1 deadline already
-- past, -2 class unknown in the lane, -4 rejected by admission (detail
-- 'reason|earlier rejections'), -5 the class is restricted and the tenant not entitled
-- to it (detail 'class_not_entitled'; a default class is taken only where usable, so
-- the class refused is the one given): nothing written for negative codes.
local function enqueue(keys, args)
  local p, now = prefix(keys), now_ms()
  local now_s = hot.now_arg(now)
  local lane = args[1]
  local jobs = cmsgpack.unpack(args[2])
  local out, tally = {}, new_effects()
  local tbl, cost_mode, adm, qb = lane_declarations(p, lane)
  local learned, seen = {}, {}
  local ready, submitted, pushes = false, {}, hot.new_pushes()
  -- one counter update reserves FIFO numbers for the whole batch (unused ones leave gaps)
  local seq = redis.call('HINCRBY', keys[STATS], 'seq', #jobs) - #jobs
  for _, j in ipairs(jobs) do
    seq = seq + 1
    local id, tenant, prio, idem = j[1], j[2], j[3], j[11]
    local cls, slots = j[15] or DEFAULT_CLASS, tonumber(j[16]) or 1
    local existing = idem ~= '' and redis.call('HGET', keys[IDEM], idem)
    local verdict, reason, mu = 'accepted', nil, nil
    local existing_st = existing and redis.call('HGET', job_key(p, existing), 'st')
    local entitled = true
    if not existing_st then
      cls, entitled = hot.tenant_class(tally, keys, p, seen, tbl, tenant, cls, j[26] ~= 0)
    end
    if existing_st then
      -- the detail says whether the job the key names still waits for admission
      out[#out + 1], out[#out + 2], out[#out + 3] =
        existing, 0, existing_st == 'deferred' and 'deferred' or ''
    elseif not class_index(tbl, cls) then
      out[#out + 1], out[#out + 2], out[#out + 3] = id, -2, ''
    elseif not entitled then
      out[#out + 1], out[#out + 2], out[#out + 3] = id, -5, 'class_not_entitled'
      -- every refusal is counted with its reason, in every lane (accepted jobs only in
      -- lanes with a pool: a plain lane's enqueue pays no counter for them)
      count_decision(tally, lane, cls, 'rejected', 'class_not_entitled')
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
      elseif qb and not (dl ~= '' and (dl <= now or dl < run_at)) then
        -- a lane without a pool: its default queue bounds (bounds.lua)
        verdict, reason =
          queue_bounds.room(p, lane, qb, tbl, cls, tenant, slots, run_at > now, pushes, seq, #jobs)
        if verdict == 'rejected' then
          count_decision(tally, lane, cls, verdict, reason)
        end
      end
      if dl ~= '' and (dl <= now or dl < run_at) then
        out[#out + 1], out[#out + 2], out[#out + 3] = id, -1, ''
        -- a refusal like the others, in the same counters (the gate's rule 2)
        count_decision(tally, lane, cls, 'rejected', 'deadline_unmeetable')
      elseif verdict == 'rejected' then
        local earlier = note_rejection(p, lane, tenant, now)
        out[#out + 1], out[#out + 2], out[#out + 3] = id, -4, reason .. '|' .. earlier
        count(tally, 'rejected')
      else
        local jk = job_key(p, id)
        local st = run_at > now and 'scheduled' or 'queued'
        -- a keyed job entering its tenant's queue now takes its key's fair order number
        -- (fairkeys.lua); a scheduled or deferred one takes it when it first enters the
        -- queue (promote_due in lease.lua, the readmission pass in records.lua), and a
        -- job without a key costs no command here
        local fkey, order = j[23], seq
        if fkey and fkey ~= '' and st == 'queued' and verdict ~= 'deferred' then
          hot.flush_queue(pushes, tenant_queue(p, lane, cls, tenant))
          order = fairkeys.order(p, lane, cls, tenant, fkey, seq)
        end
        -- one write of the whole record: the optional fields ride on it
        local h = {'HSET', jk, 'x', '', 'task', j[4], 'tenant', tenant, 'lane', lane,
          'prio', hot.arg(prio), 'args', j[5], 'max', hot.arg(j[6]),
          'bo', j[7], 'to', hot.arg(j[8]), 'rc', j[9], 'rf', j[10], 'enq', now_s,
          'run', run_at == now and now_s or run_at, 'seq', order, 'st', st,
          'att', '0', 'cls', cls, 'sl', hot.arg(slots)}
        local n, extra = #h, false
        if fkey and fkey ~= '' then
          h[n + 1], h[n + 2], n, extra = 'fk', fkey, n + 2, true
        end
        if j[17] and #j[17] > 0 then
          h[n + 1], h[n + 2], n, extra = 'lim', cmsgpack.pack(j[17]), n + 2, true
        end
        if j[24] and #j[24] > 0 then
          h[n + 1], h[n + 2], n, extra = 'rk', cmsgpack.pack(j[24]), n + 2, true
        end
        if (tonumber(j[25]) or 0) > 0 then
          -- what the job is expected to cost, at most the least burst of its units keys
          -- (the caller was refused if its own estimate did not fit)
          local rmu = expected_mu(p, tonumber(j[25]), j[20] == 1, j[19], learned)
          for _, r in ipairs(j[24]) do
            if tonumber(r[5]) == 1 then
              rmu = math.min(rmu, math.floor(tonumber(r[4]) * 1000))
            end
          end
          h[n + 1], h[n + 2], n, extra = 'rmu', rmu, n + 2, true
        end
        if dl ~= '' then
          h[n + 1], h[n + 2], n, extra = 'dl', dl, n + 2, true
        end
        if idem ~= '' then
          h[n + 1], h[n + 2], n, extra = 'idem', idem, n + 2, true
          redis.call('HSET', keys[IDEM], idem, id)
        end
        if j[19] and j[19] ~= '' then
          h[n + 1], h[n + 2], n = 'ck', j[19], n + 2
        end
        if j[21] and j[21] ~= '' then
          h[n + 1], h[n + 2], n, extra = 'par', j[21], n + 2, true
        end
        -- only traced enqueues send a context: an untraced job carries no field for it
        if j[22] and j[22] ~= '' then
          h[n + 1], h[n + 2], n, extra = 'tp', j[22], n + 2, true
        end
        if cost_mode then
          h[n + 1], h[n + 2], n = 'cu',
            hot.arg(charge_mu(p, tonumber(j[18]) or 0, j[20] == 1, j[19], learned)), n + 2
        end
        if verdict == 'deferred' then
          h[n + 1], h[n + 2], n = 'dmu', mu, n + 2
        end
        -- `x` (hot.read): whether the record holds an optional field (a reservation,
        -- written below, sets it itself)
        if extra then
          h[4] = '1'
        end
        redis.call(unpack(h))
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
          defer(p, lane, cls, id, seq)
          count(tally, 'deferred')
        elseif mu then
          reserve(p, lane, cls, tenant, id, mu)
        end
        -- a deferred job waits in its class's deferred queue until room frees
        if verdict ~= 'deferred' and st == 'scheduled' then
          redis.call('ZADD', lane_key(p, lane, 'delayed'), run_at, id)
        elseif verdict ~= 'deferred' then
          push_ready(p, lane, cls, tenant, id, prio, order, slots, pushes)
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
    if hot.any(tally, keys[TLIMITS]) and redis.call('HEXISTS', keys[TLIMITS], tenant) == 1 then
      note_submissions(p, tenant, n, now)
    end
  end
  local handed = false
  if ready then
    -- a worker blocked on its inbox gets the lane's next job (one slot's worth) at once
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
  -- a scheduled job may be due sooner than a blocked worker's timeout: wake one either
  -- way, unless the call's one job went to an idle worker's inbox (a wake would only
  -- send that worker round for an exchange that finds nothing)
  if #jobs > 0 and not (handed and #jobs == 1) then
    wake(p, lane)
  end
  return out
end
