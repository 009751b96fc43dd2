-- Global keys: a shard's side of the balancer's passes (fairlane/policy/globalkeys.py
-- states the protocol and proves that the shards' parts never sum above a key; its
-- ShardParts is the model this is the twin of). A pass reads every shard's report, then
-- sends orders: lowers first, raises within what is free. Each call carries the pass's
-- epoch; a shard refuses a call of an epoch older than the highest it has seen, so an
-- order of a pass overtaken by a newer one that read the shard never lands.
--
-- Keys: KEYS[THR] (gs, ge, gf:<key>, l:/u:/o:/r:/pz:<key>), KEYS[THRW], <THR>:s:<key>,
--   gkeys, KEYS[WEIGHTS]
-- Calls: core, rates, keyparts, throttle, fairqueue
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
  local function waiting_weight(keys, key)
    local sk = keys[THR] .. ':s:' .. key
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

  -- A key's report, or nil for a key left idle (no job names it, none waits, no part):
  -- it leaves the report.
  local function key_report(keys, key)
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
  -- restarted without its data is marked global again by the next pass). Replies {0, the epoch seen} to a
  -- stale epoch, {2}
  -- when the shard has more keys than that (a pass must see every part), else
  -- {1, msgpack [GkReport entry, ..]}.
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
  -- a stale epoch, else {1, msgpack [GkHeld entry, ..]}; the waiters of a key whose part rose are woken.
  function globalkeys.order(keys, args)
    local ok, seen = fence(keys, tonumber(args[GkOrderArg.EPOCH]))
    if not ok then
      return {0, seen}
    end
    local now = core.now_ms()
    local out, raised = {}, {}
    for _, o in ipairs(cmsgpack.unpack(args[GkOrderArg.ORDERS])) do
      local key = o[GkOrder.KEY]
      local h, rose = apply_order(keys, key, tonumber(o[GkOrder.PART]), tonumber(o[GkOrder.PAUSED_UNTIL]) or 0, now)
      local e = {}
      e[GkHeld.KEY], e[GkHeld.HELD] = key, rates.fmt(h)
      out[#out + 1] = e
      if rose then
        raised[#raised + 1] = key
      end
    end
    if #raised > 0 then
      fairqueue.enter_all_woken(prefix(keys), throttle.wake_keys(keys, raised, now), now)
    end
    return {1, cmsgpack.pack(out)}
  end
end
