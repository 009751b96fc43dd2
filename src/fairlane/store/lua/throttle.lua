-- Throttle keys: per-key concurrency limits and rates, tenant-fair waiting and offers
-- (fairlane/policy/throttle.py states the rules and proves them; docs/contracts/rates.md
-- how rates compose with them; this is their twin, step for step). State, all under the
-- app's hash tag (fairlane/store/keys.py names it):
--   KEYS[THR]  hash  l:<key> limit in force, u:<key> slots held, o:<key> offers out,
--                    r:<key> jobs naming it, v:<key> its virtual time V, rp:/ad:<key> its
--                    rate and adaptive bounds in force (rates.lua); w:<job>
--                    'key<TAB>key..' offers of a woken job; c:<job> the rate cost of a
--                    parked or woken job with rate or adaptive keys; p:<job>
--                    'at<TAB>prio<TAB>seq<TAB>tenant<TAB>charge<TAB>units<TAB>
--                    since<TAB>key..' a parked job; wakes, moves
--   KEYS[THRW] zset  every waiter at score 0, member '<key>\0<tenant>\0<order>\0<job>',
--                    so a tenant's group on a key is a lex range, its head the first
--   <THR>:s:<key> zset  tenant with waiters on the key -> start tag S
--   <THR>:f:<key> zset  idle tenant -> finish tag F, only while F > V
-- A job's grant is not kept here but in its record (`ttok`, which lease.lua writes with
-- the lease and an ack reads with the rest): 'cost<TAB>key..', its rate cost empty when
-- it keeps none. A running job's record is read by its ack anyway, so the grant costs
-- its release no read, and its dispatch no write, of this hash. The policy fences a
-- release by a grant token; here the record fences it: an ack reaches the grant only
-- under the job's current lease, and the release deletes the grant with the lease's
-- end, so a late or repeated release finds none. The jobs of a run hold one text.
-- room(k) = limit - held - offers. Nothing here polls: keys are woken when they gain
-- room (a release, a raised limit, offers given back), and a key whose head waits for
-- tokens or a pause's end is woken by fetch when it is due (rates.lua's timer).
--
-- Keys: KEYS[THR], KEYS[THRW], <THR>:s:<key>, <THR>:f:<key>, ratedue, sig:<tenant>,
--   KEYS[TLIMITS], KEYS[WEIGHTS]
-- Calls: core, classes, rates, keyparts, writeback
-- Entry points: throttle.{RATE_BUCKETS, RATE_WIDTH_MS, apply_given, fields_of, grant,
--   grant_parts, key_state, note_duration, quiet,
--   note_submissions, rate_in_force, rate_per_min, refund_rates, sig_key,
--   take_rates, wake_keys,
--   tenant_limit, thr_acquire, thr_cancel, thr_cancel_waiter, thr_next_due,
--   thr_push_back, thr_release, thr_wake_due}

local throttle = {}

