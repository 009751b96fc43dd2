-- Parts of global keys: on a shard of an app of many shards, what of a key shared by the
-- app's shards this shard may use (fairlane/policy/globalkeys.py states the rules and
-- proves the sum of the parts never exceeds the key). A concurrency limit L gives
-- floor(part * L) slots; a rate gives part * limit per period and part * burst at once.
-- State, in KEYS[THR]: gs the app's shard count (set by a worker of an app of many
-- shards before it dispatches: absent, every key is local, as on one shard), gf:<key>
-- the part in force (absent: none yet), ge the highest balancer epoch seen; and
--   <p>gkeys  zset  global key this shard has used, at score 0: what the balancer's
--                   report reads (a key leaves it once idle with no part)
-- An admission pool of lane L is the key pool:<L> (admission.lua scales the pool's
-- bounds to its part): its absent part is 1/n, and it never leaves gkeys (pool_part).
--
-- Keys: KEYS[THR] (gs, gf:<key>, ge), gkeys; rate:<key> (through rates)
-- Calls: core, rates
-- Entry points: keyparts.{first_use, keys_key, limit, of, pool_part, rate, rescale, scaled,
--   tenant_key}

local keyparts = {EPSILON = __PART_EPSILON__, POOL_PREFIX = 'pool:'}

do
  local THR = core.THR

  -- A key of one tenant stays in its shard (policy.globalkeys.is_tenant_key).
  function keyparts.tenant_key(key)
    return string.sub(key, 1, 7) == 'tenant:' or string.match(key, '^lane:[^:]*:tenant:') ~= nil
  end

  -- The part of `key` in force from the fields gs and gf:<key> as read, or nil when the
  -- key is local (one shard, or a tenant's key).
  function keyparts.of(gs, gf, key)
    if not gs or keyparts.tenant_key(key) then
      return nil
    end
    return tonumber(gf) or 0
  end

  function keyparts.keys_key(keys)
    return core.prefix(keys) .. 'gkeys'
  end

  -- A key named again, on a shard of many, after its last job left: a global one joins
  -- the balancer's report.
  function keyparts.first_use(keys, key)
    if not keyparts.tenant_key(key) then
      redis.call('ZADD', keyparts.keys_key(keys), 0, key)
    end
  end

  -- The concurrency limit a part of `limit` gives; a key of rates alone (UNLIMITED) is
  -- closed while its part is none.
  function keyparts.limit(limit, part)
    if part == nil then
      return limit
    end
    if limit >= rates.UNLIMITED then
      return part > 0 and limit or 0
    end
    return math.max(0, math.floor(part * limit + keyparts.EPSILON))
  end

  -- The rate a part of `rate` gives; a job's cost is still capped by the whole key's
  -- burst (rates.cost reads `cap`), so a part never lets a job take less than it costs.
  function keyparts.rate(rate, part)
    if rate == nil or part == nil then
      return rate
    end
    if part <= 0 then
      return nil
    end
    return {limit = rate.limit * part, per = rate.per, burst = rate.burst * part,
      units = rate.units, cap = rate.burst}
  end

  -- A key's rate part moves from `old` to `new`: its bucket is settled at the old part
  -- as of now and capped at the new burst, so that no token appears that the old part
  -- had not refilled (a debt is kept).
  function keyparts.rescale(keys, key, old, new, now)
    local rate = rates.parse(redis.call('HGET', keys[THR], 'rp:' .. key))
    if not rate then
      return
    end
    local level
    local before = keyparts.rate(rate, old)
    local b
    if before then
      b = rates.read(keys, key, before, now)
      level = rates.level(before, b, now)
    else
      b = rates.read(keys, key, rate, now)
      level = b.fresh and 0 or math.min(0, b.t)
    end
    local after = keyparts.rate(rate, new)
    b.t = math.min(level, rate.burst * new)
    b.s = now
    redis.call('HSET', rates.state_key(keys, key), 't', rates.fmt(b.t), 's', b.s)
    rates.keep(keys, key, after, b, now)
  end

  -- A shard's part of an admission pool from the fields gf:pool:<lane> and the shard
  -- count `n` (policy.globalkeys.pool_part): absent, an equal share, since producers
  -- submit before any balancer runs and 1/n each sums to 1.
  function keyparts.pool_part(gf, n)
    return tonumber(gf) or 1 / n
  end

  -- A pool's bound on a shard of `part`, rounded down so that the shards' bounds sum to
  -- at most the pool's (policy.globalkeys.pool_scaled).
  function keyparts.scaled(value, part)
    return math.max(0, math.floor(part * value + keyparts.EPSILON))
  end
end
