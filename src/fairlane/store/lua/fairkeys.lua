-- Fairness keys: the order number a keyed job takes in its tenant's queue, so that a
-- tenant's keys (its end users) share its part fairly (fairlane/policy/fairkeys.py states
-- the rule, its scale against the FIFO numbers and its bound). Dispatch is unchanged.
-- Called where a keyed job first enters its tenant's queue: enqueue.lua (due and
-- admitted), lease.lua's promote_due (scheduled, attempt 0) and records.lua's
-- readmit_class (admitted from the deferred queue); never for a retry.
--
-- A deadline-ordered job (deadlineorder.lua) is never tagged: its deadline places it.
--
-- Keys: fk:<lane>:<class>:<tenant>, fkw:<tenant>; reads q:<lane>:<class>:<tenant>
-- Calls: deadlineorder, fairqueue
-- Entry points: fairkeys.{order, tags_key, weights_key}

-- Per tenant queue, `fk:<lane>:<class>:<tenant>` (zset key -> start tag of the key's next
-- job); per tenant, `fkw:<tenant>` (hash key -> weight, absent = 1).
local fairkeys = {}

do
  local ordered, present_order = deadlineorder.ordered, deadlineorder.present_order
  local tenant_queue = fairqueue.tenant_queue

  function fairkeys.tags_key(p, lane, cls, tenant)
    return p .. 'fk:' .. lane .. ':' .. cls .. ':' .. tenant
  end

  function fairkeys.weights_key(p, tenant)
    return p .. 'fkw:' .. tenant
  end

  -- Rule 1: the present is the head's order number (its score less the priority; the
  -- first job that is not deadline-ordered), or the job's own FIFO number when there is
  -- none (every tag is dropped then: a drained queue has nothing left to be fair about);
  -- tags at or below the head carry nothing and are dropped too. The job takes
  -- max(F_k, present), and F_k moves on by 1 / w_k. A deadline order `seq` is kept.
  function fairkeys.order(p, lane, cls, tenant, key, seq)
    if ordered(seq) then
      return seq
    end
    local fk = fairkeys.tags_key(p, lane, cls, tenant)
    local present = present_order(tenant_queue(p, lane, cls, tenant))
    if not present then
      redis.call('DEL', fk)
      present = seq
    else
      redis.call('ZREMRANGEBYSCORE', fk, '-inf', present)
    end
    local tag = tonumber(redis.call('ZSCORE', fk, key))
    if not tag or tag <= present then
      tag = present
    end
    local w = tonumber(redis.call('HGET', fairkeys.weights_key(p, tenant), key)) or 1
    redis.call('ZADD', fk, tag + 1 / w, key)
    return tag
  end
end
