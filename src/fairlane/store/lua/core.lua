-- The library's common ground: the app's fixed keys (by the names fairlane.lua's header
-- gives them), the server's clock, the prefix and the keys derived from it, job events,
-- and the hot path's helpers (chunked commands, memoised parses, a record read whole).
--
-- Keys: KEYS[FENCE] (the app's prefix comes from it), ev:<id>, lane:<l>:wake; the KEYS
--   indexes (FENCE .. THRW) are named here
-- Calls: none
-- Entry points: core.{ACK_NONE, ALLOW_OOM, ARGS, DEAD, DEFAULT_BACKOFF, DEFAULT_CLASS,
--   DEFAULT_LANE, DEFAULT_MAX, DEFAULT_TENANT, DEFAULT_TO, FENCE, FLEET,
--   IDEM, LEASES, MEMO_MAX, PRIO_SPAN, STATS, TASKS, TERMINAL, THR, THRW, TLIMITS, WEIGHTS, WORKERS,
--   any, arg, chunked, class_table, error_type, ev_key, int, job_key, keep_large, lane_key,
--   log_event, memoised, now_arg, now_ms, num, order_score, places, prefix, read, read_whole,
--   sharded, slots_of, tenant_weight, usual_cost_key, wake}

local core = {}

do
  local FENCE, LEASES, STATS, IDEM, DEAD, WORKERS, TASKS, WEIGHTS = 1, 2, 3, 4, 5, 6, 7, 8
  local FLEET, TLIMITS, THR, THRW = 9, 10, 11, 12
  local TERMINAL = {completed = true, failed = true, cancelled = true, expired = true}
  -- priorities are clamped to +-PRIO_LIMIT so that prio * 2^40 + seq stays exact in a double
  local PRIO_SPAN = 1099511627776
  local DEFAULT_CLASS = '__DEFAULT_CLASS__'
  -- A record leaves out (store layout 3) a tenant, lane, attempt budget and timeout at
  -- these values, its class at DEFAULT_CLASS and `run` when it equals `enq`: a waiting
  -- job's hash is then small enough for a smaller allocation (fairlane/store/keys.py,
  -- RECORD_DEFAULTS, says the same)
  core.DEFAULT_TENANT = '__DEFAULT_TENANT__'
  core.DEFAULT_LANE = '__DEFAULT_LANE__'
  core.DEFAULT_MAX = '__DEFAULT_MAX__'
  core.DEFAULT_TO = '__DEFAULT_TO__'

  -- What a job record's fields read as when enqueue left them out at their defaults
  -- (fairlane/store/keys.py, JOB_FIELDS, says the same): prio 0,
  -- att 0, sl 1, bo the default backoff, rc and rf the default retention
  -- (records.DEFAULT_RETENTION), ck the usual cost key, x none.
  core.DEFAULT_BACKOFF = '__DEFAULT_BACKOFF__'

  -- The cost key a job has unless its estimate names a workflow or a model
  -- (fairlane.store.keys.cost_key_name, its separator written in): left out of its record.
  local COST_KEY_SEP = '__COST_KEY_SEP__'

  function core.usual_cost_key(tenant, task)
    return tenant .. COST_KEY_SEP .. task .. COST_KEY_SEP
  end

  local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end

  -- The app's prefix: KEYS[FENCE] less the fence key's own name (keys.py's, written in
  -- by library.py), so that the prefix never hangs on how long that name is.
  local FENCE_NAME = '__FENCE_NAME__'

  local function prefix(keys)
    local k = keys[FENCE]
    return string.sub(k, 1, #k - #FENCE_NAME)
  end

  local function lane_key(p, lane, what)
    return p .. 'lane:' .. lane .. ':' .. what
  end

  local function job_key(p, id)
    return p .. 'job:' .. id
  end

  -- A job's lifecycle events (ev:<id>): a list of msgpack [ms, kind, detail], kept to the
  -- last EVENT_CAP entries and deleted with the record. Only what the record cannot tell
  -- is logged (fairlane/insight/explain.py rebuilds submission, start and end from enq, start,
  -- wk, att, fin, st and err), so a job accepted, dispatched and completed logs nothing.
  -- One RPUSH per event; the list is trimmed only when it outgrows the cap.
  local EVENT_CAP = 64

  local function ev_key(p, id)
    return p .. 'ev:' .. id
  end

  local function log_event(p, id, now, kind, detail)
    local k = ev_key(p, id)
    if redis.call('RPUSH', k, cmsgpack.pack({now, kind, detail or {}})) > EVENT_CAP then
      redis.call('LTRIM', k, -EVENT_CAP, -1)
    end
  end

  -- The type of an error JSON ('{"type":"X",...}'), for events; '' when it has none.
  local function error_type(err)
    return err and string.match(err, '"type"%s*:%s*"([^"]*)"') or ''
  end

  -- The hot path's helpers (fairqueue.lua, records.lua, lease.lua, dispatch.lua). A command
  -- takes at most ARGS arguments from one unpack (Lua's own limit is near 8000).
  core.ARGS = 4000

  -- `cmd` with `key` (nil for none) and the arguments in `list`, in as many commands as
  -- Lua's unpack needs (ARGS arguments each).
  function core.chunked(cmd, key, list)
    for i = 1, #list, core.ARGS do
      local last = math.min(#list, i + core.ARGS - 1)
      if key then
        redis.call(cmd, key, unpack(list, i, last))
      else
        redis.call(cmd, unpack(list, i, last))
      end
    end
  end

  -- A whole number as a command argument ('%d'; anything else is passed on as it is, and
  -- Redis writes it with '%.17g').
  function core.int(n)
    if type(n) == 'number' and n == math.floor(n) and n > -9e15 and n < 9e15 then
      return string.format('%d', n)
    end
    return n
  end

  -- The server time `now` as an argument, formatted once per call.
  function core.now_arg(now)
    if core.now ~= now then
      core.now, core.now_s = now, string.format('%d', now)
    end
    return core.now_s
  end

  -- Memoised checks and parses, by value: most of a record's fields repeat from job to
  -- job (its task, tenant, class, backoff, budget, timeout, width, keys), so each
  -- distinct value is parsed once rather than once per job. A memo is emptied when it
  -- outgrows MEMO_MAX.
  core.MEMO_MAX = 4096

  function core.memoised(check)
    local seen, n = {}, 0
    return function(v)
      if v == nil or v ~= v then
        return check(v)
      end
      local r = seen[v]
      if r == nil then
        r = check(v)
        if n >= core.MEMO_MAX then
          seen, n = {}, 0
        end
        seen[v], n = r, n + 1
      end
      return r
    end
  end

  -- a repeating field's number, false when it is none
  core.num = core.memoised(function(v) return tonumber(v) or false end)
  -- Whether `p` is the prefix of one shard of an app of several (fairlane/store/keys.py,
  -- SHARDED_PREFIX_PATTERN, written in by the library): a pattern match, asked for by
  -- every single-job enqueue, answered once per prefix.
  core.sharded = core.memoised(function(p) return string.find(p, '__SHARDED_PREFIX__') ~= nil end)
  -- A lane's class table from its declared JSON, decoded once per distinct value: the
  -- library's state outlives a call, and decoding cost a call of one job (an enqueue, a
  -- hand-off) a tenth of its server time. Nothing writes into a decoded table; a
  -- declaration that changes it is a new value.
  core.class_table = core.memoised(function(raw) return cjson.decode(raw) end)
  -- a repeating number as a command argument (a job's budget, timeout, width, charge...):
  -- formatting costs about as much as Redis's own, so only a value seen before is a gain
  core.arg = core.memoised(core.int)

  -- The fields some records have and most do not (a deadline, keys, a trace context, a
  -- parent, an idempotency key, a reservation, a throttle grant or offers, a waiter, a
  -- run's keys) are read only from a record that may hold one: a field a listpack hash
  -- does not hold costs a scan of the whole record, and these were most of what the hot
  -- path looked for. Whoever writes one of them sets `x` to '1' in the same command; a
  -- record without `x` (or with '') holds none. `x` may instead be ACK_NONE: the record
  -- holds optional fields, none of them one an ack reads (an enqueue that wrote a job's
  -- keys or fairness key alone writes it; a throttle grant, which a keyed job's lease
  -- adds, the ack reads with the common fields). `common` ends with 'x'; the result
  -- holds the common fields in their places and the optional ones after them (nil when
  -- absent). pcall: a key of the wrong type reads as no record.
  core.ACK_NONE = '-'
  function core.read(key, common, optional)
    local f = redis.pcall('HMGET', key, unpack(common))
    if f.err then
      return {}
    end
    local n = #common
    local x = f[n]
    f[n] = nil
    if x == '1' then
      local o = redis.pcall('HMGET', key, unpack(optional))
      for i = 1, #optional do
        f[n - 1 + i] = not o.err and o[i] or nil
      end
    end
    return f
  end

  -- A record as dispatch reads it to lease the job: whole, in one HGETALL, each field
  -- it asks for put in its place (`places`, core.places), the rest let go. The fields a
  -- record leaves out (its defaults, and those few records hold) cost nothing here, where
  -- an HMGET walked a small record's listpack to its end for each one absent: most of a
  -- plain job's read, and all of a keyed job's second one (`x` set). A lease sends the
  -- args on, so reading them costs no copy the job does not need; an ack does not, and
  -- keeps core.read (a record of large args is a hash table to the server, where HMGET
  -- finds a field in one step and HGETALL would copy the args for nothing). Absent
  -- fields are nil. The optional fields are those in places `first` to `mark - 1`, `x`
  -- in place `mark`: as core.read does, a record whose `x` says it holds none is read as
  -- holding none (a field written into it by anything but the library is not read).
  -- pcall: a key of the wrong type reads as no record.
  function core.read_whole(key, places, first, mark)
    local r = redis.pcall('HGETALL', key)
    if r.err then
      return {}
    end
    -- sized for the longest list read (leasing.RUNNABLE), so that no place set below
    -- grows the table
    local f = {nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
    local optional = false
    for i = 1, #r, 2 do
      local at = places[r[i]]
      if at then
        f[at] = r[i + 1]
        optional = optional or at >= first
      end
    end
    if optional and (not f[mark] or f[mark] == '') then
      for i = first, mark do
        f[i] = nil
      end
    end
    return f
  end

  -- The fields a reader of core.read_whole asks for, in their places: name -> place.
  -- A numeric loop: it runs as the library loads, where `ipairs` is not yet a global.
  function core.places(names)
    local at = {}
    for i = 1, #names do
      at[names[i]] = i
    end
    return at
  end

  -- Whether a hash of tenant settings (weights, concurrency limits) holds any entry, asked
  -- once per call (`fx`: the call's effects, records.lua): most apps set none, and asking
  -- for each tenant would cost a command per job.
  function core.any(fx, key)
    local v = fx.any[key]
    if v == nil then
      v = redis.call('EXISTS', key) == 1
      fx.any[key] = v
    end
    return v
  end

  -- A name no tenant, job or key can have (names are UTF-8, where byte 255 never occurs),
  -- longer than the server keeps in a compact encoding (64 bytes by default). Made at
  -- first use: a library's load has no string functions.
  local LARGE_MEMBER = false

  -- A sorted set or hash of up to 128 entries is a listpack to the server, where finding
  -- a field, or a sorted set member's place, walks the entries from the head (parsing a
  -- fractional score from text at each one): O(n) a lookup, and a field that is absent
  -- walks them all. For a key the hot path reads and writes per job while it holds many
  -- entries (a class's fair set, the throttle keys' hash) that walk was most of a call's
  -- server time. A member too long for a listpack, added and removed at once, converts the
  -- key to its large encoding (skiplist, hash table: O(log n) or O(1) a lookup), which the
  -- server keeps until the key is deleted, so a key is converted once in its life. Asked
  -- once per call and key (`fx`: the call's effects, records.lua).
  function core.keep_large(fx, key, zset)
    if fx.large[key] then
      return
    end
    fx.large[key] = true
    if redis.call('OBJECT', 'ENCODING', key) ~= 'listpack' then
      return
    end
    LARGE_MEMBER = LARGE_MEMBER or string.rep('\255', 256)
    if zset then
      redis.call('ZADD', key, 0, LARGE_MEMBER)
      redis.call('ZREM', key, LARGE_MEMBER)
    else
      redis.call('HSET', key, LARGE_MEMBER, '')
      redis.call('HDEL', key, LARGE_MEMBER)
    end
  end

  -- A tenant's fair-share weight (KEYS[WEIGHTS], set by control.lua's configure): 1 when
  -- none is set, and no read at all in a call whose app sets none (`core.any`).
  function core.tenant_weight(fx, keys, tenant)
    return core.any(fx, keys[WEIGHTS]) and tonumber(redis.call('HGET', keys[WEIGHTS], tenant)) or 1
  end

  -- A job's width in slots from its record's `sl`: enqueue writes a whole number >= 1,
  -- so anything else is damage, read as the default width that enqueue counted it at;
  -- the waiting and in-flight counts then return to where they were before the job.
  local function slots_of(raw)
    local n = core.num(raw)
    if n and n >= 1 and n % 1 == 0 then
      return n
    end
    return 1
  end

  -- (an absent priority is 0: enqueue leaves the default out of the record)
  local function order_score(prio, seq)
    return -(tonumber(prio) or 0) * PRIO_SPAN + tonumber(seq)
  end

  local function wake(p, lane)
    local wk = lane_key(p, lane, 'wake')
    if redis.call('LLEN', wk) == 0 then
      redis.call('LPUSH', wk, '1')
    end
  end

  -- Functions that free memory, or must run for a full store to be drained, run on a
  -- server at its maxmemory (fairlane.lua registers them with these flags).
  core.ALLOW_OOM = {'allow-oom'}

  core.DEAD = DEAD
  core.DEFAULT_CLASS = DEFAULT_CLASS
  core.FENCE = FENCE
  core.FLEET = FLEET
  core.IDEM = IDEM
  core.LEASES = LEASES
  core.PRIO_SPAN = PRIO_SPAN
  core.STATS = STATS
  core.TASKS = TASKS
  core.TERMINAL = TERMINAL
  core.THR = THR
  core.THRW = THRW
  core.TLIMITS = TLIMITS
  core.WEIGHTS = WEIGHTS
  core.WORKERS = WORKERS
  core.error_type = error_type
  core.ev_key = ev_key
  core.job_key = job_key
  core.lane_key = lane_key
  core.log_event = log_event
  core.now_ms = now_ms
  core.order_score = order_score
  core.prefix = prefix
  core.slots_of = slots_of
  core.wake = wake
end