do
  local THR, THRW, TLIMITS, WEIGHTS = core.THR, core.THRW, core.TLIMITS, core.WEIGHTS
  local now_ms = core.now_ms
  local CLASS_EPS, floor_eps = classes.CLASS_EPS, classes.floor_eps

  local TAB = '\t'

  -- The fields of a key in KEYS[THR], and the lists of them each read asks for, named once
  -- per key rather than joined again for every job that names it (nothing writes into
  -- them).
  local fields_of = core.memoised(function(key)
    local f = {}
    for _, name in ipairs({'l', 'u', 'o', 'r', 'rp', 'pz', 'gf', 'ad'}) do
      f[name] = name .. ':' .. key
    end
    f.room = {f.l, f.u, f.o, f.rp, f.pz, 'gs', f.gf}
    f.rate = {f.rp, 'gs', f.gf}
    f.held = {f.l, f.u, 'gs', f.gf}
    f.given = {f.l, f.rp, 'gs', f.ad}
    f.settle = {f.rp, f.ad, 'gs', f.gf}
    return f
  end)
  throttle.fields_of = fields_of

  local function split_tabs(s)
    local out = {}
    for part in string.gmatch(s, '[^\t]+') do
      out[#out + 1] = part
    end
    return out
  end

  local function tags_key(keys, key, which)
    return keys[THR] .. ':' .. which .. ':' .. key
  end

  -- Waiter order within a tenant group: highest priority first, then lowest seq, then id.
  local function group_prefix(key, tenant)
    return key .. '\0' .. tenant .. '\0'
  end

  -- A deadline order (a negative seq, deadlineorder.lua) is written '-' and 19 digits of
  -- seq + PRIO_SPAN: '-' sorts before every digit and the digits sort as the numbers do,
  -- so it comes before the FIFO numbers, earliest deadline first, and a FIFO number's
  -- member is written as it always was.
  local function order_part(seq)
    local n = tonumber(seq)
    if n < 0 then
      return '-' .. string.format('%019d', n + core.PRIO_SPAN)
    end
    return string.format('%020d', n)
  end

  local function wait_member(key, tenant, prio, seq, id)
    return group_prefix(key, tenant) ..
      string.format('%016d', 1e15 - tonumber(prio)) .. order_part(seq) .. '\0' .. id
  end

  local function group_head(keys, key, tenant)
    local m = redis.call('ZRANGEBYLEX', keys[THRW], '[' .. group_prefix(key, tenant),
      '(' .. key .. '\0' .. tenant .. '\1', 'LIMIT', 0, 1)[1]
    if not m then
      return nil
    end
    -- Lua 5.1 patterns spell the zero byte %z; key, tenant and order hold none
    return m, string.match(m, '^[^%z]*%z[^%z]*%z[^%z]*%z(.*)$')
  end

  -- A parked record: {at, prio, seq, tenant, charge, units, since, names}; the tenant may
  -- be empty.
  local function parse_parked(raw)
    local at, prio, seq, tenant, charge, units, since, rest = string.match(raw,
      '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
    return {at = at, prio = prio, seq = seq, tenant = tenant, charge = tonumber(charge) or 1,
      units = tonumber(units) or 1, since = tonumber(since) or 0, names = split_tabs(rest)}
  end

  -- A key's slots (its limit; of a global key, this shard's part of it), the slots held
  -- and offered on it, the rate in force (nil: none) and the end of a pause (nil: never
  -- paused), in one read (keyparts.lua).
  function throttle.key_state(keys, key)
    local v = writeback.mget(keys, keys[THR], fields_of(key).room)
    local part = keyparts.of(v[6], v[7], key)
    return keyparts.limit(tonumber(v[1]) or 0, part), tonumber(v[2]) or 0, tonumber(v[3]) or 0,
      keyparts.rate(rates.parse(v[4]), part), tonumber(v[5])
  end

  -- A key's room, the rate in force on it and the end of a pause (throttle.key_state).
  local function room(keys, key)
    local slots, held, offered, rate, pz = throttle.key_state(keys, key)
    return slots - held - offered, rate, pz
  end

  -- The rate in force on a key (nil: none), of this shard's part when it is global.
  local function rate_in_force(keys, key)
    local v = writeback.mget(keys, keys[THR], fields_of(key).rate)
    return keyparts.rate(rates.parse(v[1]), keyparts.of(v[2], v[3], key))
  end
  throttle.rate_in_force = rate_in_force

  -- The first of `names` that blocks a job of rate cost `units` at `now`: no room; a
  -- pause; or a rate it does not fit, or waiters on a rate key other than `waking` (no
  -- barging). Returns the key and, when it blocks by a pause or its rate, {rate or false,
  -- bucket}. `seen` collects {rate, bucket} of the rate keys read on the way.
  local function first_full(keys, names, units, now, waking, seen)
    for _, key in ipairs(names) do
      local r, rate, pz = room(keys, key)
      if r <= 0 then
        return key
      end
      if pz and now < pz then
        return key, {false, {pu = pz}}
      end
      if rate then
        local waiting = key ~= waking and redis.call('ZCARD', tags_key(keys, key, 's')) > 0
        local b = rates.read(keys, key, rate, now)
        -- behind waiters (no barging) the key is due no later than this job would fit: a
        -- group it forms may be the key's next head
        if waiting or not rates.fits(rate, b, rates.cost(rate, units), now) then
          return key, {rate, b}
        end
        if seen then
          seen[key] = {rate, b}
        end
      end
    end
    return nil
  end

  -- Take a job's tokens on each rate key read by `first_full`. Returns its rate cost to
  -- remember (`c:<job>`), nil when there is none to: the caller writes it.
  local function take_tokens(keys, names, units, now, seen, adaptive)
    local any = adaptive
    for _, key in ipairs(names) do
      local rb = seen[key]
      if rb then
        rates.take(keys, key, rb[1], rb[2], rates.cost(rb[1], units), now)
        any = true
      end
    end
    return any and units or nil
  end

  -- Take a job's tokens on each rate key read by `first_full`; remember its rate cost.
  function throttle.take_rates(keys, id, names, units, now, seen, adaptive)
    local cost = take_tokens(keys, names, units, now, seen, adaptive)
    if cost then
      writeback.set(keys, keys[THR], 'c:' .. id, cost)
    end
  end

  -- Give a job's tokens back on each of its rate keys (offers it will not use); `keep`
  -- keeps its rate cost (it parks again).
  function throttle.refund_rates(keys, id, names, now, keep)
    local units = tonumber(writeback.get(keys, keys[THR], 'c:' .. id))
    if not units then
      return
    end
    if not keep then
      writeback.del(keys, keys[THR], 'c:' .. id)
    end
    for _, key in ipairs(names) do
      local rate = rate_in_force(keys, key)
      if rate then
        rates.correct(keys, key, rate, rates.cost(rate, units), now)
      end
    end
  end

  local function vtime(keys, key)
    return tonumber(writeback.get(keys, keys[THR], 'v:' .. key)) or 0
  end

  -- The grant of a job admitted on the keys `names`, as its record keeps it (`cost`: its
  -- rate cost to remember, take_tokens; `joined`: the names joined by tabs, when the
  -- caller has them).
  function throttle.grant(names, cost, joined)
    return (cost and rates.fmt(cost) or '') .. TAB .. (joined or table.concat(names, TAB))
  end

  -- A grant's rate cost (nil: none kept) and its keys joined by tabs.
  local function grant_parts(grant)
    local tab = string.find(grant, TAB, 1, true)
    if not tab then
      return nil
    end
    return tonumber(string.sub(grant, 1, tab - 1)), string.sub(grant, tab + 1)
  end
  throttle.grant_parts = grant_parts

  -- A tenant group left empty: its start tag stays as its finish tag while above V.
  local function idle_group(keys, key, tenant, tag)
    redis.call('ZREM', tags_key(keys, key, 's'), tenant)
    if tag > vtime(keys, key) then
      redis.call('ZADD', tags_key(keys, key, 'f'), tag, tenant)
    end
  end

  -- How many waiters entered a group since the library loaded. A key found with nobody
  -- waiting stays so while this does not move: entering a group is the only way a key
  -- gains waiters (`quiet`, thr_release).
  local entered = 0

  -- Put a waiter in its tenant's group on w.at; a group that forms starts at max(F, V).
  -- `blocked` ({rate, bucket}) when it waits for w.at's tokens or pause: the key is due
  -- no later than when this waiter would fit.
  local function enter_group(keys, id, w, blocked, now)
    entered = entered + 1
    local sk = tags_key(keys, w.at, 's')
    if not redis.call('ZSCORE', sk, w.tenant) then
      local start = vtime(keys, w.at)
      local fk = tags_key(keys, w.at, 'f')
      local finish = tonumber(redis.call('ZSCORE', fk, w.tenant))
      if finish then
        redis.call('ZREM', fk, w.tenant)
        if finish > start then
          start = finish
        end
      end
      redis.call('ZADD', sk, start, w.tenant)
    end
    writeback.set(keys, keys[THR], 'p:' .. id, table.concat(
      {w.at, w.prio, w.seq, w.tenant, w.charge, rates.fmt(w.units), w.since,
        table.concat(w.names, TAB)}, TAB))
    redis.call('ZADD', keys[THRW], 0, wait_member(w.at, w.tenant, w.prio, w.seq, id))
    if blocked then
      local rate, b = blocked[1], blocked[2]
      local due = rate and rates.due_at(rate, b, rates.cost(rate, w.units), now) or b.pu
      redis.call('ZADD', rates.due_key(keys), 'LT', due, w.at)
    end
  end

  -- Hand `key`'s room to its waiters, least start tag first, until it has no room, nobody
  -- waits, or (a rate key) its head does not fit the bucket: then the key is due when it
  -- would. A waiter blocked by another key moves there (uncharged); one that may take all
  -- its keys is woken: an offer on each, its tokens on each rate key, V up to its tag, its
  -- tenant's tag charged (its cost on `key` if `key` has a rate, else its charge) / weight.
  -- Appends {job, key} for every waiter woken.
  local function wake_key(keys, key, out, now)
    local sk = tags_key(keys, key, 's')
    while true do
      local r, rate, pz = room(keys, key)
      if r <= 0 then
        return
      end
      if pz and now < pz then
        redis.call('ZADD', rates.due_key(keys), pz, key)
        return
      end
      local top = redis.call('ZRANGE', sk, 0, 0, 'WITHSCORES')
      if not top[1] then
        return
      end
      local tenant, tag = top[1], tonumber(top[2])
      local member, id = group_head(keys, key, tenant)
      local w = parse_parked(writeback.get(keys, keys[THR], 'p:' .. id))
      local cost = rate and rates.cost(rate, w.units)
      if rate then
        local b = rates.read(keys, key, rate, now)
        if not rates.fits(rate, b, cost, now) then
          redis.call('ZADD', rates.due_key(keys), rates.due_at(rate, b, cost, now), key)
          return
        end
      end
      redis.call('ZREM', keys[THRW], member)
      writeback.del(keys, keys[THR], 'p:' .. id)
      local emptied = not group_head(keys, key, tenant)
      local seen = {}
      local blocker, blocked = first_full(keys, w.names, w.units, now, key, seen)
      if blocker then
        if emptied then
          idle_group(keys, key, tenant, tag)
        end
        w.at = blocker
        enter_group(keys, id, w, blocked, now)
        writeback.add(keys, keys[THR], 'moves', 1)
      else
        for _, k in ipairs(w.names) do
          writeback.incr(keys, keys[THR], 'o:' .. k, 1)
        end
        throttle.take_rates(keys, id, w.names, w.units, now, seen, false)
        writeback.set(keys, keys[THR], 'w:' .. id, table.concat(w.names, TAB))
        if tag > vtime(keys, key) then
          writeback.set(keys, keys[THR], 'v:' .. key, tag)
          -- finish tags at or below V carry nothing
          redis.call('ZREMRANGEBYSCORE', tags_key(keys, key, 'f'), '-inf', tag)
        end
        local weight = tonumber(redis.call('HGET', keys[WEIGHTS], tenant)) or 1
        local charged = tag + (rate and cost or w.charge) / weight
        if emptied then
          idle_group(keys, key, tenant, charged)
        else
          redis.call('ZADD', sk, charged, tenant)
        end
        if rate then
          rates.note_wake(keys, key, now - w.since)
        end
        out[#out + 1] = {id, key}
        writeback.add(keys, keys[THR], 'wakes', 1)
      end
    end
  end

  -- Wake every key of `names` that has room and waiters, in order. `quiet` (optional)
  -- remembers the keys found with nobody waiting, each with `entered` as it was then:
  -- asked again while nobody has entered a group since, such a key needs no read.
  local function wake_all(keys, names, out, now, quiet)
    for _, key in ipairs(names) do
      if not quiet or quiet[key] ~= entered then
        if redis.call('ZCARD', tags_key(keys, key, 's')) == 0 then
          if quiet then
            quiet[key] = entered
          end
        elseif room(keys, key) > 0 then
          wake_key(keys, key, out, now)
        end
      end
    end
  end

  -- Wake every key of `names` that has room and waiters (a part raised); returns the
  -- waiters woken, which the caller enters.
  function throttle.wake_keys(keys, names, now)
    local out = {}
    wake_all(keys, names, out, now)
    return out
  end

  local function unref(keys, names)
    for _, key in ipairs(names) do
      if writeback.incr(keys, keys[THR], fields_of(key).r, -1) <= 0 then
        writeback.del(keys, keys[THR], 'r:' .. key, 'l:' .. key, 'u:' .. key, 'o:' .. key,
          'v:' .. key, 'rp:' .. key, 'ad:' .. key)
        redis.call('DEL', tags_key(keys, key, 's'), tags_key(keys, key, 'f'))
        -- a pause outlives the key's last job (the one pushed back comes back to it)
        local pz = tonumber(writeback.get(keys, keys[THR], 'pz:' .. key))
        if pz and pz <= now_ms() then
          writeback.del(keys, keys[THR], 'pz:' .. key)
        end
      end
    end
  end

  -- A woken job, dispatched with its lane slot: its offers become holds if every key
  -- has a slot under its limit (its tokens were taken when it was woken); otherwise (a
  -- limit was lowered) it gives them and its tokens back and parks again. Returns as
  -- thr_acquire.
  local function convert_offers(keys, id, offered, prio, seq, tenant, charge, units, now)
    local names = split_tabs(offered)
    writeback.del(keys, keys[THR], 'w:' .. id)
    local ok = true
    for _, key in ipairs(names) do
      local v = writeback.mget(keys, keys[THR], fields_of(key).held)
      if (tonumber(v[2]) or 0) >= keyparts.limit(tonumber(v[1]) or 0, keyparts.of(v[3], v[4], key)) then
        ok = false
        break
      end
    end
    for _, key in ipairs(names) do
      writeback.incr(keys, keys[THR], 'o:' .. key, -1)
      if ok then
        writeback.incr(keys, keys[THR], 'u:' .. key, 1)
      end
    end
    if ok then
      -- its rate cost, kept while it waited, moves into the grant
      local cost = tonumber(writeback.get(keys, keys[THR], 'c:' .. id))
      if cost then
        writeback.del(keys, keys[THR], 'c:' .. id)
      end
      return throttle.grant(names, cost), {}
    end
    units = tonumber(writeback.get(keys, keys[THR], 'c:' .. id)) or units
    throttle.refund_rates(keys, id, names, now, true)
    local blocker, blocked = first_full(keys, names, units, now)
    enter_group(keys, id, {at = blocker, prio = prio, seq = seq, tenant = tenant,
      charge = charge, units = units, since = now or 0, names = names}, blocked, now)
    local wakes = {}
    wake_all(keys, names, wakes, now)
    return nil, wakes, blocker
  end

  -- Make an arrival's limits and rates the ones in force. `limits` {{key, limit} or
  -- {key, max, min} (adaptive), ..} and `rlist` {{key, limit, per_ms, burst, units}, ..};
  -- returns the sorted union of their keys, the keys whose limit or rate it raised (with
  -- waiters) and whether it names a rate or an adaptive key.
  function throttle.apply_given(keys, limits, rlist)
    local given, names, raised, adaptive = {}, {}, {}, false
    for _, kl in ipairs(limits) do
      given[kl[Limit.KEY]] = {lim = kl}
    end
    for _, rate in ipairs(rlist or {}) do
      local g = given[rate[RateKey.KEY]] or {}
      g.rate = rate
      given[rate[RateKey.KEY]] = g
    end
    for key in pairs(given) do
      names[#names + 1] = key
    end
    table.sort(names)
    for _, key in ipairs(names) do
      local g = given[key]
      -- what is already in force is not written again: most jobs of a key give what
      -- the one before gave
      local kf = fields_of(key)
      local v = writeback.mget(keys, keys[THR], kf.given)
      local cur, limit = tonumber(v[1]), nil
      if g.lim and g.lim[Limit.MIN] then
        local hi, lo = tonumber(g.lim[Limit.LIMIT]), tonumber(g.lim[Limit.MIN])
        limit = math.floor(rates.adaptive_value(keys, key, hi, lo))
        local bounds = hi .. ',' .. lo
        if v[4] ~= bounds then
          writeback.set(keys, keys[THR], 'ad:' .. key, bounds)
        end
        adaptive = true
      elseif g.lim then
        limit = tonumber(g.lim[Limit.LIMIT])
        -- a fixed limit makes the key fixed again
        if v[4] then
          writeback.del(keys, keys[THR], 'ad:' .. key)
        end
      elseif not cur then
        limit = rates.UNLIMITED
      end
      local spec = nil
      if g.rate and not (v[2] and rates.same(rates.parse(v[2]), g.rate)) then
        spec = rates.encode(g.rate)
      end
      adaptive = adaptive or g.rate ~= nil
      local changed = (limit and cur and limit > cur) or (spec and v[2] and spec ~= v[2])
      if changed and redis.call('ZCARD', tags_key(keys, key, 's')) > 0 then
        raised[#raised + 1] = key
      end
      if limit and tonumber(v[1]) ~= limit then
        writeback.set(keys, keys[THR], 'l:' .. key, limit)
      end
      if spec and v[2] ~= spec then
        writeback.set(keys, keys[THR], 'rp:' .. key, spec)
      end
      if writeback.incr(keys, keys[THR], kf.r, 1) == 1 and v[3] then
        keyparts.first_use(keys, key)
      end
    end
    return names, raised, adaptive
  end

  -- Dispatch of `id` with its lane slot: convert its offers, or admit it on every key of
  -- `limits` and `rlist` at once (apply_given), or park it in `tenant`'s group on its
  -- first blocking key (`charge`: what a wake charges its tenant; `units`: its rate cost;
  -- `now`: the server's ms). Returns the grant (throttle.grant; nil when parked), the
  -- waiters woken on the way ({job, key}), the key it parked on and, admitted on its keys
  -- (not by its offers), the keys (sorted).
  local function thr_acquire(keys, id, limits, prio, seq, tenant, charge, rlist, units, now)
    units, now = tonumber(units) or 1, tonumber(now) or 0
    local offered = writeback.get(keys, keys[THR], 'w:' .. id)
    if offered then
      return convert_offers(keys, id, offered, prio, seq, tenant, charge, units, now)
    end
    local names, raised, adaptive = throttle.apply_given(keys, limits, rlist)
    local wakes = {}
    for _, key in ipairs(raised) do
      wake_key(keys, key, wakes, now)
    end
    local seen = {}
    local blocker, blocked = first_full(keys, names, units, now, nil, seen)
    if not blocker then
      for _, key in ipairs(names) do
        writeback.incr(keys, keys[THR], fields_of(key).u, 1)
      end
      return throttle.grant(names, take_tokens(keys, names, units, now, seen, adaptive)),
        wakes, nil, names
    end
    if adaptive then
      -- its wake and its release read it
      writeback.set(keys, keys[THR], 'c:' .. id, units)
    end
    enter_group(keys, id, {at = blocker, prio = prio, seq = seq, tenant = tenant,
      charge = charge, units = units, since = now, names = names}, blocked, now)
    return nil, wakes, blocker
  end

  -- What an ended attempt tells its keys, before its slots are freed: each rate key
  -- counting units corrected by what it really used (`used`, units; nil when unknown),
  -- each adaptive key grown after a success.
  -- (`units`: the job's rate cost, as grant kept it.)
  local function settle_rates(keys, names, units, now, used, succeeded)
    for _, key in ipairs(names) do
      local v = writeback.mget(keys, keys[THR], fields_of(key).settle)
      local rate = keyparts.rate(rates.parse(v[1]), keyparts.of(v[3], v[4], key))
      local cost = rate and rates.cost(rate, units)
      if rate and rate.units and used and cost ~= used then
        rates.correct(keys, key, rate, cost - used, now)
      end
      if succeeded and v[2] then
        rates.grow(keys, key, rates.adaptive_bounds(keys, key), now)
      end
    end
  end

  -- Free the slots of a job's `grant` (its record's, which the caller drops) and wake the
  -- keys, after settle_rates. Returns the waiters woken and the grant's keys (none for a
  -- grant that does not parse). `quiet`: wake_all's, for the releases of one call.
  local function thr_release(keys, grant, now, used, succeeded, quiet)
    local wakes = {}
    local units, joined = grant_parts(grant)
    if not joined then
      return wakes
    end
    now = tonumber(now) or 0
    local names = split_tabs(joined)
    if units then
      settle_rates(keys, names, units, now, tonumber(used), succeeded)
    end
    for _, key in ipairs(names) do
      writeback.incr(keys, keys[THR], fields_of(key).u, -1)
    end
    wake_all(keys, names, wakes, now, quiet)
    unref(keys, names)
    return wakes, names
  end

  -- Whether `quiet` (thr_release's, for the releases of one call) knows `key` to have
  -- nobody waiting.
  function throttle.quiet(quiet, key)
    return quiet ~= nil and quiet[key] == entered
  end

  -- The upstream behind `key` pushed back on an attempt that holds `grant` (its record's):
  -- the key is paused until `untl` (rates.pause, which may cut an adaptive key), and its
  -- waiters are due then. False when the grant does not hold the key.
  function throttle.thr_push_back(keys, grant, key, untl, now, cause)
    local _, joined = grant_parts(grant)
    local holds = false
    for _, name in ipairs(joined and split_tabs(joined) or {}) do
      holds = holds or name == key
    end
    if not holds then
      return false
    end
    rates.pause(keys, key, untl, now, cause)
    if redis.call('ZCARD', tags_key(keys, key, 's')) > 0 then
      redis.call('ZADD', rates.due_key(keys), 'GT', untl, key)
    end
    return true
  end

  -- A waiting job leaves (cancelled, expired): out of its tenant group (a rate key whose
  -- head it may have been is due at once, to look at its new head), or its offers and
  -- tokens given back and their keys woken. Returns whether it waited or held offers,
  -- and the waiters woken.
  local function thr_cancel(keys, id, now)
    now = tonumber(now) or 0
    local parked = writeback.get(keys, keys[THR], 'p:' .. id)
    if parked then
      local w = parse_parked(parked)
      redis.call('ZREM', keys[THRW], wait_member(w.at, w.tenant, w.prio, w.seq, id))
      writeback.del(keys, keys[THR], 'p:' .. id, 'c:' .. id)
      if not group_head(keys, w.at, w.tenant) then
        idle_group(keys, w.at, w.tenant,
          tonumber(redis.call('ZSCORE', tags_key(keys, w.at, 's'), w.tenant)))
      end
      if writeback.get(keys, keys[THR], 'rp:' .. w.at) and
          redis.call('ZCARD', tags_key(keys, w.at, 's')) > 0 then
        redis.call('ZADD', rates.due_key(keys), 'LT', now, w.at)
      end
      unref(keys, w.names)
      return true, {}
    end
    local offered = writeback.get(keys, keys[THR], 'w:' .. id)
    if not offered then
      return false, {}
    end
    writeback.del(keys, keys[THR], 'w:' .. id)
    local names, wakes = split_tabs(offered), {}
    for _, key in ipairs(names) do
      writeback.incr(keys, keys[THR], 'o:' .. key, -1)
    end
    throttle.refund_rates(keys, id, names, now)
    wake_all(keys, names, wakes, now)
    unref(keys, names)
    return true, wakes
  end

  -- Take a parked job out of its group (a waiter's cancel wakes nobody); false when it
  -- was not waiting.
  local function thr_cancel_waiter(keys, id, now)
    if not writeback.get(keys, keys[THR], 'p:' .. id) then
      return false
    end
    return (thr_cancel(keys, id, now))
  end

  -- Wake every rate key due by `now` (at most DUE_BATCH, in due order): the rate timer,
  -- run by fetch. Returns the waiters woken.
  function throttle.thr_wake_due(keys, now)
    local dk = rates.due_key(keys)
    local out = {}
    for _, key in ipairs(redis.call('ZRANGEBYSCORE', dk, '-inf', now, 'LIMIT', 0, rates.DUE_BATCH)) do
      redis.call('ZREM', dk, key)
      wake_key(keys, key, out, now)
    end
    return out
  end

  -- When the next rate key is due (server ms), or nil.
  function throttle.thr_next_due(keys)
    local head = redis.call('ZRANGE', rates.due_key(keys), 0, 0, 'WITHSCORES')
    return tonumber(head[2])
  end

  ---------------------------------------------------------------------------- tenant ceilings

  -- A tenant's own key and its limit now (fairlane/policy/ceilings.py): Little's law on
  -- its recent submission rate R and mean duration D, a burst on top, compressed by the
  -- lane's pressure. Settings in KEYS[TLIMITS]: tenant -> 'floor,max,burst_floor,burst_pct'
  -- (max -1 = none); signals in sig:<tenant> (a ring of RATE_BUCKETS counters and the
  -- duration mean): all fixed-size reads.
  local RATE_BUCKETS, RATE_WIDTH_MS = __RATE_BUCKETS__, __RATE_WIDTH_MS__
  local F_MIN, F_MAX, DURATION_ALPHA = __F_MIN__, __F_MAX__, __DURATION_ALPHA__

  local function ceil_eps(x)
    return math.ceil(x - CLASS_EPS)
  end

  local function sig_key(p, tenant)
    return p .. 'sig:' .. tenant
  end

  -- Count `n` submissions of a tenant at `now` (only tenants with limits are tracked).
  local function note_submissions(p, tenant, n, now)
    local index = math.floor(now / RATE_WIDTH_MS)
    local slot = index % RATE_BUCKETS
    local sk = sig_key(p, tenant)
    local stamp = tonumber(redis.call('HGET', sk, 's' .. slot))
    if stamp and stamp > index then
      return
    end
    if stamp ~= index then
      redis.call('HSET', sk, 's' .. slot, index, 'c' .. slot, n)
    else
      redis.call('HINCRBY', sk, 'c' .. slot, n)
    end
  end

  -- Fold one finished attempt's duration (seconds) into the tenant's mean.
  local function note_duration(p, tenant, seconds)
    local sk = sig_key(p, tenant)
    local v = redis.call('HMGET', sk, 'dm', 'dn')
    local mean = tonumber(v[1])
    if not mean or not tonumber(v[2]) or tonumber(v[2]) == 0 then
      mean = seconds
    else
      mean = mean + DURATION_ALPHA * (seconds - mean)
    end
    redis.call('HSET', sk, 'dm', mean)
    redis.call('HINCRBY', sk, 'dn', 1)
  end

  local function rate_per_min(p, tenant, now)
    local index = math.floor(now / RATE_WIDTH_MS)
    local fields = {}
    for slot = 0, RATE_BUCKETS - 1 do
      fields[#fields + 1] = 's' .. slot
      fields[#fields + 1] = 'c' .. slot
    end
    local v = redis.call('HMGET', sig_key(p, tenant), unpack(fields))
    local total = 0
    for slot = 0, RATE_BUCKETS - 1 do
      local stamp = tonumber(v[2 * slot + 1])
      if stamp and index - RATE_BUCKETS < stamp and stamp <= index then
        total = total + (tonumber(v[2 * slot + 2]) or 0)
      end
    end
    local span = (RATE_BUCKETS - 1) * RATE_WIDTH_MS + now % RATE_WIDTH_MS + 1
    return total * 60000 / span
  end

  -- The tenant's limit now, or nil when it has no concurrency settings. `target` is the
  -- lane's cached capacity, `load` its slots in flight and waiting.
  local function tenant_limit(keys, p, tenant, target, load, now)
    local spec = redis.call('HGET', keys[TLIMITS], tenant)
    if not spec then
      return nil
    end
    local floor, max, burst_floor, burst_pct = string.match(spec, '^(%d+),(-?%d+),(%d+),([%d.e+-]+)$')
    floor, max, burst_floor, burst_pct = tonumber(floor), tonumber(max), tonumber(burst_floor),
      tonumber(burst_pct)
    if not (floor and max and burst_floor and burst_pct) then
      return nil -- settings that do not parse limit nothing: better than no dispatch at all
    end
    local mean = tonumber(redis.call('HGET', sig_key(p, tenant), 'dm')) or 0
    local base = math.max(floor, ceil_eps(rate_per_min(p, tenant, now) * mean / 60))
    local top = base + math.max(burst_floor, floor_eps(base * burst_pct))
    local factor = F_MAX
    if load > 0 then
      factor = math.min(F_MAX, math.max(F_MIN, target / load))
    end
    local limit = math.max(floor, floor_eps(top * factor))
    if max >= 0 then
      limit = math.min(limit, max)
    end
    return limit
  end

  throttle.RATE_BUCKETS = RATE_BUCKETS
  throttle.RATE_WIDTH_MS = RATE_WIDTH_MS
  throttle.note_duration = note_duration
  throttle.note_submissions = note_submissions
  throttle.rate_per_min = rate_per_min
  throttle.sig_key = sig_key
  throttle.tenant_limit = tenant_limit
  throttle.thr_acquire = thr_acquire
  throttle.thr_cancel = thr_cancel
  throttle.thr_cancel_waiter = thr_cancel_waiter
  throttle.thr_release = thr_release
end
