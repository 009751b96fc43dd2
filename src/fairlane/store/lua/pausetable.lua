-- The pause table: an operator's pauses (fairlane/policy/pauses.py states the rules
-- P1-P5), read once per call where a lane says the shard has any, and the questions
-- dispatch, enqueue and a throttle key's wake ask of it.
--
-- Keys: pause (field -> the pause's end in ms, 0 = none), lane:<l>:state (`P` set while
--   the shard has any pause)
-- Calls: core
-- Entry points: pausetable.{blocks, class_held, field, job_field, lane_has_pauses, load,
--   refusal, single, tenant_held}

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

  -- The pauses in force at `now` (`on`: field -> end, 0 none), the fields of those that
  -- ended (`ended`), for whoever lifts them (pauses.lua), and the names in force by kind
  -- (`tenants`, `tasks`, `keys`, `refused`: name -> true; `lanes`: lane -> class ('' =
  -- every class) -> true), so that a check costs a table lookup, not a string built
  -- per job; `jobs` is whether any task or key is paused.
  local function new_table()
    return {on = {}, ended = {}, tenants = {}, tasks = {}, keys = {}, lanes = {}, refused = {},
      jobs = false}
  end

  local function add(t, fld, untl)
    t.on[fld] = untl
    local kind, first, second = string.sub(fld, 1, 1), string.match(fld, '^..([^%z]*)%z?(.*)$')
    if kind == PauseField.TENANT then
      t.tenants[first] = true
    elseif kind == PauseField.REFUSE then
      t.refused[first] = untl
    elseif kind == PauseField.TASK then
      t.tasks[first], t.jobs = true, true
    elseif kind == PauseField.KEY then
      t.keys[first .. '\0' .. second], t.jobs = fld, true
    elseif kind == PauseField.LANE then
      t.lanes[first] = t.lanes[first] or {}
      t.lanes[first][second] = true
    end
  end

  function pausetable.load(p, now)
    local raw = redis.call('HGETALL', p .. 'pause')
    local t = new_table()
    for i = 1, #raw, 2 do
      local untl = tonumber(raw[i + 1]) or 0
      if untl == 0 or now < untl then
        add(t, raw[i], untl)
      else
        t.ended[#t.ended + 1] = raw[i]
      end
    end
    return t
  end

  -- A table of the one pause `fld` (asked which running jobs it holds).
  function pausetable.single(fld)
    local t = new_table()
    add(t, fld, 0)
    return t
  end

  -- Whether the lane's state says its shard has pauses (one field, read with others
  -- where a call reads the state anyway).
  function pausetable.lane_has_pauses(p, lane)
    return redis.call('HGET', lane_key(p, lane, 'state'), 'P') ~= false
  end

  -- P1
  function pausetable.class_held(t, lane, cls)
    local l = t.lanes[lane]
    return l ~= nil and (l[''] ~= nil or l[cls] ~= nil)
  end

  -- P2
  function pausetable.tenant_held(t, tenant)
    return t.tenants[tenant] ~= nil
  end

  -- P3: the field a job of `task`, `tenant` and fairness key `fk` (nil none) parks
  -- under, its key's before its task's; nil when neither is paused.
  function pausetable.job_field(t, task, tenant, fk)
    if not t.jobs then
      return nil
    end
    if fk and fk ~= '' then
      local by_key = t.keys[tenant .. '\0' .. fk]
      if by_key then
        return by_key
      end
    end
    if task and t.tasks[task] then
      return field(PauseField.TASK, task)
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
    return t.refused[tenant]
  end
end
