-- Durable workflow runs, the parts the job records need: a run's own keys, the
-- parent told when a child settles, and a run's keys dropped with its record.
--
-- A run is a job whose task is a workflow. Besides its job hash it keeps, under the
-- same hash tag (fairlane/store/keys.py):
--   run:<id>:steps  list  checkpointed operations, in order (the replay history)
--   run:<id>:log    list  slices, suspensions and the end, for `fairlane runs show`
--   run:<id>:sig    list  signals delivered and not yet consumed, oldest first
--   run:<id>:h      hash  'k:<child>' settled children, 's:<id>' signal ids seen,
--                         'a:<step>' failed attempts of a step
-- Job fields of a run: wfr (1 once it ran), wf (what a suspended run waits for:
-- yield | sleep | signal:<name> | children), wfw ('<seq>|<deadline ms>|<since ms>' of
-- the wait in progress), wfk (packed ids of the children it waits for), par (a
-- child's parent run).
--
-- Keys: run:<id>:steps|log|sig|h, job:<id>, lane:<l>:delayed
-- Calls: core
-- Entry points: runs.{children_done, drop_run_keys, find_signal, notify_parent, run_key,
--   wake_run}

local runs = {}

do
  local job_key, lane_key, wake = core.job_key, core.lane_key, core.wake

  local function run_key(p, id, what)
    return p .. 'run:' .. id .. ':' .. what
  end

  -- Whether every child in `packed` (a msgpack array of ids) has settled.
  local function children_done(p, id, packed)
    if not packed then
      return false
    end
    local ids = cmsgpack.unpack(packed)
    if #ids == 0 then
      return true
    end
    local fields = {}
    for i, cid in ipairs(ids) do
      fields[i] = 'k:' .. cid
    end
    for _, v in ipairs(redis.call('HMGET', run_key(p, id, 'h'), unpack(fields))) do
      if not v then
        return false
      end
    end
    return true
  end

  -- The index (1-based) of the oldest undelivered signal called `name`, and its entry.
  local function find_signal(p, id, name)
    local entries = redis.call('LRANGE', run_key(p, id, 'sig'), 0, -1)
    for i, raw in ipairs(entries) do
      local e = cmsgpack.unpack(raw)
      if e[1] == name then
        return i, raw, e
      end
    end
    return nil
  end

  -- Wake a suspended run now: it passes the gate again on the next dispatch.
  local function wake_run(p, id, lane, now)
    redis.call('ZADD', lane_key(p, lane, 'delayed'), 'XX', now, id)
    redis.call('HSET', job_key(p, id), 'run', now)
    wake(p, lane)
  end

  -- A child settled: the parent keeps its outcome (the child's own record may be
  -- trimmed before the parent reads it) and wakes if it waited for its last child.
  local function notify_parent(p, parent, id, status, payload, now)
    redis.call('HSET', run_key(p, parent, 'h'), 'k:' .. id, cmsgpack.pack({status, payload or ''}))
    local f = redis.call('HMGET', job_key(p, parent), 'st', 'wf', 'wfk', 'lane')
    if f[1] == 'scheduled' and f[2] == 'children' and children_done(p, parent, f[3]) then
      wake_run(p, parent, f[4] or core.DEFAULT_LANE, now)
    end
  end

  local function drop_run_keys(p, id)
    redis.call('DEL', run_key(p, id, 'steps'), run_key(p, id, 'log'), run_key(p, id, 'sig'),
      run_key(p, id, 'h'))
  end

  runs.children_done = children_done
  runs.drop_run_keys = drop_run_keys
  runs.find_signal = find_signal
  runs.notify_parent = notify_parent
  runs.run_key = run_key
  runs.wake_run = wake_run
end
