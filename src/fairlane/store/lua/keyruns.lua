-- Keys by the run: a dispatch call's jobs that name the same throttle and rate keys (the
-- same `lim` and `rk` fields, no tenant limit or rate) pass them on what the run's first
-- job found there, kept as numbers, instead of reading, parsing and deciding every key
-- again for each job. What a job then changes is what throttle.thr_acquire would have
-- changed for it: a slot held and a reference on each key, its tokens on each rate key,
-- a grant.
--
-- Why that is the same decision: thr_acquire of such a job applies the limits and rates
-- its run's first job applied (nothing to write but the references), and admits it when
-- every key has room, no pause in force, and on a rate key no waiter and the tokens it
-- costs. The first job was admitted, so no rate key had a waiter then; waiters, limits,
-- rates, pauses, offers and held slots change only through writeback's functions, which
-- move its epoch, and the run is dropped when the epoch has moved since it last wrote.
-- Within the run, the slots and tokens are counted here exactly as thr_acquire counts
-- them. A job that does not fit, or any doubt, takes thr_acquire's way, which decides it
-- in full (and may park it). An adaptive key (its limit moves with each success) never
-- starts a run.
--
-- Releases run the same way (`released`, `release`): the grants an ack call releases
-- that hold the keys its last release held give back a slot and a reference on each,
-- when thr_release would do nothing else -- no key has waiters to wake (the call's
-- `quiet` knew none, and nobody has entered a group since: that moves the epoch), a rate
-- counting units to correct or an adaptive limit to grow, or its last reference to drop.
--
-- Keys: KEYS[THR], rate:<key> (through writeback, throttle and rates)
-- Calls: core, writeback, throttle, rates
-- Entry points: keyruns.{acquire, release, released, remember}

local keyruns = {}

