-- Service classes: which class of a lane may start its head job now
-- (fairlane/policy/classes.py states the rules and proves them; this is its twin).
-- A table is an array of classes, each {name, nominal_share, min_slots, lendable,
-- borrowable (-1 = up to C), batch (0/1), max_wait ms (-1 or absent = never ages),
-- restricted (1: only entitled tenants may use it; absent = 0, enqueue.lua)}, in declared
-- order (tables written before max_wait have six fields: none ages).
--
-- Keys: tclasses, KEYS[TLIMITS] (asked with tclasses in one EXISTS); a lane's class table
--   in the state hash its callers name
-- Calls: core
-- Entry points: classes.{CLASS_EPS, DEFAULT_CLASSES, any_entitled, choose_class,
--   class_index, class_levels, class_table, entitlement, floor_eps, may_use,
--   tenant_class}

local classes = {}

do
  local TLIMITS = core.TLIMITS

  local CLASS_EPS = 1e-9
  local DEFAULT_CLASSES = [=[__DEFAULT_CLASSES__]=]

  local function floor_eps(x)
    return math.floor(x + CLASS_EPS)
  end

  -- The class table of a lane (its declared JSON, or the defaults).
  local function class_table(state_key)
    return core.class_table(redis.call('HGET', state_key, 'table') or DEFAULT_CLASSES)
  end

  local function class_index(tbl, name)
    -- a numeric loop: ipairs costs a C call per row, and this runs for every job
    for i = 1, #tbl do
      if tbl[i][ClassRow.NAME] == name then
        return i
      end
    end
    return nil
  end

  -- The levels of every class at capacity `cap` (they depend on nothing else, so a
  -- dispatch computes them once): assured a, lendable L, ceiling, max width, batch.
  local function compute_levels(tbl, cap)
    local lv = {n = #tbl, cap = cap, a = {}, lend = {}, ceiling = {}, widest = {}, batch = {},
      max_wait = {}, ages = false, claim = {}, order = {}}
    local sum_a, sum_lend = 0, 0
    for i, c in ipairs(tbl) do
      local nominal = floor_eps(c[ClassRow.SHARE] * cap)
      local a = math.max(c[ClassRow.MIN_SLOTS], nominal)
      lv.a[i], lv.lend[i], lv.batch[i] = a, floor_eps(c[ClassRow.LENDABLE] * a), c[ClassRow.BATCH] == 1
      lv.ceiling[i] = cap
      -- a trailing max_wait: older tables have none, and cjson reads JSON null as a value
      local mw = tonumber(c[ClassRow.MAX_WAIT])
      if mw and mw >= 0 then
        lv.max_wait[i], lv.ages = mw, true
      end
      if c[ClassRow.BORROWABLE] >= 0 then
        lv.ceiling[i] = math.min(cap, a + floor_eps(c[ClassRow.BORROWABLE] * nominal))
      end
      sum_a, sum_lend = sum_a + a, sum_lend + lv.lend[i]
    end
    local reserves = sum_a - sum_lend
    for i = 1, lv.n do
      local a = lv.a[i]
      lv.widest[i] = math.max(math.min(a, cap), math.min(lv.ceiling[i], cap - reserves + a - lv.lend[i]))
    end
    return lv
  end

  -- class_levels, kept per decoded table (core.class_table memoises them) and capacity:
  -- every dispatch of a lane whose capacity has not changed asks for the same levels,
  -- and a call of one job paid for computing them in full. Nothing writes into them but
  -- choose_plain's scratch tables (claim, order), which it fills before it reads.
  local levels_of = core.memoised(function(tbl)
    return core.memoised(function(cap) return compute_levels(tbl, cap) end)
  end)
  local function class_levels(tbl, cap)
    return levels_of(tbl)(cap)
  end

  -- Rank: non-batch before batch, then lowest f / a (a = 0 after the others, by f),
  -- then declared order.
  local function rank_before(lv, f, x, y)
    if lv.batch[x] ~= lv.batch[y] then
      return not lv.batch[x]
    end
    local ax, ay = lv.a[x], lv.a[y]
    if (ax == 0) ~= (ay == 0) then
      return ax ~= 0
    end
    local lx, ly
    if ax == 0 then
      lx, ly = f[x], f[y]
    else
      lx, ly = f[x] * ay, f[y] * ax
    end
    if lx ~= ly then
      return lx < ly
    end
    return x < y
  end

  local function judge(w, f, a, ceiling, widest, free, spare)
    if not w then
      return 'idle'
    end
    if w > widest then
      return 'too-wide'
    end
    if f + w <= a then
      return w <= free and 'assured' or 'no-slots'
    end
    if f + w > ceiling then
      return 'ceiling'
    end
    if w > free then
      return 'no-slots'
    end
    return w <= spare and 'borrow' or 'no-spare'
  end

  local BLOCKED = {['no-slots'] = true, ['no-spare'] = true, held = true}

  -- What a class claims of the free slots: max(0, min(a, max(f + owed, kept)) - f), kept
  -- = a - lend.
  local function class_claim(a, kept, f, owed)
    local c = f + owed
    if kept > c then
      c = kept
    end
    if a < c then
      c = a
    end
    c = c - f
    if c < 0 then
      return 0
    end
    return c
  end

  -- The rules of policy/classes.py but aging (A1-A3), on the state as given. It runs for
  -- every job dispatched, so it is written out without the math library (each call of a
  -- library function costs the interpreter many times what a comparison does) and reuses
  -- the levels' scratch tables.
  local function choose_plain(lv, f, w, d)
    local n, cap, assured, widest, lend = lv.n, lv.cap, lv.a, lv.widest, lv.lend
    local claim, order = lv.claim, lv.order
    local sum_f, claimed = 0, 0
    for i = 1, n do
      local a, fi, wi = assured[i], f[i], w[i]
      sum_f = sum_f + fi
      local owed = 0
      if wi then
        local room = widest[i]
        if a < room then
          room = a
        end
        if fi + wi <= room then
          owed = d[i]
          if wi > owed then
            owed = wi
          end
        end
      end
      local c = class_claim(a, a - lend[i], fi, owed)
      claim[i] = c
      claimed = claimed + c
      -- insertion sort: a lane has a handful of classes
      local j = i - 1
      while j > 0 and rank_before(lv, f, i, order[j]) do
        order[j + 1] = order[j]
        j = j - 1
      end
      order[j + 1] = i
    end
    local free = cap - sum_f
    if free < 0 then
      free = 0
    end
    -- the first class in rank order that may start is the one served, so a batch class
    -- is only reached when no better-ranked class may start (P5): no 'yield' check needed
    local held = false
    for k = 1, n do
      local i = order[k]
      local spare = free - (claimed - claim[i])
      local why = judge(w[i], f[i], assured[i], lv.ceiling[i], widest[i], free, spare)
      if why == 'borrow' and held then
        why = 'held'
      end
      if why == 'assured' or why == 'borrow' then
        return i
      end
      held = held or BLOCKED[why] == true
    end
    return nil
  end

  -- The class whose head is the only one waiting, nil when none or several are.
  local function lone_head(n, w)
    local x = nil
    for i = 1, n do
      if w[i] then
        if x then
          return nil
        end
        x = i
      end
    end
    return x
  end

  -- choose_plain when class x alone has a head, the common case of a dispatch run: the
  -- other classes judge 'idle', which neither serves nor holds anything back, so the
  -- rank order does not matter and x starts exactly when its own judgement is 'assured'
  -- or 'borrow' against the same free slots and spare (an idle class owes nothing).
  local function choose_lone(lv, f, w, d, x)
    local assured, lend = lv.a, lv.lend
    local sum_f, others = 0, 0
    for i = 1, lv.n do
      local fi = f[i]
      sum_f = sum_f + fi
      if i ~= x then
        others = others + class_claim(assured[i], assured[i] - lend[i], fi, 0)
      end
    end
    local free = lv.cap - sum_f
    if free < 0 then
      free = 0
    end
    local why = judge(w[x], f[x], assured[x], lv.ceiling[x], lv.widest[x], free, free - others)
    if why == 'assured' or why == 'borrow' then
      return x
    end
    return nil
  end

  -- The lane state with aged heads moved up one class (policy/classes.py, rules A1-A2):
  -- copies of f, w, d, and host[u] = i where class u's place holds class i's head.
  local function move_aged(lv, f, w, d, ages)
    local f2, w2, d2, host, went_up = {}, {}, {}, {}, {}
    for i = 1, lv.n do
      f2[i], w2[i], d2[i] = f[i], w[i], w[i] and math.max(d[i], w[i]) or 0
    end
    for i = 2, lv.n do
      local limit, u, wi, age = lv.max_wait[i], i - 1, w2[i], ages[i] or 0
      if limit and wi and age > limit and not went_up[u]
        and not (w2[u] and (ages[u] or 0) >= age)
        and wi <= lv.widest[u] and f2[u] + f2[i] + wi <= lv.ceiling[u] then
        f2[u], f2[i] = f2[u] + f2[i], 0
        d2[u] = d2[u] + wi
        w2[u], w2[i], d2[i] = wi, nil, 0
        went_up[i], host[u] = true, i
      end
    end
    return f2, w2, d2, host
  end

  -- The index of the class whose head should start, or nil, given the levels `lv`,
  -- `f[i]` slots in flight, `w[i]` head width (nil: nothing waits), `d[i]` waiting slots,
  -- and optionally `ages[i]`, the ms class i's head has waited (for classes with max_wait:
  -- an aged head is served as the class above it; without `ages` nothing ages).
  local function choose_class(lv, f, w, d, ages)
    if not (ages and lv.ages) then
      local x = lone_head(lv.n, w)
      if x then
        return choose_lone(lv, f, w, d, x)
      end
      return choose_plain(lv, f, w, d)
    end
    local f2, w2, d2, host = move_aged(lv, f, w, d, ages)
    local x = choose_plain(lv, f2, w2, d2)
    return x and (host[x] or x) or nil
  end

  -- Tenants' class entitlements (tclasses: tenant -> JSON {c = restricted classes it may
  -- use, d = its default class}; fairlane.policy.classes.Entitlement is the rule).

  -- Whether any tenant has an entitlement. Asked with tlimits in one EXISTS: enqueue asks
  -- for tlimits anyway, so an app that sets neither pays one command for both.
  function classes.any_entitled(fx, keys, p)
    local ek = p .. 'tclasses'
    if fx.any[ek] == nil and fx.any[keys[TLIMITS]] == nil
        and redis.call('EXISTS', keys[TLIMITS], ek) == 0 then
      fx.any[ek], fx.any[keys[TLIMITS]] = false, false
    end
    return core.any(fx, ek)
  end

  -- The tenant's entitlement (false: none), read once per call into `seen`.
  function classes.entitlement(fx, keys, p, seen, tenant)
    local ent = seen[tenant]
    if ent == nil then
      local raw = classes.any_entitled(fx, keys, p) and redis.call('HGET', p .. 'tclasses', tenant)
      ent = raw and cjson.decode(raw) or false
      seen[tenant] = ent
    end
    return ent
  end

  -- Whether a tenant of entitlement `ent` may use class row `c` (a row of classes.lua's table).
  function classes.may_use(c, ent)
    if c[ClassRow.RESTRICTED] ~= 1 then
      return true
    end
    for _, name in ipairs(ent and ent.c or {}) do
      if name == c[ClassRow.NAME] then
        return true
      end
    end
    return false
  end

  -- The class a job of `tenant` takes in table `tbl`, and whether the tenant may use it:
  -- the given `cls`, unless nobody named it and the tenant's default class is in the
  -- table and usable; a class the table lacks is left to the caller (-2). A named
  -- unrestricted class costs no command. Third: the class's index in the table (nil: it
  -- lacks it), so that the caller need not look again.
  function classes.tenant_class(fx, keys, p, seen, tbl, tenant, cls, named)
    local i = class_index(tbl, cls)
    if not i or (named and tbl[i][ClassRow.RESTRICTED] ~= 1) then
      return cls, true, i
    end
    local ent = classes.entitlement(fx, keys, p, seen, tenant)
    local d = not named and ent and ent.d
    local di = d and class_index(tbl, d)
    if di and classes.may_use(tbl[di], ent) then
      return d, true, di
    end
    return cls, classes.may_use(tbl[i], ent), i
  end

  classes.CLASS_EPS = CLASS_EPS
  classes.DEFAULT_CLASSES = DEFAULT_CLASSES
  classes.choose_class = choose_class
  classes.class_index = class_index
  classes.class_levels = class_levels
  classes.class_table = class_table
  classes.floor_eps = floor_eps
end
