-- Rate keys: token buckets on the server's clock, in jobs or work units, corrected by what
-- attempts really used, paused by an upstream's pushback (fairlane/policy/rates.py states
-- the rules; docs/contracts/rates.md how throttle.lua composes them with concurrency keys
-- and tenant-fair waiting). State, all derived from the app's prefix:
--   <p>rate:<key>  hash  t tokens (17 significant digits), s stamp (ms), pu paused until,
--                        pc its cause, a an adaptive value; counters ta taken, tr refunded,
--                        td debts, pn pushbacks, wn woken, wt ms waited. It expires once
--                        it says nothing a fresh key would not (full, unpaused) plus an hour.
--   <p>rates       zset  every rate key seen -> when its state was created (ms)
--   <p>ratedue     zset  rate-blocked key with waiters -> when it is due: the only timer
-- and in KEYS[THR]: rp:<key> the rate in force 'limit,per_ms,burst,units', ad:<key> an
-- adaptive key's 'max,min', pz:<key> the end of its pause (any key: it blocks arrivals;
-- kept past the key's last job while the pause lasts), c:<job> the rate cost (units) of
-- a job holding rate or adaptive keys.
--
-- Keys: rate:<key>, rates, ratedue; in KEYS[THR]: rp:<key>, ad:<key>, pz:<key>, c:<job>
-- Calls: core, writeback
-- Entry points: rates.{adaptive_bounds, adaptive_value, correct, cost, due_at, due_key,
--   encode, fits, fmt, grow, keep, level, note_wake, parse, pause, read, same,
--   set_adaptive, state_key, take, take_viewed}

local rates = {UNLIMITED = __UNLIMITED__, IDLE_MS = 3600000, DUE_BATCH = __DUE_BATCH__,
  PARK_BUDGET = __PARK_BUDGET__,
  CUT = __ADAPTIVE_CUT__, MAX_PUSHBACKS = __MAX_PUSHBACKS__}

