-- Admission: reservations of work against a lane's capacity in units, bounded queues,
-- and deferral (docs/contracts/admission.md states the rules, fairlane/policy/admission
-- is their Python twin; this is the store's).
-- Everything is counted in integer milli-units. A lane without an admission config
-- (`adm` in its state hash) admits everything and reserves nothing. A pool of an app of
-- many shards (`n` > 1 in its config) holds for the whole app: each shard admits against
-- its part of it (at_part), and counts what it refuses for want of room for the
-- balancer's report (globalkeys.lua): `gr` milli-units and `gn` submissions.
--   state `adm`        JSON {C, R, max, safety, window, classes = {name: [max_queue,
--                      max_queue_mu (-1 none), tenant_max_queue, max_deferred, defer,
--                      tenant_max_queue_mu (-1 none)]}}
--   state `utable`     the class table for units (min_slots = min milli-units)
--   state `ar:<c>`     milli-units reserved by admitted, unfinished jobs of class c
--   state `an:<c>`     admitted, unfinished jobs of class c
--   state `ad:<c>`     deferred jobs of class c
--   lane:<l>:adm:t     hash '<c>|<tenant>' -> admitted, unfinished jobs of the tenant
--   lane:<l>:adm:tu    hash '<c>|<tenant>' -> milli-units those jobs reserved
--   state `ao:<c>`     overtakes of class c's pinned deferred head (absent: no pin)
--   lane:<l>:c:<c>:deferred  zset: every deferred job id by seq (the class's index)
--   lane:<l>:c:<c>:dq:<t>    zset: tenant t's deferred job ids by seq (its group)
--   lane:<l>:c:<c>:dfair     zset: tenant with deferred jobs -> start tag
--   lane:<l>:c:<c>:didle     zset: tenant -> finish tag, only tags above V (while
--                            some job is deferred)
--   lane:<l>:c:<c>:dvt       hash: V, the pinned head `pin` and its tenant `pt`
--   lane:<l>:adm:rej   hash tenant -> '<count>|<window start ms>': recent rejections
--   cost:<key>         hash mean, n: a learned cost per (tenant, workflow, model)
--   KEYS[THR] `gs`, `gf:pool:<l>`  the app's shard count, this shard's part of the pool
--
-- Keys: lane:<l>:state (adm, utable, ar:/an:/ad:/ao:<c>, gr, gn), lane:<l>:adm:t|tu|rej,
--   KEYS[THR] (gs, gf:pool:<l>),
--   lane:<l>:c:<c>:deferred|dq:<t>|dfair|didle|dvt|fair|vt, cost:<key>, job:<id>
-- Calls: core, classes, fairqueue, queue_bounds, keyparts
-- Entry points: admission.{MIN_CHARGE_MU, REJECT_WINDOW_MS, adjust_tag, admission_of,
--   admit_new, at_part, charge_mu, count_decision, defer, deferral, expected_mu,
--   lane_declarations, learn_costs, note_rejection, release_reservation, reserve,
--   room_for}

local admission = {}

do
  local job_key, lane_key = core.job_key, core.lane_key
  local DEFAULT_CLASSES, choose_class = classes.DEFAULT_CLASSES, classes.choose_class
  local class_levels = classes.class_levels
  local class_key = fairqueue.class_key

  local REJECT_WINDOW_MS = 60000
  local COST_RISE = 0.5
  local MIN_CHARGE_MU = __MIN_CHARGE_MILLI__
  -- fairlane/policy/admission/deferral.py's OVERTAKE_LIMIT and PASS_BUDGET, written in by
  -- the library; fair deferral's helpers and constants live in one table of their own
  local deferral = {OVERTAKES = __OVERTAKE_LIMIT__, PASS_BUDGET = __PASS_BUDGET__}

  -- A pool of an app of many shards holds for the whole app (policy/globalkeys.py,
  -- pool_part and pool_scaled): this shard admits against its part, every bound of the
  -- pool (capacity, recovery reserve, class floors, max_queue, max_queue_units,
  -- max_deferred) rounded down to it, so that the shards' bounds sum to at most the
  -- pool's; a tenant's bounds stay whole (a tenant lives in one shard). One HMGET, made
  -- only for such a pool; `whole` keeps the pool's capacity, for the balancer's report.
  local function at_part(keys, lane, cfg)
    if not cfg.n or cfg.n <= 1 then
      return cfg
    end
    local v = redis.call('HMGET', keys[core.THR], 'gs', 'gf:' .. keyparts.POOL_PREFIX .. lane)
    local part, scaled = keyparts.pool_part(v[2], tonumber(v[1]) or cfg.n), keyparts.scaled
    cfg.part, cfg.whole = part, cfg.C
    cfg.C, cfg.R = scaled(cfg.C, part), scaled(cfg.R, part)
    for _, b in pairs(cfg.classes) do
      b[Adm.MAX_QUEUE] = scaled(b[Adm.MAX_QUEUE], part)
      b[Adm.MAX_DEFERRED] = scaled(b[Adm.MAX_DEFERRED], part)
      if b[Adm.MAX_QUEUE_MU] >= 0 then
        b[Adm.MAX_QUEUE_MU] = scaled(b[Adm.MAX_QUEUE_MU], part)
      end
    end
    for _, c in ipairs(cfg.utable) do
      c[ClassRow.MIN_SLOTS] = scaled(c[ClassRow.MIN_SLOTS], part)
    end
    return cfg
  end

  local function admission_of(keys, p, lane)
    local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'adm', 'utable')
    if not v[1] then
      return nil
    end
    local cfg = cjson.decode(v[1])
    cfg.utable = cjson.decode(v[2])
    return at_part(keys, lane, cfg)
  end

  -- Everything a lane declares, in one read: its class table, whether tenants are
  -- charged by cost, its admission config (nil: none), its default queue bounds with
  -- the call's counts (bounds.lua; nil: none) and whether the shard has pauses.
  local function lane_declarations(keys, p, lane)
    local v = redis.call('HMGET', lane_key(p, lane, 'state'), 'table', 'charge', 'adm', 'utable',
      'qb', 'P')
    local adm
    if v[3] then
      adm = cjson.decode(v[3])
      adm.utable = cjson.decode(v[4])
      adm = at_part(keys, lane, adm)
    end
    return core.class_table(v[1] or DEFAULT_CLASSES), v[2] == 'cost', adm, queue_bounds.parse(v[5]),
      v[6] ~= false
  end

  local function tenant_count_key(p, lane)
    return lane_key(p, lane, 'adm:t')
  end

  -- The learned cost of a (tenant, workflow, model) key in milli-units, or nil.
  local function learned_mu(p, cost_key)
    if not cost_key or cost_key == '' then
      return nil
    end
    return tonumber(redis.call('HGET', p .. 'cost:' .. cost_key, 'mean'))
  end

  -- The learned cost of a key, read once per call: `cache` keeps false for a key that has
  -- none, so that a batch of one key's jobs costs one read.
  local function cached_learned_mu(p, cost_key, cache)
    local learned = cache[cost_key or '']
    if learned == nil then
      learned = learned_mu(p, cost_key) or false
      cache[cost_key or ''] = learned
    end
    return learned
  end

  -- What a new job is expected to cost, in milli-units: the larger of what the caller
  -- declared and what its key was learned to cost; with nothing declared, the learned
  -- cost alone (the default cost until something is learned).
  local function expected_mu(p, declared_mu, declared, cost_key, cache)
    local learned = cached_learned_mu(p, cost_key, cache)
    if learned == false then
      return declared_mu
    end
    if declared then
      return math.max(declared_mu, learned)
    end
    return learned
  end

  -- What dispatch charges a new job's tenant in 'cost' mode, in milli-units
  -- (fairlane/policy/admission, charge_milli): what the job's key was learned to cost
  -- (or what the caller declared, if more); a job nobody knows anything about yet is
  -- charged the least, MIN_CHARGE_MU, and corrected when it ends.
  local function charge_mu(p, declared_mu, declared, cost_key, cache)
    local learned = cached_learned_mu(p, cost_key, cache)
    local mu = declared and declared_mu or 0
    if learned then
      mu = math.max(mu, learned)
    end
    return math.max(MIN_CHARGE_MU, mu)
  end

  -- A job's cost correction when it ends: its tenant's tag in its class moves by the gap
  -- between what it used and what it was charged, over the tenant's weight (fairqueue.py
  -- rule 4: a charge lands on the present, a refund never puts the tenant ahead of V).
  local function adjust_tag(p, lane, cls, tenant, delta)
    local vt = class_key(p, lane, cls, 'vt')
    local fair = class_key(p, lane, cls, 'fair')
    local v = tonumber(redis.call('HGET', vt, 'V')) or 0
    local tag = tonumber(redis.call('ZSCORE', fair, tenant))
    if tag then
      redis.call('ZADD', fair, math.max(v, math.max(tag, v) + delta), tenant)
    else
      local finish = tonumber(redis.call('HGET', vt, 'f:' .. tenant)) or 0
      redis.call('HSET', vt, 'f:' .. tenant, math.max(v, math.max(finish, v) + delta))
    end
  end

  -- Fold jobs' actual costs, in order, into their key's learned cost: quick to rise
  -- (half the gap per job), slow to fall (alpha = 2 / (window + 1)), so under-declaring
  -- stops paying within a few jobs while one cheap job barely lowers the estimate.
  local function learn_costs(p, cost_key, samples, window)
    local ck = p .. 'cost:' .. cost_key
    local v = redis.call('HMGET', ck, 'mean', 'n')
    local mean, n = tonumber(v[1]), tonumber(v[2]) or 0
    for _, actual_mu in ipairs(samples) do
      if not mean or n == 0 then
        mean = actual_mu
      elseif actual_mu > mean then
        mean = mean + COST_RISE * (actual_mu - mean)
      else
        mean = mean + 2 / (window + 1) * (actual_mu - mean)
      end
      n = n + 1
    end
    redis.call('HSET', ck, 'mean', mean, 'n', n)
    return mean
  end

  -- Rules 3-5 of the admission contract for one request; returns 'accepted', or the reason
  -- it is full, and the overtakes of the class's pinned deferred head (nil: none). A class
  -- whose pinned head has been overtaken deferral.OVERTAKES times is held: it has no room for
  -- anything but its deferred queue's pass (`readmitting`).
  local function room_for(p, lane, cfg, cls, tenant, mu, fresh, readmitting)
    local bounds = cfg.classes[cls]
    local sk = lane_key(p, lane, 'state')
    local nt = tonumber(redis.call('HGET', tenant_count_key(p, lane), cls .. '|' .. tenant)) or 0
    if bounds and nt >= bounds[Adm.TENANT_MAX_QUEUE] then
      return 'tenant_queue_full'
    end
    if bounds and (bounds[Adm.TENANT_MAX_QUEUE_MU] or -1) >= 0 then
      local tu = tonumber(redis.call('HGET', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant)) or 0
      if tu + mu > bounds[Adm.TENANT_MAX_QUEUE_MU] then
        return 'tenant_queue_full'
      end
    end
    local tbl = cfg.utable
    local fields = {'an:' .. cls, 'ao:' .. cls}
    for i, c in ipairs(tbl) do
      fields[i + 2] = 'ar:' .. c[ClassRow.NAME]
    end
    local v = redis.call('HMGET', sk, unpack(fields))
    local ao = tonumber(v[2])
    local reserved, w, d, total, x = {}, {}, {}, 0, nil
    for i, c in ipairs(tbl) do
      reserved[i] = math.max(0, tonumber(v[i + 2]) or 0)
      total = total + reserved[i]
      d[i] = 0
      if c[ClassRow.NAME] == cls then
        x = i
      end
    end
    if bounds and ((tonumber(v[1]) or 0) >= bounds[Adm.MAX_QUEUE]
        or (bounds[Adm.MAX_QUEUE_MU] >= 0 and reserved[x] + mu > bounds[Adm.MAX_QUEUE_MU])) then
      return 'class_queue_full', ao
    end
    if ao and ao >= deferral.OVERTAKES and not readmitting then
      return 'class_full', ao
    end
    -- the class rules take widths of at least one; the job still reserves its true mu
    w[x], d[x] = math.max(mu, 1), math.max(mu, 1)
    if choose_class(class_levels(tbl, cfg.C), reserved, w, d) ~= x then
      return 'class_full', ao
    end
    if fresh and cfg.C - total - mu < cfg.R then
      return 'class_full', ao
    end
    return 'accepted', ao
  end

  local function reserve(p, lane, cls, tenant, id, mu)
    local sk = lane_key(p, lane, 'state')
    redis.call('HINCRBY', sk, 'ar:' .. cls, mu)
    redis.call('HINCRBY', sk, 'an:' .. cls, 1)
    redis.call('HINCRBY', tenant_count_key(p, lane), cls .. '|' .. tenant, 1)
    redis.call('HINCRBY', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant, mu)
    -- `mu` is the live reservation (released once); `emu` keeps what was reserved
    redis.call('HSET', job_key(p, id), 'mu', mu, 'emu', mu, 'x', '1')
  end

  -- A job's reservation ends (it finished, or a retry left for its backoff).
  local function release_reservation(p, id, lane, cls, tenant, mu, fx)
    mu = tonumber(mu)
    if not mu then
      return
    end
    -- `0 - mu`, not `-mu`: a free job's -0 reaches the server as '-0', which Redis 7.0
    -- refuses as an integer
    local back = 0 - mu
    local sk = lane_key(p, lane, 'state')
    redis.call('HINCRBY', sk, 'ar:' .. cls, back)
    redis.call('HINCRBY', sk, 'an:' .. cls, -1)
    if redis.call('HINCRBY', tenant_count_key(p, lane), cls .. '|' .. tenant, -1) <= 0 then
      redis.call('HDEL', tenant_count_key(p, lane), cls .. '|' .. tenant)
    end
    if redis.call('HINCRBY', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant, back) <= 0 then
      redis.call('HDEL', lane_key(p, lane, 'adm:tu'), cls .. '|' .. tenant)
    end
    redis.call('HDEL', job_key(p, id), 'mu')
    fx.readmit[lane] = true
  end

  -- Fair deferral (fairlane/policy/admission/deferral.py; the contract's Fair deferral):
  -- a class's deferred jobs wait in per-tenant groups, FIFO by seq, and are admitted
  -- again by the start-time fair rule of the lane's fair queue, charged their reserved
  -- units. The class's index `deferred` (every deferred id by seq) is what cancel, the
  -- views and the counts read; a job cancelled out of it leaves its group when a pass
  -- reaches it.
  function deferral.group(p, lane, cls, tenant)
    return class_key(p, lane, cls, 'dq:' .. tenant)
  end

  -- A job waits in its class's deferred queue; its tenant activates at max(V, F_t) when
  -- its group was empty. `tenant` is read from the record when the caller has not.
  local function defer(p, lane, cls, id, seq, tenant)
    tenant = tenant or redis.call('HGET', job_key(p, id), 'tenant') or core.DEFAULT_TENANT
    redis.call('ZADD', class_key(p, lane, cls, 'deferred'), seq, id)
    local group = deferral.group(p, lane, cls, tenant)
    redis.call('ZADD', group, seq, id)
    if redis.call('ZCARD', group) == 1 then
      local idle = class_key(p, lane, cls, 'didle')
      local v = tonumber(redis.call('HGET', class_key(p, lane, cls, 'dvt'), 'V')) or 0
      local finish = tonumber(redis.call('ZSCORE', idle, tenant))
      if finish then
        redis.call('ZREM', idle, tenant)
      end
      redis.call('ZADD', class_key(p, lane, cls, 'dfair'), math.max(v, finish or 0), tenant)
    end
    redis.call('HINCRBY', lane_key(p, lane, 'state'), 'ad:' .. cls, 1)
    redis.call('HSET', job_key(p, id), 'st', 'deferred')
  end

  -- One readmission pass's view of a class's deferred queue: V, the pin, its overtakes,
  -- the tenants passed over in this pass and the weights read.
  function deferral.pass(p, lane, cls, weights_key, weights)
    local d = redis.call('HMGET', class_key(p, lane, cls, 'dvt'), 'V', 'pin', 'pt')
    local ov = redis.call('HGET', lane_key(p, lane, 'state'), 'ao:' .. cls)
    return {p = p, lane = lane, cls = cls, v = tonumber(d[1]) or 0, pin = d[2], pt = d[3],
      ov = tonumber(ov) or 0, passed = {}, npassed = 0, tried = 0,
      fair = class_key(p, lane, cls, 'dfair'), wk = weights_key, weights = weights}
  end

  -- The next head to try, or nil when the pass is over: the pinned head alone when the
  -- class is held, else the head of the tenant with the least (tag, tenant) not passed
  -- over. Returns its id, tenant and whether it is the held pin.
  function deferral.next(ps)
    if ps.tried >= deferral.PASS_BUDGET then
      return nil
    end
    if ps.pin and ps.ov >= deferral.OVERTAKES then
      ps.tried = ps.tried + 1
      return ps.pin, ps.pt, true
    end
    -- at most npassed tenants are passed over, so the first npassed + 1 by tag hold the
    -- least one that is not
    local r = redis.call('ZRANGE', ps.fair, 0, ps.npassed)
    for _, tenant in ipairs(r) do
      if not ps.passed[tenant] then
        ps.tried = ps.tried + 1
        return redis.call('ZRANGE', deferral.group(ps.p, ps.lane, ps.cls, tenant), 0, 0)[1],
          tenant, false
      end
    end
    return nil
  end

  -- Whether a job of `mu` could fit class `cls` in an empty pool (rules 3-5 with nothing
  -- reserved): a head that never could is not pinned, so it cannot hold its class.
  function deferral.ever_fits(cfg, cls, mu, fresh)
    local bounds = cfg.classes[cls]
    if bounds and (bounds[Adm.MAX_QUEUE] < 1 or bounds[Adm.TENANT_MAX_QUEUE] < 1 or (bounds[Adm.MAX_QUEUE_MU] >= 0 and mu > bounds[Adm.MAX_QUEUE_MU])
        or ((bounds[Adm.TENANT_MAX_QUEUE_MU] or -1) >= 0 and mu > bounds[Adm.TENANT_MAX_QUEUE_MU])) then
      return false
    end
    if fresh and cfg.C - mu < cfg.R then
      return false
    end
    local tbl = cfg.utable
    local reserved, w, d, x = {}, {}, {}, nil
    for i, c in ipairs(tbl) do
      reserved[i], d[i] = 0, 0
      if c[ClassRow.NAME] == cls then
        x = i
      end
    end
    w[x], d[x] = math.max(mu, 1), math.max(mu, 1)
    return choose_class(class_levels(tbl, cfg.C), reserved, w, d) == x
  end

  -- The head did not fit: its tenant is passed over for the rest of the pass (room only
  -- shrinks within it), and it is pinned if no head is and it could ever fit.
  function deferral.pass_over(ps, id, tenant, pinnable)
    ps.passed[tenant] = true
    ps.npassed = ps.npassed + 1
    if not ps.pin and pinnable then
      ps.pin, ps.pt, ps.ov = id, tenant, 0
    end
  end

  -- A head leaves its class's deferred queue, admitted (its tenant charged its units over
  -- its weight, V moved up to its tag) or dropped (uncharged).
  function deferral.take(ps, id, tenant, mu, admitted)
    local p, lane, cls = ps.p, ps.lane, ps.cls
    local group = deferral.group(p, lane, cls, tenant)
    redis.call('ZREM', group, id)
    if redis.call('ZREM', class_key(p, lane, cls, 'deferred'), id) == 1 then
      redis.call('HINCRBY', lane_key(p, lane, 'state'), 'ad:' .. cls, -1)
    end
    local tag = tonumber(redis.call('ZSCORE', ps.fair, tenant)) or ps.v
    if admitted then
      local wt = ps.weights[tenant]
      if not wt then
        wt = tonumber(redis.call('HGET', ps.wk, tenant)) or 1
        ps.weights[tenant] = wt
      end
      ps.v = math.max(ps.v, tag)
      tag = tag + math.max(mu, MIN_CHARGE_MU) / 1000 / wt
      if ps.pin and ps.pin ~= id then
        ps.ov = ps.ov + 1
      end
    end
    if ps.pin == id then
      ps.pin, ps.pt, ps.ov = nil, nil, 0
    end
    if redis.call('ZCARD', group) == 0 then
      redis.call('ZREM', ps.fair, tenant)
      if tag > ps.v then
        redis.call('ZADD', class_key(p, lane, cls, 'didle'), tag, tenant)
      end
    elseif admitted then
      redis.call('ZADD', ps.fair, tag, tenant)
    end
  end

  -- The pass ends: finish tags at or below V are deleted; with no group left, V, the finish
  -- tags and the pin go too. Otherwise V, the pin and its overtakes are written back.
  function deferral.end_pass(ps)
    local p, lane, cls = ps.p, ps.lane, ps.cls
    local idle = class_key(p, lane, cls, 'didle')
    local dvt = class_key(p, lane, cls, 'dvt')
    local sk = lane_key(p, lane, 'state')
    if redis.call('EXISTS', ps.fair) == 0 then
      redis.call('DEL', dvt, idle)
      redis.call('HDEL', sk, 'ao:' .. cls)
      return
    end
    redis.call('ZREMRANGEBYSCORE', idle, '-inf', ps.v)
    if ps.pin then
      redis.call('HSET', dvt, 'V', ps.v, 'pin', ps.pin, 'pt', ps.pt)
      redis.call('HSET', sk, 'ao:' .. cls, ps.ov)
    else
      redis.call('HSET', dvt, 'V', ps.v)
      redis.call('HDEL', dvt, 'pin', 'pt')
      redis.call('HDEL', sk, 'ao:' .. cls)
    end
  end

  local function may_defer(p, lane, cfg, cls)
    local bounds = cfg.classes[cls]
    if not bounds or bounds[Adm.DEFER] ~= 1 then
      return false
    end
    local n = tonumber(redis.call('HGET', lane_key(p, lane, 'state'), 'ad:' .. cls)) or 0
    return n < bounds[Adm.MAX_DEFERRED]
  end

  -- Count a rejection of `tenant`'s request; returns its earlier rejections in the window.
  local function note_rejection(p, lane, tenant, now)
    local rk = lane_key(p, lane, 'adm:rej')
    local n, start = 0, now
    local v = redis.call('HGET', rk, tenant)
    if v then
      local c, s = string.match(v, '^(%d+)|(%d+)$')
      if tonumber(s) and now - tonumber(s) < REJECT_WINDOW_MS then
        n, start = tonumber(c), tonumber(s)
      end
    end
    redis.call('HSET', rk, tenant, (n + 1) .. '|' .. start)
    return n
  end

  -- The decision for a new job (fresh work). Returns 'accepted', 'deferred' or
  -- 'rejected', the reason (nil when accepted) and the reservation in milli-units.
  local function admit_new(p, lane, cfg, cls, tenant, base_mu)
    local mu = math.floor(base_mu * cfg.safety + 0.5)
    if mu > cfg.max then
      return 'rejected', 'too_wide', mu
    end
    local why, ao = room_for(p, lane, cfg, cls, tenant, mu, true)
    if why == 'accepted' then
      if ao then
        -- admitted while the class's pinned deferred head waits: one overtake of it
        redis.call('HINCRBY', lane_key(p, lane, 'state'), 'ao:' .. cls, 1)
      end
      return 'accepted', nil, mu
    end
    if may_defer(p, lane, cfg, cls) then
      return 'deferred', why, mu
    end
    if cfg.part and why ~= 'tenant_queue_full' then
      -- refused for want of the pool's room: demand the balancer's report reads
      local sk = lane_key(p, lane, 'state')
      redis.call('HINCRBY', sk, 'gr', mu)
      redis.call('HINCRBY', sk, 'gn', 1)
    end
    return 'rejected', why, mu
  end

  -- Counts one decision of admit_new in the stats hash, field
  -- 'adm:<outcome>:<reason>:<lane>:<class>' (reason 'none' when accepted), for the
  -- metrics. It joins the call's effects, so a batch costs one HINCRBY per distinct field
  -- rather than one per job. Lane and class names hold no ':' and the reasons are a fixed
  -- set, so the number of fields stays bounded by the declared lanes and classes.
  local function count_decision(fx, lane, cls, verdict, reason)
    local name = 'adm:' .. verdict .. ':' .. (reason or 'none') .. ':' .. lane .. ':' .. cls
    fx.counts[name] = (fx.counts[name] or 0) + 1
  end

  admission.MIN_CHARGE_MU = MIN_CHARGE_MU
  admission.REJECT_WINDOW_MS = REJECT_WINDOW_MS
  admission.adjust_tag = adjust_tag
  admission.admission_of = admission_of
  admission.admit_new = admit_new
  admission.at_part = at_part
  admission.charge_mu = charge_mu
  admission.count_decision = count_decision
  admission.defer = defer
  admission.deferral = deferral
  admission.expected_mu = expected_mu
  admission.lane_declarations = lane_declarations
  admission.learn_costs = learn_costs
  admission.note_rejection = note_rejection
  admission.release_reservation = release_reservation
  admission.reserve = reserve
  admission.room_for = room_for
end
