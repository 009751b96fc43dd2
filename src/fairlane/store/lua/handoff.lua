-- The direct hand-off: an enqueue's one job, when it is all its lane has waiting and a
-- worker is idle, leased to that worker without passing through its queue.
--
-- What it writes is what the enqueue's push and a dispatch of one slot would leave
-- (fairqueue.lua's activate, then dispatch.lua's take of the class's lone head, the
-- tenant idle again): the tenant's finish tag, V, the class's in-flight slots, the lease.
-- It skips the writes that cancel out (the job into its tenant's queue and out, the
-- tenant into the class's fair set and out, the class's waiting slots up and down) and
-- the reads a dispatch makes to find a head it already knows. Anything it does not
-- model (several jobs, a key, a deadline, a pause, tenant limits or rates, a sharded
-- app's waiting weights, work waiting in the lane) goes the long way.
-- tests/store/test_direct_handoff.py holds the two ways to the same state.
--
-- Keys: lane:<l>:state|idle, lane:<l>:c:<c>:vt, trate, KEYS[WEIGHTS]
-- Calls: core, classes, fairqueue, dispatch, leasing, records
-- Entry points: handoff.{direct}

local handoff = {}

do
  local lane_key = core.lane_key
  local choose_class, class_index, class_levels = classes.choose_class, classes.class_index, classes.class_levels
  local class_key = fairqueue.class_key

  -- The lane's classes' in-flight slots when nothing waits in any of them, else nil.
  local function idle_lane(p, lane, tbl)
    local names = dispatch.state_fields(tbl)
    local v = redis.call('HMGET', lane_key(p, lane, 'state'), unpack(names.fields))
    local n, f = #tbl, {}
    for i = 1, n do
      if (tonumber(v[2 * i + 1]) or 0) > 0 then
        return nil
      end
      f[i] = math.max(0, tonumber(v[2 * i]) or 0)
    end
    return f, tonumber(v[1]) or 0
  end

  -- Whether class `cls` may start a one-slot head now, its lane otherwise empty
  -- (classes.lua's rule, as dispatch asks it).
  local function may_start(tbl, cap, f, cls)
    local x = class_index(tbl, cls)
    if not x then
      return false
    end
    local w, d = {}, {}
    for i = 1, #tbl do
      d[i] = 0
    end
    w[x], d[x] = 1, 1
    return choose_class(class_levels(tbl, cap), f, w, d) == x
  end

  -- The tenant's tags as activation and the take leave them: it starts at
  -- max(V, its finish tag) (nothing else is active, so no newcomer credit); a job that
  -- starts (`units` given) moves V up to that start and the tenant, idle again, finishes
  -- its units over its weight on; one that does not leaves it idle at its start.
  local function charge_tenant(keys, p, lane, cls, tenant, units, tally)
    local vt = class_key(p, lane, cls, 'vt')
    local t = redis.call('HMGET', vt, 'V', 'f:' .. tenant)
    local v = tonumber(t[1]) or 0
    local start = v
    local finish = tonumber(t[2])
    if finish and finish > start then
      start = finish
    end
    if not units then
      redis.call('HSET', vt, 'f:' .. tenant, start)
      return
    end
    local weight = core.tenant_weight(tally, keys, tenant)
    if start > v then
      redis.call('HSET', vt, 'f:' .. tenant, start + units / weight, 'V', start)
    else
      redis.call('HSET', vt, 'f:' .. tenant, start + units / weight)
    end
  end

  -- Hand job `id` (stored, ready, one slot, class `cls`) of lane `lane` to an idle worker
  -- if the lane has nothing else waiting and its class may start it. Returns 'handed';
  -- 'none' when no worker is idle or the class may not start it now, which a dispatch
  -- would find too (push it, and hand nothing over); nil when this is not the case it
  -- models (push it, and hand over as usual). Only 'handed' wrote anything.
  function handoff.direct(keys, p, lane, tbl, id, tenant, cls, cost_mode, tally, now)
    local member, worker, lease = leasing.peek_idle_worker(p, lane, now)
    if not member then
      return 'none'
    end
    if redis.call('EXISTS', p .. 'trate') == 1 then
      return nil
    end
    local f, cap = idle_lane(p, lane, tbl)
    if not f then
      return nil
    elseif not may_start(tbl, cap, f, cls) then
      return 'none'
    end
    local jf = leasing.runnable(keys, p, id, now, tally)
    if not jf then
      -- settled by the check instead (dispatch would have taken it and found the same):
      -- its tenant goes idle uncharged
      charge_tenant(keys, p, lane, cls, tenant, nil, tally)
      return 'handed'
    end
    charge_tenant(keys, p, lane, cls, tenant, dispatch.charged_units(cost_mode, jf[14]), tally)
    redis.call('HINCRBY', lane_key(p, lane, 'state'), 'f:' .. cls, 1)
    records.count_start(tally, lane, cls, jf[9])
    redis.call('ZREM', lane_key(p, lane, 'idle'), member)
    leasing.hand_off(keys, p, worker, lease, {{id, jf, lane, nil}}, now)
    return 'handed'
  end
end
