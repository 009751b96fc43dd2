---------------------------------------------------------------------------- tenant sweep
--
-- Keys: every per-tenant key and field its rows name (TENANT_SWEEP.rows), found by SCAN
--   and HSCAN under the app's prefix
-- Calls: core, throttle, admission
-- Entry points: tenant_sweep

-- What tenants leave behind, removed once it carries no information or has been idle
-- for the app's `tenants.idle_ttl` (fairlane/policy/tenantstate.py states each rule and
-- why it changes no decision; this is its twin). One pass walks the app's keys with a
-- cursor (SCAN under the prefix) and, in the hashes that hold per-tenant fields, those
-- fields (HSCAN), at most about `limit` keys and fields a pass, like the lease sweep.
--
-- TENANT_SWEEP.rows is the one table of what is swept: a key pattern (after the app's
-- prefix, from fairlane/store/keys.py) and how its state goes --
--   kind 'key':    the whole key, `expired(ctx, key)` true deletes it;
--   kind 'fields': its fields, `open(ctx, key)` reads what the rule needs once per visit
--                  and `field(ctx, view, name, value)` true deletes the field.
-- A new kind of per-tenant state is one more row. Everything is built inside one
-- function that returns the entry point, so that this file adds no local to the
-- library's main chunk. It deletes, so it runs on a server at its maxmemory
-- (core.ALLOW_OOM).
redis.register_function{function_name = '__PREFIX__tenant_sweep', flags = core.ALLOW_OOM,
  callback = (function()
  local now_ms, prefix = core.now_ms, core.prefix
  local RATE_BUCKETS, RATE_WIDTH_MS = throttle.RATE_BUCKETS, throttle.RATE_WIDTH_MS
  local REJECT_WINDOW_MS = admission.REJECT_WINDOW_MS
  local TENANT_SWEEP = {}

  -- How long the key has surely been idle, in ms, by the server's own clock (reads and
  -- writes reset it; SCAN and OBJECT do not, and the sweep reads no key it judges by this
  -- clock), or nil under an LFU maxmemory-policy, which keeps no such clock: the idle
  -- rules then wait. The clock ticks in whole seconds, so a key touched just before a
  -- tick already reads 1: a second less is what is certain.
  function TENANT_SWEEP.idle_ms(ctx, key)
    local v = redis.pcall('OBJECT', 'IDLETIME', key)
    if type(v) ~= 'number' then
      ctx.clock = false
      return nil
    end
    return math.max(0, v - 1) * 1000
  end

  -- A class's `vt` and `seen` keys from either one's name: they share `lane:<l>:c:<c>:`.
  function TENANT_SWEEP.class_base(key)
    return string.match(key, '^(.*:)[^:]+$')
  end

  -- A finish tag's first sighting, 'tag|ms', as the sweep wrote it in the class's `seen`.
  function TENANT_SWEEP.mark(raw)
    if not raw then
      return nil, nil
    end
    local tag, ms = string.match(raw, '^(.*)|(%d+)$')
    return tag, tonumber(ms)
  end

  TENANT_SWEEP.rows = {
    -- learned costs: forgotten once nothing read or wrote them for idle_ttl (key_forgotten)
    {'^cost:', kind = 'key', expired = function(ctx, key)
      local idle = TENANT_SWEEP.idle_ms(ctx, key)
      return idle ~= nil and idle >= ctx.ttl
    end},
    -- a tenant's learned lengths: forgotten, like its learned costs, once nothing read
    -- or wrote them for idle_ttl (key_forgotten); relearned from its next attempts
    {'^dur:', kind = 'key', expired = function(ctx, key)
      local idle = TENANT_SWEEP.idle_ms(ctx, key)
      return idle ~= nil and idle >= ctx.ttl
    end},
    -- signals: after idle_ttl and the rate window, every bucket is out of the window and
    -- the mean duration is forgotten (signals_forgotten)
    {'^sig:', kind = 'key', expired = function(ctx, key)
      local idle = TENANT_SWEEP.idle_ms(ctx, key)
      return idle ~= nil and idle >= math.max(ctx.ttl, RATE_BUCKETS * RATE_WIDTH_MS)
    end},
    -- idle tenants' finish tags f:<t>: gone when at or below V - run, the least start an
    -- activation can be given with that work in flight (finish_tag_removable), or when
    -- seen unchanged for idle_ttl (finish_tag_forgotten)
    {'^lane:[^:]+:c:[^:]+:vt$', kind = 'fields', open = function(ctx, key)
      local v = redis.call('HMGET', key, 'V', 'run')
      local bar = (tonumber(v[1]) or 0) - math.max(0, tonumber(v[2]) or 0)
      return {bar = bar, seen = TENANT_SWEEP.class_base(key) .. 'seen'}
    end, field = function(ctx, view, name, value)
      if string.sub(name, 1, 2) ~= 'f:' then
        return false
      end
      local tenant, tag = string.sub(name, 3), tonumber(value)
      -- a tag that does not parse reads as none at activation
      local gone = not tag or tag <= view.bar
      if not gone then
        local seen, since = TENANT_SWEEP.mark(redis.call('HGET', view.seen, tenant))
        if seen == value then
          gone = ctx.now - since >= ctx.ttl
        else
          redis.call('HSET', view.seen, tenant, value .. '|' .. ctx.now)
        end
      end
      if gone then
        redis.call('HDEL', view.seen, tenant)
      end
      return gone
    end},
    -- the sweep's own first sightings: dropped once their tag is gone or has changed
    {'^lane:[^:]+:c:[^:]+:seen$', kind = 'fields', open = function(ctx, key)
      return {vt = TENANT_SWEEP.class_base(key) .. 'vt'}
    end, field = function(ctx, view, tenant, raw)
      local seen = TENANT_SWEEP.mark(raw)
      return seen == nil or redis.call('HGET', view.vt, 'f:' .. tenant) ~= seen
    end},
    -- rejection counters 'count|window start' whose window has passed (rejection_expired)
    {'^lane:[^:]+:adm:rej$', kind = 'fields', field = function(ctx, view, tenant, value)
      local start = tonumber(string.match(value, '|(%d+)$'))
      return not (start and ctx.now - start < REJECT_WINDOW_MS)
    end},
    -- admitted jobs and reserved units of '<class>|<tenant>' at 0 (counter_empty)
    {'^lane:[^:]+:adm:tu?$', kind = 'fields', field = function(ctx, view, name, value)
      return tonumber(value) == 0
    end},
  }

  function TENANT_SWEEP.row_of(suffix)
    for _, row in ipairs(TENANT_SWEEP.rows) do
      if string.find(suffix, row[1]) then
        return row
      end
    end
    return nil
  end

  -- One HSCAN step over a hash of per-tenant fields; returns the hash's next cursor.
  function TENANT_SWEEP.fields(ctx, row, key, cursor)
    local view = row.open and row.open(ctx, key) or {}
    local r = redis.call('HSCAN', key, cursor, 'COUNT', math.max(ctx.left, 1))
    local flat, doomed = r[2], {}
    for i = 1, #flat, 2 do
      if row.field(ctx, view, flat[i], flat[i + 1]) then
        doomed[#doomed + 1] = flat[i]
      end
    end
    ctx.left = ctx.left - #flat / 2
    ctx.examined = ctx.examined + #flat / 2
    for i = 1, #doomed, 500 do
      redis.call('HDEL', key, unpack(doomed, i, math.min(i + 499, #doomed)))
    end
    ctx.removed = ctx.removed + #doomed
    if r[1] == '0' then
      TENANT_SWEEP.compact(key)
    end
    return r[1]
  end

  -- A hash that held many tenants' fields keeps its large table after they are deleted
  -- (servers before Redis 7.4 do not shrink a hash's table on HDEL): once few fields are
  -- left, it is written anew, the same fields and values, in a table of their size (the
  -- server's compact encoding at the default limits). A hash with a TTL is left as it is.
  TENANT_SWEEP.COMPACT_AT = 64

  function TENANT_SWEEP.compact(key)
    if redis.call('OBJECT', 'ENCODING', key) ~= 'hashtable'
        or redis.call('HLEN', key) > TENANT_SWEEP.COMPACT_AT
        or redis.call('PTTL', key) ~= -1 then
      return
    end
    local flat = redis.call('HGETALL', key)
    redis.call('DEL', key)
    redis.call('HSET', key, unpack(flat))
  end

  -- ARGV: cursor ('0' starts a cycle), limit, idle_ttl_ms. Returns {cursor ('0' once the
  -- cycle has visited every key), keys and fields examined, removed, 1 when the server
  -- keeps key idle times (0: an LFU policy; learned costs and signals then stay)}.
  function TENANT_SWEEP.run(keys, args)
    local p = prefix(keys)
    local ctx = {now = now_ms(), ttl = tonumber(args[TenantSweepArg.IDLE_TTL_MS]), left = tonumber(args[TenantSweepArg.LIMIT]),
      examined = 0, removed = 0, clock = true}
    local state = {s = '0', h = {}}
    if args[TenantSweepArg.CURSOR] ~= '0' then
      state = cjson.decode(args[TenantSweepArg.CURSOR])
    end
    -- hashes whose field scan an earlier pass left unfinished come first
    local open = {}
    for _, pending in ipairs(state.h) do
      local row = TENANT_SWEEP.row_of(pending[1])
      local cursor = pending[2]
      if ctx.left > 0 and row then
        cursor = TENANT_SWEEP.fields(ctx, row, p .. pending[1], cursor)
      end
      if row and cursor ~= '0' then
        open[#open + 1] = {pending[1], cursor}
      end
    end
    if #open == 0 and ctx.left > 0 and not state.e then
      local glob = string.gsub(p, '[%*%?%[%]\\]', '\\%0') .. '*'
      local r = redis.call('SCAN', state.s, 'MATCH', glob, 'COUNT', ctx.left)
      state.s, state.e = r[1], r[1] == '0'
      local doomed = {}
      for _, key in ipairs(r[2]) do
        local suffix = string.sub(key, #p + 1)
        local row = TENANT_SWEEP.row_of(suffix)
        ctx.left, ctx.examined = ctx.left - 1, ctx.examined + 1
        if row and row.kind == 'key' then
          if row.expired(ctx, key) then
            doomed[#doomed + 1] = key
          end
        elseif row then
          local cursor = TENANT_SWEEP.fields(ctx, row, key, '0')
          if cursor ~= '0' then
            open[#open + 1] = {suffix, cursor}
          end
        end
      end
      for i = 1, #doomed, 500 do
        redis.call('DEL', unpack(doomed, i, math.min(i + 499, #doomed)))
      end
      ctx.removed = ctx.removed + #doomed
    end
    state.h = open
    local cursor = '0'
    if #open > 0 or not state.e then
      cursor = cjson.encode(state)
    end
    return {cursor, ctx.examined, ctx.removed, ctx.clock and 1 or 0}
  end

  return TENANT_SWEEP.run
end)()}