do
  local THR, prefix = core.THR, core.prefix


  -- the fields of a bucket `read` asks for
  local BUCKET = {'t', 's', 'pu'}

  function rates.fmt(x)
    return string.format('%.17g', x)
  end

  function rates.state_key(keys, key)
    return prefix(keys) .. 'rate:' .. key
  end

  function rates.due_key(keys)
    return prefix(keys) .. 'ratedue'
  end

  -- A job's rate entry {key, limit, per_ms, burst, units 0/1} as the rate in force reads.
  function rates.encode(rate)
    return rates.fmt(tonumber(rate[RateKey.LIMIT])) .. ',' ..
      rates.fmt(tonumber(rate[RateKey.PER_MS])) .. ',' ..
      rates.fmt(tonumber(rate[RateKey.BURST])) .. ',' ..
      ((tonumber(rate[RateKey.UNITS]) or 0) == 1 and '1' or '0')
  end

  -- {limit, per (ms), burst, units} or nil (absent, or damaged: then it limits nothing).
  -- Memoised: a key's rate is read for every job that names it. Nothing writes into the
  -- table it gives (keyparts.rate makes a new one).
  rates.parse = core.memoised(function(spec)
    if not spec then
      return nil
    end
    local l, per, b, u = string.match(spec, '^([^,]+),([^,]+),([^,]+),([01])$')
    l, per, b = tonumber(l), tonumber(per), tonumber(b)
    if not (l and per and b and l > 0 and per > 0 and b > 0) then
      return nil
    end
    return {limit = l, per = per, burst = b, units = u == '1'}
  end)

  -- Whether a job's rate entry is `rate` (parsed): what `encode` would write is then the
  -- text `rate` was parsed from (encode writes each number so that it reads back as
  -- itself), told without formatting numbers, which costs more than the rest of a job's
  -- rate key.
  function rates.same(rate, entry)
    return rate ~= nil and rate.limit == tonumber(entry[RateKey.LIMIT])
      and rate.per == tonumber(entry[RateKey.PER_MS])
      and rate.burst == tonumber(entry[RateKey.BURST])
      and rate.units == ((tonumber(entry[RateKey.UNITS]) or 0) == 1)
  end

  -- What a job of rate cost `units` takes: 1, or its units at most the burst (a burst
  -- lowered under a waiting job's cost would otherwise never let it start); a shard's
  -- part of a global key caps it at the whole key's burst (`cap`, keyparts.rate).
  function rates.cost(rate, units)
    if rate.units then
      return math.min(units, rate.cap or rate.burst)
    end
    return 1
  end

  -- The bucket of `key`: a key without state is full as of now. (`sk`: its state's key,
  -- kept for the writes that follow.)
  function rates.read(keys, key, rate, now)
    local sk = rates.state_key(keys, key)
    local v = writeback.mget(keys, sk, BUCKET)
    local b = {t = tonumber(v[1]), s = tonumber(v[2]), pu = tonumber(v[3]) or 0, sk = sk}
    if not b.t or not b.s then
      b.t, b.s, b.fresh = rate.burst, now, true
    end
    return b
  end

  function rates.level(rate, b, now)
    if now <= b.s then
      return math.min(rate.burst, b.t)
    end
    return math.min(rate.burst, b.t + (now - b.s) * rate.limit / rate.per)
  end

  function rates.fits(rate, b, cost, now)
    return now >= b.pu and rates.level(rate, b, now) >= cost
  end

  function rates.due_at(rate, b, cost, now)
    local short = cost - rates.level(rate, b, now)
    local due = now + 1
    if short > 0 then
      due = math.max(due, now + math.ceil(short * rate.per / rate.limit))
    end
    return math.max(due, b.pu)
  end

  -- How long a key's state says more than a fresh key's would, and an hour more (ms).
  local function kept_ms(rate, b, now)
    local ttl = math.max(0, b.pu - now)
    if rate and b.t < rate.burst then
      ttl = math.max(ttl, math.ceil((rate.burst - b.t) * rate.per / rate.limit))
    end
    return ttl + rates.IDLE_MS
  end

  -- Keep a key's state while it says more than a fresh key's would, and an hour more.
  function rates.keep(keys, key, rate, b, now)
    local sk = b.sk or rates.state_key(keys, key)
    -- never shortened once it exists: another fact of the key (a pause, a slow refill)
    -- may need longer
    writeback.pexpire(keys, sk, kept_ms(rate, b, now), not b.fresh)
    if b.fresh then
      redis.call('ZADD', prefix(keys) .. 'rates', now, key)
      b.fresh = false
    end
  end

  -- Take `cost` tokens (fits was checked): the level less the cost, as of now.
  function rates.take(keys, key, rate, b, cost, now)
    b.t = rates.level(rate, b, now) - cost
    b.s = math.max(now, b.s)
    local sk = b.sk
    writeback.set(keys, sk, 't', b.t, 's', b.s)
    writeback.addf(keys, sk, 'ta', cost)
    rates.keep(keys, key, rate, b, now)
  end

  -- `take` on a bucket whose state exists, written through its view `v`
  -- (writeback.view_of) in one step: the same writes, the same expiry (what `keep` gives
  -- a state that exists), for a run's every job (keyruns.lua).
  function rates.take_viewed(v, rate, b, cost, now)
    b.t, b.s = rates.level(rate, b, now) - cost, math.max(now, b.s)
    writeback.put(v, 't', b.t, 's', b.s, 'ta', cost, kept_ms(rate, b, now))
  end

  -- Give `delta` back (a refund, capped at the burst) or, negative, charge a debt.
  function rates.correct(keys, key, rate, delta, now)
    local b = rates.read(keys, key, rate, now)
    local before = rates.level(rate, b, now)
    local after = before + delta
    if delta > 0 then
      after = math.min(rate.burst, after)
    end
    b.t, b.s = after, math.max(now, b.s)
    local sk = b.sk
    writeback.set(keys, sk, 't', b.t, 's', b.s)
    if delta > 0 then
      writeback.addf(keys, sk, 'tr', after - before)
    elseif delta < 0 then
      writeback.addf(keys, sk, 'td', -delta)
    end
    rates.keep(keys, key, rate, b, now)
  end

  -- An adaptive key's bounds in force {max, min}, or nil.
  function rates.adaptive_bounds(keys, key)
    local raw = writeback.get(keys, keys[THR], 'ad:' .. key)
    if not raw then
      return nil
    end
    local hi, lo = string.match(raw, '^(%d+),(%d+)$')
    return tonumber(hi) and {tonumber(hi), tonumber(lo)} or nil
  end

  -- An adaptive key's value now, within its bounds (its max when it has none yet).
  function rates.adaptive_value(keys, key, hi, lo)
    local a = tonumber(writeback.get(keys, rates.state_key(keys, key), 'a')) or hi
    return math.min(hi, math.max(lo, a))
  end

  -- Write an adaptive key's value; returns its limit (floor) and the limit it replaced.
  function rates.set_adaptive(keys, key, before, after, now)
    local sk = rates.state_key(keys, key)
    local fresh = not writeback.exists(keys, sk)
    writeback.set(keys, sk, 'a', rates.fmt(after))
    rates.keep(keys, key, nil, {t = 0, pu = 0, fresh = fresh}, now)
    return math.floor(after), math.floor(before)
  end

  -- Pause `key` until `untl` for `cause`; an adaptive key is cut, on each pushback (each
  -- is a call the upstream refused). Returns whether it was cut.
  function rates.pause(keys, key, untl, now, cause)
    local sk = rates.state_key(keys, key)
    local v = writeback.mget(keys, sk, {'pu', 't'})
    local pu = tonumber(v[1]) or 0
    local fresh = not writeback.exists(keys, sk)
    writeback.set(keys, sk, 'pu', math.max(pu, untl), 'pc', string.sub(cause or '', 1, 200))
    -- what blocks arrivals on the key, rate or not, read with its room
    writeback.set(keys, keys[THR], 'pz:' .. key, math.max(pu, untl))
    writeback.add(keys, sk, 'pn', 1)
    local rate = rates.parse(writeback.get(keys, keys[THR], 'rp:' .. key))
    local t = tonumber(v[2])
    rates.keep(keys, key, t and rate, {t = t or 0, pu = math.max(pu, untl), fresh = fresh}, now)
    local cut = false
    local range = rates.adaptive_bounds(keys, key)
    if range then
      local a = rates.adaptive_value(keys, key, range[1], range[2])
      local limit = rates.set_adaptive(keys, key, a, math.max(range[2], a * rates.CUT), now)
      writeback.set(keys, keys[THR], 'l:' .. key, limit)
      cut = true
    end
    return cut
  end

  -- Grow an adaptive key after a success; returns whether its limit rose.
  function rates.grow(keys, key, range, now)
    local a = rates.adaptive_value(keys, key, range[1], range[2])
    local limit, before = rates.set_adaptive(keys, key, a, math.min(range[1], a + 1 / a), now)
    if limit ~= before then
      writeback.set(keys, keys[THR], 'l:' .. key, limit)
    end
    return limit > before
  end

  -- A waiter woken on `key` after waiting `waited` ms.
  function rates.note_wake(keys, key, waited)
    local sk = rates.state_key(keys, key)
    writeback.add(keys, sk, 'wn', 1)
    writeback.add(keys, sk, 'wt', math.max(0, waited))
  end
end
