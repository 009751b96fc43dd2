-- Global keys: a shard's side of the balancer's passes (fairlane/policy/globalkeys.py
-- states the protocol and proves that the shards' parts never sum above a key; its
-- ShardParts is the model this is the twin of). A pass reads every shard's report, then
-- sends orders: lowers first, raises within what is free. Each call carries the pass's
-- epoch; a shard refuses a call of an epoch older than the highest it has seen, so an
-- order of a pass overtaken by a newer one that read the shard never lands.
--
-- An admission pool is the key pool:<lane> (keyparts.lua, admission.lua): its report
-- counts milli-units against the pool's capacity, and a raised part admits the lane's
-- deferred jobs that now fit, in the same call.
--
-- Keys: KEYS[THR] (gs, ge, gf:<key>, l:/u:/o:/r:/pz:<key>), KEYS[THRW], <THR>:s:<key>,
--   gkeys, KEYS[WEIGHTS], lane:<l>:state (ar:/an:/ad:<c>, gr, gn), lane:<l>:c:<c>:dfair
-- Calls: core, rates, keyparts, throttle, fairqueue, admission, records
-- Entry points: globalkeys.{enable, order, report}

local globalkeys = {WEIGHT_SAMPLE = 100}

do
  local THR, THRW, WEIGHTS, prefix = core.THR, core.THRW, core.WEIGHTS, core.prefix

  -- Whether a call of `epoch` may act (it raises the epoch seen), and the epoch seen.
  local function fence(keys, epoch)
    local seen = tonumber(redis.call('HGET', keys[THR], 'ge')) or 0
    if epoch < seen then
      return false, seen
    end
    if epoch > seen then
      redis.call('HSET', keys[THR], 'ge', epoch)
    end
    return true, epoch
  end

  -- The sum of the weights of the tenants waiting on `key`: the first WEIGHT_SAMPLE of
  -- them, scaled up to all when more wait.
  local function waiting_weight(keys, key, zset)
    local sk = zset or keys[THR] .. ':s:' .. key
    local tenants = redis.call('ZRANGE', sk, 0, globalkeys.WEIGHT_SAMPLE - 1)
    if #tenants == 0 then
      return 0
    end
    local sum = 0
    for _, w in ipairs(redis.call('HMGET', keys[WEIGHTS], unpack(tenants))) do
      sum = sum + (tonumber(w) or 1)
    end
    local all = redis.call('ZCARD', sk)
    return sum * all / #tenants
  end

  -- What a shard holds of a key: its part, or more while more runs than it.
  local function held(part, limit, used)
    if limit and limit < rates.UNLIMITED and limit > 0 then
      return math.max(part, used / limit)
    end
    return part
  end

  -- A pool's report (policy/globalkeys.py, pool_part): LIMIT its capacity and USED the
  -- shard's reservations, in milli-units; WAITING what waits for room, in milli-units
  -- too (the balancer's targets add it to USED): the submissions refused for want of
  -- room since the last report (`gr`, read and reset here) and the deferred jobs, each
  -- at the mean reservation of the admitted ones (a unit when none is); WEIGHT the
  -- weights of the tenants with deferred jobs, and each refusal as a tenant of weight 1.
  -- A pool is never cleaned up, its absent part is 1/n; a lane no longer pooled leaves
  -- the report (its part kept, so that the parts still sum to at most 1).
  local function pool_report(keys, key)
    local p, lane = prefix(keys), string.sub(key, #keyparts.POOL_PREFIX + 1)
    local cfg = admission.admission_of(keys, p, lane)
    if not cfg or not cfg.part then
      redis.call('ZREM', keyparts.keys_key(keys), key)
      return nil
    end
    local sk = core.lane_key(p, lane, 'state')
    local fields = {'gr', 'gn'}
    for _, c in ipairs(cfg.utable) do
      local n = c[ClassRow.NAME]
      fields[#fields + 1], fields[#fields + 2], fields[#fields + 3] = 'ar:' .. n, 'an:' .. n, 'ad:' .. n
    end
    local v = redis.call('HMGET', sk, unpack(fields))
    local refused, refusals = tonumber(v[1]) or 0, tonumber(v[2]) or 0
    if v[1] or v[2] then
      redis.call('HDEL', sk, 'gr', 'gn')
    end
    local used, admitted, deferred, weight = 0, 0, 0, refusals
    for i, c in ipairs(cfg.utable) do
      local d = tonumber(v[3 * i + 2]) or 0
      used, admitted = used + math.max(0, tonumber(v[3 * i]) or 0), admitted + (tonumber(v[3 * i + 1]) or 0)
      if d > 0 then
        deferred = deferred + d
        weight = weight + waiting_weight(keys, key, fairqueue.class_key(p, lane, c[ClassRow.NAME], 'dfair'))
      end
    end
    local mean = admitted > 0 and used / admitted or 1000
    local e = {}
    e[GkReport.KEY], e[GkReport.PART], e[GkReport.USED] = key, rates.fmt(cfg.part), used
    e[GkReport.LIMIT], e[GkReport.WAITING] = cfg.whole, refused + math.ceil(deferred * mean)
    e[GkReport.WEIGHT] = rates.fmt(weight)
    e[GkReport.ACTIVE] = (admitted > 0 or refusals > 0) and 1 or 0
    e[GkReport.PAUSED_UNTIL] = 0
    return e
  end

  -- A key's report, or nil for a key left idle (no job names it, none waits, no part):
  -- it leaves the report.
  local function key_report(keys, key)
    if string.sub(key, 1, #keyparts.POOL_PREFIX) == keyparts.POOL_PREFIX then
      return pool_report(keys, key)
    end
    local v = redis.call('HMGET', keys[THR], 'l:' .. key, 'u:' .. key, 'o:' .. key, 'r:' .. key,
      'gf:' .. key, 'pz:' .. key)
    local used = (tonumber(v[2]) or 0) + (tonumber(v[3]) or 0)
    local refs, part = tonumber(v[4]) or 0, tonumber(v[5]) or 0
    local waiting = redis.call('ZLEXCOUNT', keys[THRW], '[' .. key .. '\0', '(' .. key .. '\1')
    if refs <= 0 and waiting == 0 and part <= 0 and used == 0 then
      redis.call('ZREM', keyparts.keys_key(keys), key)
      redis.call('HDEL', keys[THR], 'gf:' .. key)
      return nil
    end
    local limit = tonumber(v[1])
    if not limit or limit >= rates.UNLIMITED then
      limit = -1
    end
    local e = {}
    e[GkReport.KEY], e[GkReport.PART], e[GkReport.USED] = key, rates.fmt(part), used
    e[GkReport.LIMIT], e[GkReport.WAITING] = limit, waiting
    e[GkReport.WEIGHT] = rates.fmt(waiting > 0 and waiting_weight(keys, key) or 0)
    e[GkReport.ACTIVE] = refs > 0 and 1 or 0
    e[GkReport.PAUSED_UNTIL] = tonumber(v[6]) or 0
    return e
  end

  -- ARGV: the app's shard count. Makes this shard's keys global (keyparts.lua), before any
  -- of the app's workers dispatch.
  function globalkeys.enable(keys, args)
    redis.call('HSET', keys[THR], 'gs', args[GkEnableArg.SHARDS])
    return 1
  end

  -- ARGV: the pass's epoch, at most how many keys, the app's shard count (a shard
  -- restarted without its data is marked global again by the next pass). Replies {0,
  -- the epoch seen} to a stale epoch, {2} when the shard has more keys than that (a
  -- pass must see every part), else {1, msgpack [GkReport entry, ..]}.
  function globalkeys.report(keys, args)
    local ok, seen = fence(keys, tonumber(args[GkReportArg.EPOCH]))
    if not ok then
      return {0, seen}
    end
    redis.call('HSETNX', keys[THR], 'gs', args[GkReportArg.SHARDS])
    local out = {}
    local limit = tonumber(args[GkReportArg.LIMIT])
    local names = redis.call('ZRANGE', keyparts.keys_key(keys), 0, limit)
    if #names > limit then
      return {2}
    end
    for _, key in ipairs(names) do
      out[#out + 1] = key_report(keys, key)
    end
    return {1, cmsgpack.pack(out)}
  end

  -- An order on a pool: the part in force becomes `part`; returns what the shard holds
  -- now (its part, or more while its reservations are more) and, when the part rose, the
  -- lane, whose deferred jobs the caller admits.
  local function pool_order(keys, key, part)
    local p, lane = prefix(keys), string.sub(key, #keyparts.POOL_PREFIX + 1)
    local cfg = admission.admission_of(keys, p, lane)
    redis.call('HSET', keys[THR], 'gf:' .. key, rates.fmt(part))
    if not cfg or not cfg.part then
      return part, nil
    end
    local fields = {}
    for i, c in ipairs(cfg.utable) do
      fields[i] = 'ar:' .. c[ClassRow.NAME]
    end
    local used = 0
    for _, r in ipairs(redis.call('HMGET', core.lane_key(p, lane, 'state'), unpack(fields))) do
      used = used + math.max(0, tonumber(r) or 0)
    end
    return held(part, cfg.whole, used), part > cfg.part and lane or nil
  end

  -- One order: the part in force becomes `part` (the bucket of a rate rescaled at once),
  -- a pause is lengthened to `pz`. Returns what the shard holds now and whether the part
  -- rose.
  local function apply_order(keys, key, part, pz, now)
    local v = redis.call('HMGET', keys[THR], 'gf:' .. key, 'l:' .. key, 'u:' .. key, 'o:' .. key,
      'pz:' .. key)
    local old = tonumber(v[1]) or 0
    if part ~= old then
      keyparts.rescale(keys, key, old, part, now)
      redis.call('HSET', keys[THR], 'gf:' .. key, rates.fmt(part))
      redis.call('ZADD', keyparts.keys_key(keys), 0, key)
    end
    if pz > (tonumber(v[5]) or 0) then
      redis.call('HSET', keys[THR], 'pz:' .. key, pz)
    end
    local used = (tonumber(v[3]) or 0) + (tonumber(v[4]) or 0)
    return held(part, tonumber(v[2]), used), part > old
  end

  -- ARGV: the pass's epoch, msgpack [GkOrder entry, ..]. Replies {0, the epoch seen} to
  -- a stale epoch, else {1, msgpack [GkHeld entry, ..]}; the waiters of a key whose part
  -- rose are woken.
  function globalkeys.order(keys, args)
    local ok, seen = fence(keys, tonumber(args[GkOrderArg.EPOCH]))
    if not ok then
      return {0, seen}
    end
    local now = core.now_ms()
    local out, raised, fx = {}, {}, records.new_effects()
    for _, o in ipairs(cmsgpack.unpack(args[GkOrderArg.ORDERS])) do
      local key, h, rose = o[GkOrder.KEY], nil, nil
      if string.sub(key, 1, #keyparts.POOL_PREFIX) == keyparts.POOL_PREFIX then
        h, rose = pool_order(keys, key, tonumber(o[GkOrder.PART]))
        if rose then
          -- deferred jobs that now fit are admitted, as when a finishing job frees room
          fx.readmit[rose] = true
        end
      else
        h, rose = apply_order(keys, key, tonumber(o[GkOrder.PART]), tonumber(o[GkOrder.PAUSED_UNTIL]) or 0, now)
        if rose then
          raised[#raised + 1] = key
        end
      end
      local e = {}
      e[GkHeld.KEY], e[GkHeld.HELD] = key, rates.fmt(h)
      out[#out + 1] = e
    end
    if #raised > 0 then
      fairqueue.enter_all_woken(prefix(keys), throttle.wake_keys(keys, raised, now), now, keys)
    end
    if next(fx.readmit) then
      records.apply_effects(keys, prefix(keys), fx, now)
    end
    return {1, cmsgpack.pack(out)}
  end
end
