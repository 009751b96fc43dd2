-- Default queue bounds of a lane without an admission pool: most jobs ready per
-- tenant queue and per lane (fairlane/policy/admission/bounds.py states the rule, what
-- counts as queued and when the lane is read; this is the store's twin).
--   state `qb`   '<tenant max>,<lane max>' (-1: unbounded), written by declare_bounds,
--                with ',f' while the lane is marked full; absent: the lane is unbounded
--                (a lane with a pool has none: its pool bounds it)
-- The counts are ones the store already keeps, read at most once per enqueue call and
-- then counted on in Lua: the lane's ready slots are its classes' `d:<c>` (one HMGET),
-- a tenant's the size of its class queue (one ZCARD per queue, which push_ready would
-- otherwise make itself), the scheduled jobs the delayed set's size (one ZCARD, only
-- for a call holding a scheduled job). A call of one job reads the lane one time in
-- LANE_READ_EVERY (the policy's, written in by the library), or every time while
-- the lane is marked full. Nothing is counted on dispatch or ack.
--
-- Keys: lane:<l>:state (qb, d:<c>), lane:<l>:delayed, q:<lane>:<class>:<tenant> (their
--   sizes)
-- Calls: core, fairqueue
-- Entry points: queue_bounds.{declare, mark_full, parse, ready_slots, room}

-- The parsing, the decision and the declaration are fields of `queue_bounds`.
local queue_bounds = {LANE_READ_EVERY = __LANE_READ_EVERY__}

do
  local lane_key, prefix, slots_of = core.lane_key, core.prefix, core.slots_of
  local tenant_queue = fairqueue.tenant_queue

  -- The bounds of a lane from its state's `qb` field, with the counts of one enqueue
  -- call (nil: the lane is unbounded).
  function queue_bounds.parse(raw)
    if not raw then
      return nil
    end
    local t, l, f = string.match(raw, '^(%-?%d+),(%-?%d+)(,?f?)$')
    local spec = t and (t .. ',' .. l)
    t, l = tonumber(t), tonumber(l)
    if not t or not l or (t < 0 and l < 0) then
      return nil
    end
    return {t = t >= 0 and t or nil, l = l >= 0 and l or nil, spec = spec, full = f == ',f',
      queues = {}}
  end

  -- The lane's ready slots, read once per call from the classes' waiting fields.
  function queue_bounds.ready_slots(p, lane, tbl)
    local fields = {}
    for i, c in ipairs(tbl) do
      fields[i] = 'd:' .. c[ClassRow.NAME]
    end
    local n = 0
    for _, v in ipairs(redis.call('HMGET', lane_key(p, lane, 'state'), unpack(fields))) do
      n = n + math.max(0, tonumber(v) or 0)
    end
    return n
  end

  -- The lane's full mark, written only when it changes: set by a lane_queue_full
  -- refusal, cleared when a read finds room.
  function queue_bounds.mark_full(p, lane, qb, full)
    if qb.full ~= full then
      qb.full = full
      redis.call('HSET', lane_key(p, lane, 'state'), 'qb', qb.spec .. (full and ',f' or ''))
    end
  end

  -- Whether a new job may wait (policy admit_batch, queue_refusal): returns 'accepted',
  -- or 'rejected' and the reason. An accepted job is counted at once, so that a batch is
  -- judged job by job. `seq` is the job's FIFO number and `n` the call's job count (for
  -- reads_lane). `pushes` is the call's push batch (fairqueue.lua): a tenant queue found
  -- non-empty is marked active there, as push_ready would find it, so that its ZCARD is
  -- not made twice.
  function queue_bounds.room(p, lane, qb, tbl, cls, tenant, slots, scheduled, pushes, seq, n)
    if qb.l and qb.read == nil then
      qb.read = qb.full or n > 1 or seq % queue_bounds.LANE_READ_EVERY == 0
      if qb.read then
        qb.ready = queue_bounds.ready_slots(p, lane, tbl)
      end
    end
    local lane_max = qb.read and qb.l or nil
    if scheduled then
      if lane_max then
        if not qb.sched then
          qb.sched = redis.call('ZCARD', lane_key(p, lane, 'delayed'))
        end
        if qb.ready + qb.sched >= lane_max then
          queue_bounds.mark_full(p, lane, qb, true)
          return 'rejected', 'lane_queue_full'
        end
        qb.sched = qb.sched + 1
        queue_bounds.mark_full(p, lane, qb, false)
      end
      return 'accepted', nil
    end
    local q = tenant_queue(p, lane, cls, tenant)
    if qb.t then
      local have = qb.queues[q]
      if not have then
        have = redis.call('ZCARD', q)
        if have > 0 then
          pushes.active[q] = true
        end
      end
      if have >= qb.t then
        qb.queues[q] = have
        return 'rejected', 'tenant_queue_full'
      end
      qb.queues[q] = have + 1
    end
    if lane_max then
      local width = slots_of(slots)
      if qb.ready + width > lane_max then
        if qb.t then
          qb.queues[q] = qb.queues[q] - 1
        end
        queue_bounds.mark_full(p, lane, qb, true)
        return 'rejected', 'lane_queue_full'
      end
      qb.ready = qb.ready + width
      queue_bounds.mark_full(p, lane, qb, false)
    end
    return 'accepted', nil
  end

  -- ARGV: lane, '<tenant max>,<lane max>' (-1: unbounded), or '' for none (a lane with
  -- an admission pool, or both bounds lifted). Applies from the next enqueue.
  function queue_bounds.declare(keys, args)
    local sk = lane_key(prefix(keys), args[DeclareBoundsArg.LANE], 'state')
    if args[DeclareBoundsArg.BOUNDS] == '' then
      redis.call('HDEL', sk, 'qb')
    else
      if not string.match(args[DeclareBoundsArg.BOUNDS], '^%-?%d+,%-?%d+$') then
        return redis.error_reply('ERR bounds must be "<tenant max>,<lane max>"')
      end
      redis.call('HSET', sk, 'qb', args[DeclareBoundsArg.BOUNDS])
    end
    return 1
  end
end
