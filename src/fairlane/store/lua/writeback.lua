-- Write-behind views of hashes, for the worker's hot calls (exchange, ack): the throttle
-- keys' hash and the rate keys' buckets are read once per call and written once at its
-- end, instead of a few commands per job for every key the job names. A keyed job made
-- about 25 commands on these hashes; their values repeat from job to job of one call.
--
-- A view belongs to one call: `behind` opens it for the call's KEYS table and writes it
-- back when the call returns. Every function here takes the caller's KEYS; when they are
-- not the open call's (any other function of the library, a test running a module alone,
-- or a call after one that failed before writing back) it runs the command at once.
-- Within a call nothing else may touch a viewed hash directly: throttle.lua and rates.lua
-- reach them only through here, and nothing else the worker's calls run writes them.
--
-- A value read is the server's string (false for an absent field); a value written in
-- the call reads back as it was given, a number as a number (every caller reads numbers
-- with tonumber), and is written as the server would have written it: a whole number
-- '%d', any other passed on for the server to write in its own way (servers differ).
-- Every operation here costs about what one command from Lua costs when it is the first
-- on its field in the call, and a table lookup after: that, not the commands, is the
-- saving, so values stay as given and are formatted once, when written back.
-- A hash emptied and filled again in one call keeps its expiry, where the server would
-- have dropped it with the hash: no caller empties a hash that expires (rate keys' state
-- is never deleted field by field).
-- Counters nothing reads within a call (`add`, `addf`) are summed and sent as one
-- HINCRBY / HINCRBYFLOAT each, so that the server formats them as it always has.
--
-- Keys: any hash named by its caller (KEYS[THR], rate:<key>)
-- Calls: core
-- Entry points: writeback.{add, addf, behind, del, epoch, exists, fields, get, incr, mget,
--   pexpire, put, set, view_of}

local writeback = {}

