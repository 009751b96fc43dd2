-- Deadline order: earliest deadline first among one tenant's own jobs of one priority,
-- for a job whose task or class turns it on (fairlane/policy/deadlineorder.py states the
-- rule, the layout of the scores and why it cannot change another tenant's share; this
-- is its twin). The order number is given once, where enqueue.lua stores the job, and
-- the record's `seq` carries it wherever the job re-enters its queue; it is negative,
-- which is how a deadline-ordered job is told from the others.
--
-- Keys: reads q:<lane>:<class>:<tenant> (present_order)
-- Calls: core
-- Entry points: deadlineorder.{deadline_order, ordered, present_order}

local deadlineorder = {}

do
  local PRIO_SPAN = core.PRIO_SPAN
  local EPOCH_MS, TICK_MS, SPAN = __DEADLINE_EPOCH_MS__, __DEADLINE_TICK_MS__, __DEADLINE_SPAN__
  -- a score's order (its value mod PRIO_SPAN) at or above this is a deadline order's
  local FIFO_END = PRIO_SPAN - SPAN

  -- The order number of a deadline-ordered job due by `dl` (server ms): in [-SPAN, 0).
  function deadlineorder.deadline_order(dl)
    local ticks = math.floor((tonumber(dl) - EPOCH_MS) / TICK_MS)
    if ticks < 0 then
      ticks = 0
    elseif ticks > SPAN - 1 then
      ticks = SPAN - 1
    end
    return ticks - SPAN
  end

  -- Whether a record's `seq` is a deadline order (every other order number is >= 0).
  function deadlineorder.ordered(seq)
    local n = tonumber(seq)
    return n ~= nil and n < 0
  end

  -- The order number of queue `q`'s first job that is not deadline-ordered, or nil when
  -- there is none (fairkeys.lua's present). A deadline-ordered head is skipped with the
  -- rest of its priority's band at once: that priority's FIFO numbers start at the next
  -- multiple of PRIO_SPAN, so the walk costs a command per priority, not per job.
  function deadlineorder.present_order(q)
    local head = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
    while #head > 0 do
      local score = tonumber(head[2])
      local order = score % PRIO_SPAN
      if order < FIFO_END then
        return order
      end
      head = redis.call('ZRANGE', q, score - order + PRIO_SPAN, '+inf', 'BYSCORE', 'LIMIT', 0, 1,
        'WITHSCORES')
    end
    return nil
  end
end
