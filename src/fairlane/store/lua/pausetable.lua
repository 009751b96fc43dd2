-- The pause table: an operator's pauses (fairlane/policy/pauses.py states the rules
-- P1-P5), read once per call where a lane says the shard has any, and the questions
-- dispatch, enqueue and a throttle key's wake ask of it.
--
-- Keys: pause (field -> the pause's end in ms, 0 = none), lane:<l>:state (`P` set while
--   the shard has any pause)
-- Calls: core
-- Entry points: pausetable.{blocks, class_held, field, job_field, lane_has_pauses, load,
--   refusal, tenant_held}

local pausetable = {}

do
  local lane_key = core.lane_key

  -- A scope's field: its kind (PauseField, fairlane/store/wire.py), ':' and its names,
  -- a second one after a zero byte (a tenant's key, a lane's class: '' = every class).
  local function field(kind, a, b)
    if b then
      return kind .. ':' .. a .. '\0' .. b
    end
    return kind .. ':' .. a
  end
  pausetable.field = field

  -- The pauses in force at `now` (`on`: field -> end, 0 none) and the fields of those
  -- that ended (`ended`), for whoever lifts them (pauses.lua).
  function pausetable.load(p, now)
    local raw = redis.call('HGETALL', p .. 'pause')
    local t = {on = {}, ended = {}}
    for i = 1, #raw, 2 do
      local untl = tonumber(raw[i + 1]) or 0
      if untl == 0 or now < untl then
        t.on[raw[i]] = untl
      else
        t.ended[#t.ended + 1] = raw[i]
      end
    end
    return t
  end

  -- Whether the lane's state says its shard has pauses (one field, read with others
  -- where a call reads the state anyway).
  function pausetable.lane_has_pauses(p, lane)
    return redis.call('HGET', lane_key(p, lane, 'state'), 'P') ~= false
  end

  -- P1
  function pausetable.class_held(t, lane, cls)
    return t.on[field(PauseField.LANE, lane, '')] ~= nil
      or t.on[field(PauseField.LANE, lane, cls)] ~= nil
  end

  -- P2
  function pausetable.tenant_held(t, tenant)
    return t.on[field(PauseField.TENANT, tenant)] ~= nil
  end

  -- P3: the field a job of `task`, `tenant` and fairness key `fk` (nil none) parks
  -- under, its key's before its task's; nil when neither is paused.
  function pausetable.job_field(t, task, tenant, fk)
    if fk and fk ~= '' then
      local by_key = field(PauseField.KEY, tenant, fk)
      if t.on[by_key] then
        return by_key
      end
    end
    local by_task = field(PauseField.TASK, task or '')
    if t.on[by_task] then
      return by_task
    end
    return nil
  end

  -- P4: anything holding a job of these names back.
  function pausetable.blocks(t, lane, cls, task, tenant, fk)
    return pausetable.class_held(t, lane, cls) or pausetable.tenant_held(t, tenant)
      or pausetable.job_field(t, task, tenant, fk) ~= nil
  end

  -- A quarantine's end (0: none) when it refuses `tenant`'s submissions, else nil.
  function pausetable.refusal(t, tenant)
    return t.on[field(PauseField.REFUSE, tenant)]
  end
end