do
  -- the KEYS table of the call whose views are open (nil: none)
  local scope = nil
  -- hash -> {v = {field -> value or false}, dirty = {field -> true}, ints, floats, ttl}
  local views = {}
  -- how many writes the call's views have taken through these functions: a caller that
  -- keeps what it derived from a view (keyruns.lua) knows it is still true while this
  -- has not moved since
  local epoch = 0

  local function view(h)
    local v = {v = {}, dirty = {}}
    views[h] = v
    return v
  end

  local function arg(x)
    if type(x) == 'number' and x == math.floor(x) and x > -9e15 and x < 9e15 then
      return string.format('%d', x)
    end
    return x
  end

  -- PEXPIRE as asked in order: an unconditional one sets the time, a 'GT' one may only
  -- raise it; `ttl` keeps what they come to (set: whether any was unconditional).
  local function write_ttl(h, ttl)
    if ttl.set then
      redis.call('PEXPIRE', h, ttl.ms)
    else
      redis.call('PEXPIRE', h, ttl.ms, 'GT')
    end
  end

  local function write_view(h, v)
    local sets, dels = {}, {}
    for f in pairs(v.dirty) do
      local x = v.v[f]
      if x then
        sets[#sets + 1] = f
        sets[#sets + 1] = arg(x)
      else
        dels[#dels + 1] = f
      end
    end
    core.chunked('HSET', h, sets)
    core.chunked('HDEL', h, dels)
    for f, n in pairs(v.ints or {}) do
      redis.call('HINCRBY', h, f, n)
    end
    for f, n in pairs(v.floats or {}) do
      redis.call('HINCRBYFLOAT', h, f, string.format('%.17g', n))
    end
    if v.ttl then
      write_ttl(h, v.ttl)
    end
  end

  local function finish(opened, ...)
    if opened then
      for h, v in pairs(views) do
        write_view(h, v)
      end
      views, scope = {}, nil
    end
    return ...
  end

  -- `fn` (a registered function) with its calls' views open.
  function writeback.behind(fn)
    return function(keys, args)
      local opened = scope ~= keys
      if opened then
        scope, views = keys, {}
      end
      return finish(opened, fn(keys, args))
    end
  end

  -- HMGET of `fields` ({name, ..}): their values, false for an absent one.
  function writeback.mget(keys, h, fields)
    if scope ~= keys then
      return redis.call('HMGET', h, unpack(fields))
    end
    local vv = (views[h] or view(h)).v
    local out, want = {}, nil
    for i, f in ipairs(fields) do
      local x = vv[f]
      if x == nil then
        want = want or {}
        want[#want + 1] = f
      end
      out[i] = x
    end
    if want then
      local got = redis.call('HMGET', h, unpack(want))
      for i, f in ipairs(want) do
        vv[f] = got[i]
      end
      for i, f in ipairs(fields) do
        out[i] = vv[f]
      end
    end
    return out
  end

  function writeback.get(keys, h, f)
    if scope ~= keys then
      return redis.call('HGET', h, f)
    end
    local vv = (views[h] or view(h)).v
    local x = vv[f]
    if x == nil then
      x = redis.call('HGET', h, f)
      vv[f] = x
    end
    return x
  end

  -- HSET of one or two fields.
  function writeback.set(keys, h, f, x, f2, x2)
    if scope ~= keys then
      if f2 then
        return redis.call('HSET', h, f, x, f2, x2)
      end
      return redis.call('HSET', h, f, x)
    end
    epoch = epoch + 1
    local v = views[h] or view(h)
    v.v[f], v.dirty[f] = x, true
    if f2 then
      v.v[f2], v.dirty[f2] = x2, true
    end
  end

  function writeback.del(keys, h, ...)
    if scope ~= keys then
      return redis.call('HDEL', h, ...)
    end
    epoch = epoch + 1
    local v = views[h] or view(h)
    for i = 1, select('#', ...) do
      local f = select(i, ...)
      v.v[f], v.dirty[f] = false, true
    end
  end

  -- HINCRBY whose result the caller reads: the new value.
  function writeback.incr(keys, h, f, n)
    if scope ~= keys then
      return redis.call('HINCRBY', h, f, n)
    end
    epoch = epoch + 1
    local v = views[h] or view(h)
    local x = v.v[f]
    if x == nil then
      x = redis.call('HGET', h, f)
    end
    x = (tonumber(x) or 0) + n
    v.v[f], v.dirty[f] = x, true
    return x
  end

  -- Sum `n` into the counter `f` of `which` ('ints' or 'floats') of h's view.
  local function defer(h, which, f, n)
    epoch = epoch + 1
    local v = views[h] or view(h)
    local sums = v[which] or {}
    v[which] = sums
    sums[f] = (sums[f] or 0) + n
  end

  -- HINCRBY of a counter nothing reads in the call.
  function writeback.add(keys, h, f, n)
    if scope ~= keys then
      redis.call('HINCRBY', h, f, n)
    else
      defer(h, 'ints', f, n)
    end
  end

  -- HINCRBYFLOAT of a counter nothing reads in the call.
  function writeback.addf(keys, h, f, n)
    if scope ~= keys then
      redis.call('HINCRBYFLOAT', h, f, string.format('%.17g', n))
    else
      defer(h, 'floats', f, n)
    end
  end

  -- PEXPIRE h ms, or with `gt` PEXPIRE h ms GT, of a hash the call has written (its
  -- callers expire a rate key's state after writing it); sent after the fields.
  function writeback.pexpire(keys, h, ms, gt)
    if scope ~= keys then
      if gt then
        redis.call('PEXPIRE', h, ms, 'GT')
      else
        redis.call('PEXPIRE', h, ms)
      end
      return
    end
    epoch = epoch + 1
    local v = views[h] or view(h)
    local ttl = v.ttl
    if not gt then
      v.ttl = {set = true, ms = ms}
    elseif not ttl then
      v.ttl = {set = false, ms = ms}
    elseif ms > ttl.ms then
      ttl.ms = ms
    end
  end

  -- The view of hash `h` itself, for a caller that writes it many times in a call
  -- (keyruns.lua's buckets) through `put`: nil out of a call's views.
  function writeback.view_of(keys, h)
    if scope ~= keys then
      return nil
    end
    return views[h] or view(h)
  end

  -- What `set` of two fields, `addf` of one counter and `pexpire` with 'GT' do together,
  -- on a view `view_of` gave: one call for a caller's every write of a step. The epoch
  -- moves once, as for any write.
  function writeback.put(v, f, x, f2, x2, counter, n, ms)
    epoch = epoch + 1
    local vv, dirty = v.v, v.dirty
    vv[f], dirty[f], vv[f2], dirty[f2] = x, true, x2, true
    local sums = v.floats or {}
    v.floats = sums
    sums[counter] = (sums[counter] or 0) + n
    local ttl = v.ttl
    if not ttl then
      v.ttl = {set = false, ms = ms}
    elseif ms > ttl.ms then
      ttl.ms = ms
    end
  end

  -- The call's writes so far (see `epoch`), and the fields of hash `h` and the set of
  -- those written, for a caller that writes them directly (keyruns.lua): nil out of a
  -- call's views.
  function writeback.epoch()
    return epoch
  end

  function writeback.fields(keys, h)
    if scope ~= keys then
      return nil
    end
    local v = views[h] or view(h)
    return v.v, v.dirty
  end

  -- Whether the hash exists: its view is written back first (a rare question: a rate
  -- key's pause or adaptive value).
  function writeback.exists(keys, h)
    if scope == keys and views[h] then
      write_view(h, views[h])
      views[h] = nil
      epoch = epoch + 1
    end
    return redis.call('EXISTS', h) == 1
  end
end