do
  local THR = core.THR

  -- the call's run: {keys, sig, epoch, names, costs (whether a grant keeps a rate cost),
  -- grant and cost (the last grant text made and its cost), vv, dirty (the throttle
  -- hash's view), ks = {{key, kf, slots, held, offered, refs, rate, pz, bucket, view (its
  -- state's: writeback.view_of)}, ..}}, or nil
  local current = nil

  -- Start a run on the keys `names` (sorted) that a job of signature `sig` was just
  -- granted by thr_acquire, with its `limits` and `rlist` as it gave them. Nothing is
  -- kept out of a call's views (writeback.fields) or for an adaptive key.
  function keyruns.remember(keys, sig, names, limits, rlist, now)
    current = nil
    local vv, dirty = writeback.fields(keys, keys[THR])
    if not (sig and vv) then
      return
    end
    for _, kl in ipairs(limits) do
      if kl[Limit.MIN] then
        return
      end
    end
    local ks = {}
    for i, key in ipairs(names) do
      local slots, held, offered, rate, pz = throttle.key_state(keys, key)
      local kf = throttle.fields_of(key)
      ks[i] = {key = key, kf = kf, slots = slots, held = held, offered = offered,
        refs = tonumber(writeback.get(keys, keys[THR], kf.r)) or 0, rate = rate, pz = pz,
        bucket = rate and rates.read(keys, key, rate, now)}
      if rate then
        -- a fresh bucket's first take records the key (rates.keep): through `take`
        ks[i].view = not ks[i].bucket.fresh and writeback.view_of(keys, ks[i].bucket.sk)
      end
    end
    current = {keys = keys, sig = sig, epoch = writeback.epoch(), names = names,
      joined = table.concat(names, '\t'), costs = #rlist > 0, vv = vv, dirty = dirty, ks = ks}
  end

  -- the call's release run: {keys, epoch, joined (the keys as a grant holds them), grant
  -- (the last grant text found to hold them), vv, dirty, ks = {{kf, held, refs}, ..}}, or
  -- nil
  local freed = nil

  -- Whether thr_release of a grant of `key` does nothing but give back its slot and
  -- reference: nobody waits on it, and it has no rate counting units (whose cost an
  -- attempt's use corrects) nor an adaptive limit (which a success grows).
  local function plain(keys, key, quiet)
    if not throttle.quiet(quiet, key) then
      return false
    end
    local v = writeback.mget(keys, keys[THR], throttle.fields_of(key).settle)
    local rate = rates.parse(v[1])
    return not (v[2] or (rate and rate.units))
  end

  -- Start a release run on `names`, whose grant thr_release just released with no one
  -- woken (`quiet`: its call's).
  function keyruns.released(keys, names, quiet)
    freed = nil
    local vv, dirty = writeback.fields(keys, keys[THR])
    if not vv then
      return
    end
    local ks = {}
    for i, key in ipairs(names) do
      if not plain(keys, key, quiet) then
        return
      end
      local kf = throttle.fields_of(key)
      local v = writeback.mget(keys, keys[THR], {kf.u, kf.r})
      ks[i] = {kf = kf, held = tonumber(v[1]) or 0, refs = tonumber(v[2]) or 0}
    end
    freed = {keys = keys, epoch = writeback.epoch(), joined = table.concat(names, '\t'),
      vv = vv, dirty = dirty, ks = ks}
  end

  -- Release a job's `grant` (its record's) as thr_release would, when it holds the keys
  -- of the call's release run and none of them would lose its last reference. Returns
  -- whether it did; if not, thr_release decides.
  function keyruns.release(keys, grant)
    local run = freed
    if not (run and run.keys == keys and run.epoch == writeback.epoch()) then
      return false
    end
    -- the jobs of a run hold one text: parsed once
    if grant ~= run.grant then
      local _, joined = throttle.grant_parts(grant)
      if joined ~= run.joined then
        return false
      end
      run.grant = grant
    end
    for _, e in ipairs(run.ks) do
      if e.refs <= 1 then
        return false
      end
    end
    local vv, dirty = run.vv, run.dirty
    for _, e in ipairs(run.ks) do
      e.held, e.refs = e.held - 1, e.refs - 1
      vv[e.kf.u], vv[e.kf.r] = e.held, e.refs
      dirty[e.kf.u], dirty[e.kf.r] = true, true
    end
    return true
  end

  -- Whether every key of the run lets a job of rate cost `units` start now.
  local function fits(run, units, now)
    for _, e in ipairs(run.ks) do
      if e.slots - e.held - e.offered <= 0 or (e.pz and now < e.pz) then
        return false
      end
      if e.rate and not rates.fits(e.rate, e.bucket, rates.cost(e.rate, units), now) then
        return false
      end
    end
    return true
  end

  -- Grant a job of signature `sig` (rate cost `units`) its keys as thr_acquire would,
  -- when it is of the call's run and fits. Returns the grant (throttle.grant), or nil:
  -- then thr_acquire decides.
  function keyruns.acquire(keys, sig, units, now)
    local run = current
    if not (run and sig and run.keys == keys and run.sig == sig
        and run.epoch == writeback.epoch() and fits(run, units, now)) then
      return nil
    end
    local vv, dirty = run.vv, run.dirty
    for _, e in ipairs(run.ks) do
      e.held, e.refs = e.held + 1, e.refs + 1
      vv[e.kf.u], vv[e.kf.r] = e.held, e.refs
      dirty[e.kf.u], dirty[e.kf.r] = true, true
      if e.view then
        rates.take_viewed(e.view, e.rate, e.bucket, rates.cost(e.rate, units), now)
      elseif e.rate then
        rates.take(keys, e.key, e.rate, e.bucket, rates.cost(e.rate, units), now)
      end
    end
    -- the jobs of a run hold one text while their rate cost is the same
    local cost = run.costs and units or nil
    if not run.grant or cost ~= run.cost then
      run.grant, run.cost = throttle.grant(run.names, cost, run.joined), cost
    end
    run.epoch = writeback.epoch()
    return run.grant
  end
end
