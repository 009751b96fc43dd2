"""Every Redis key Fairlane uses: its pattern, its type and who writes it.

This module is the single source of truth for key names. Nothing else in the
package spells a key; the Lua library derives the per-job and per-tenant keys
from the namespace prefix it is handed in ``KEYS[1]`` (see below).

An app's keys live under one hash tag per scheduling shard, so that every script
touches a single slot and runs unchanged on Redis Cluster. An app of one shard (the
default) uses the tag ``{fl:<app>}``. An app of ``n > 1`` shards
(``App(shards=n)``) uses ``{fl:<app>:<i>:<k>}`` for shard ``i``: ``k`` is the
smallest number that puts the tag in the ``i``-th of ``n`` equal ranges of the
cluster's 16,384 slots, so that a cluster whose primaries hold contiguous slot
ranges (as ``CLUSTER ADDSLOTSRANGE`` and the usual tools assign them) spreads the
shards evenly over its primaries. Which tenant lives in which shard is the policy's
(``fairlane.policy.shards``); the layout inside a shard is the table below, the
same for every shard. A job's id names its shard (``shard_job_id``), so a job is
found from its id alone; the app's own records (API keys, the payload index of
jobs from no shard) are in shard 0, its home.

Fixed keys are passed to scripts in ``KEYS``. Two families cannot be named before a
script runs, because the script itself decides which job or tenant it touches
(a fetch pops whichever job is next): per-job hashes and per-tenant queues. Scripts
build those from the namespace prefix in ``KEYS[1]``; they always share the
namespace's hash tag, so they hash to the same slot as the declared keys.

=========================  =====  =================================  ========================
pattern (after the prefix)  type   holds                              written by
=========================  =====  =================================  ========================
``fence``                  str    fencing-token counter              fetch
``leases``                 zset   running job id -> expiry (ms)      fetch, renew, ack, sweep
``stats``                  hash   counters; the FIFO ``fifo``;       every script; ``adm:``
                                  admission decisions (see below)    fields: enqueue
``idem``                   hash   idempotency key -> job id          enqueue, retention trim
``dead``                   zset   dead-lettered job id -> time (ms)  ack, sweep, redrive
``workers``                zset   worker id -> heartbeat (ms)        renew, sweep
``gone``                   zset   job id retention removed ->        retention trim
                                  removal ms * 4 + why (0/1: a
                                  completed record, by count/age;
                                  2/3: a failed one); newest 10,000
``beats``                  zset   worker id -> last beat (ms), for   beat, leave, sweep
                                  the workers that beat (a worker
                                  silent past its timeout is dead)
``tasks``                  hash   task -> its retention specs        declare_task
``weights``                hash   tenant -> fair-share weight        configure_tenant
``fleet``                  hash   worker -> 'slots|lane,lane'        exchange, leave, sweep
``tlimits``                hash   tenant -> 'floor,max,bfloor,bpct'  configure_limits
``thr``                    hash   throttle keys: l:/u:/o:/r:/v:<key>  fetch, ack, sweep, cancel
                                  (limit, held, offers, refs, V);
                                  rp:/ad:<key> rate and adaptive
                                  bounds in force; c:<job> its rate
                                  cost (units) while it waits or is
                                  offered slots; w:/p:<job> (offers,
                                  parked); wakes, moves
``thr:wait``               zset   throttle waiters, lex '<key>\0     fetch, ack, sweep, cancel
                                  <tenant>\0<order>\0<job>' (a
                                  range per key and tenant group)
``thr:s:<key>`` (derived)  zset   tenant waiting on key -> start tag fetch, ack, sweep, cancel
``thr:f:<key>`` (derived)  zset   idle tenant -> finish tag (> V)    fetch, ack, sweep, cancel
``rate:<key>`` (derived)   hash   a rate key's bucket ``t`` tokens,  fetch, ack, cancel
                                  ``s`` stamp; ``pu`` paused until,  (rates.lua); expires
                                  ``pc`` cause; ``a`` adaptive value; once full, unpaused and
                                  counters ``ta``/``tr``/``td``       an hour unused
                                  (taken, refunded, debts), ``pn``
                                  pushbacks, ``wn``/``wt`` woken and
                                  ms waited
``rates``                  zset   rate key -> last written (ms)      fetch, ack (views trim)
``gkeys``                  zset   global key this shard has used     fetch (first use), the
                                  (score 0); ``thr`` holds ``gs``    balancer (gk_report,
                                  the app's shard count, ``ge`` the  gk_order); gk_enable
                                  highest epoch seen, ``gf:<key>``   writes ``gs``;
                                  this shard's part of a key; a      declare_admission
                                  pool is ``pool:<lane>``            adds a pool
``gk:epoch``               str    balancer epoch counter (shard 0)   the balancer (INCR)
``gk:lead``                str    the worker running the balancer's  the balancer (SET NX PX)
                                  passes, with an expiry (shard 0)
``ratedue``                zset   rate-blocked key with waiters ->   fetch, ack, cancel
                                  when it is due (ms): the timer
``pause``                  hash   an operator's pauses: scope field   pause, resume, fetch
                                  (``store/pausing.py``) -> end ms    (lifts ended ones)
                                  (0: none; 1: ended, being lifted)
``pause:why``              hash   scope field -> JSON reason, by,     pause, resume
                                  at, until
``pause:lanes``            set    lanes flagged ``P`` in their state  pause, resume
                                  while the shard has any pause
``parked:<field>`` (der.)  zset   a paused task's or key's jobs that  fetch (parks), resume,
                                  came to their class's head -> their cancel
                                  order score (record: ``pz``)
``lane:<l>:c:<c>:held``    set    paused tenants dispatch took out    fetch, resume
                                  of the class's fair set
``dur``                    hash   learned lengths of a shard: a       workers
                                  class's mean slot-ms per job (``c``), (learn_durations); read
                                  a task's mean ms (``k``), a class's by estimate, fetch
                                  use lately (``uc``)                 (deadlines), /autoscale
``dur:<tenant>`` (derived) hash   a tenant's own: its mean slot-ms    workers; forgotten by
                                  per job in a class (``t``), charge  the tenant sweep after
                                  per start (``u``), a task's mean ms idle_ttl
                                  (``k``), use lately (``w``)
                                  (``store/durations.py``)
``trate``                  hash   tenant -> its own rate             configure_rate
                                  'limit,per_ms,burst,units'
``tclasses``               hash   tenant -> its class entitlement:   configure_classes (read
                                  JSON ``{"c": [restricted classes]  by enqueue and by the
                                  it may use, "d": default class}``  promotion of retries)
``gw:keys``                hash   API key id -> its record (tenant,  fairlane tenants (CLI);
                                  SHA-256 of the key, created ms,    the HTTP gateway reads it,
                                  scopes, expires ms: server time)   enqueue_as checks it
``gw:audit``               stream the gateway's decisions that      enqueue_as (submits it
                                  change state: action, key, tenant,  stores); the gateway;
                                  outcome, detail, id (one field set: the key records, with
                                  every entry the same), the entry    each key change
                                  id's ms the server's time; newest   (fairlane.store.audit)
                                  ~100,000 (XADD MAXLEN ~)
``payloads``               zset   '<job id>|<payload name>' -> next  producers, workers (they
                                  check (ms): large payloads kept    offload); the payload
                                  outside the server, removed once   sweep (fairlane.payloads
                                  the job's record is gone           .sweep); no script
``lane:<l>:state``         hash   C, ``f:<c>``/``d:<c>`` in-flight/     exchange, enqueue, fetch,
                                  waiting slots, class ``table``,    ack, sweep, declare_lane,
                                  ``charge`` mode; admission: ``adm``, declare_admission,
                                  ``utable``, ``ar:``/``an:``/``ad:<c>``,
                                  ``gr``/``gn`` refused m-units/jobs
                                  since the balancer's last report
                                  default queue bounds ``qb``        declare_bounds,
                                  ``W:<c>`` waiting weight (active   cancel
                                  tenants' weights, shardshare.py)
``lane:<l>:cap``           hash   worker -> slots (its capacity)     exchange, leave, sweep
``lane:<l>:delayed``       zset   job id -> run-at time (ms)         enqueue, ack, sweep
``lane:<l>:dl``            zset   unfinished job id -> its deadline  enqueue (jobs with a
                                  (ms): only jobs with one; a read   deadline only), finish
                                  checks each one's status           (records.lua), redrive
``lane:<l>:wake``          list   wake tokens; workers BLPOP it      enqueue, fetch, ack
``lane:<l>:idle``          zset   'worker|lease_ms' -> lapses (ms)   exchange, enqueue
``inbox:<w>`` (derived)    list   jobs handed to an idle worker      enqueue; exchange drains
``wj:<w>`` (derived)       set    ids leased to the worker (an id    fetch, enqueue, exchange,
                                  may outlive its lease: read with   sweep, beat, leave
                                  its record's ``wk``)
``job:<id>`` (derived)     hash   spec and state (JOB_FIELDS)        every script
``ev:<id>`` (derived)      list   what the record cannot tell of a   enqueue, fetch, ack, sweep,
                                  job's life (deferral, schedule,    redrive; deleted with the
                                  throttle, retry, ...), msgpack     record (retention). A plain
                                  [ms, kind, detail], last 64 kept;  job (accepted, started,
                                  kinds in ``fairlane.insight.explain``    completed) has none
``lane:<l>:c:<c>:fair``    zset   active tenant -> start tag         enqueue, fetch, cancel
 (derived)
``lane:<l>:c:<c>:vt``      hash   V, in-flight ``run``, ``f:<t>``      enqueue, fetch, ack, sweep
 (derived)
``lane:<l>:c:<c>:seen``    hash   tenant -> 'tag|ms': an idle        tenant sweep
 (derived)                        tenant's finish tag above V, first
                                  seen by the tenant sweep then
``lane:<l>:c:<c>:starts``  hash   second (server ms // 1000) ->       fetch, enqueue (a
 (derived)                        starts + 2**26 * retry starts in    hand-off); the newest
                                  it (fairlane.policy.starts)        600 seconds kept
``q:<l>:<c>:<t>`` (der.)   zset   waiting job ids by order           enqueue, fetch, cancel
``fk:<l>:<c>:<t>`` (der.)  zset   fairness key -> its next start tag enqueue (dropped at or
                                  in the tenant queue (fairkeys.lua) below the queue's head)
``fkw:<t>`` (derived)      hash   fairness key -> weight (absent: 1)  configure_key_weight
``sig:<t>`` (derived)      hash   rate ring ``s<i>``/``c<i>``, mean    enqueue, ack
                                  duration ``dm``, ``dn`` samples
``cost:<t>|<w>|<m>`` (der.) hash  learned cost ``mean`` (milli-units), ack (cost feedback)
                                  ``n`` samples
``lane:<l>:c:<c>:deferred`` zset  every deferred job id -> seq (the  enqueue, promote; ack admits;
 (derived)                        class's index, read by views)      cancel
``lane:<l>:c:<c>:dq:<t>``  zset   tenant t's deferred ids -> seq     enqueue, promote; ack admits
``lane:<l>:c:<c>:dfair``   zset   tenant with deferred jobs -> tag   enqueue, promote, ack
``lane:<l>:c:<c>:didle``   zset   tenant -> finish tag (above V)     enqueue, promote, ack
``lane:<l>:c:<c>:dvt``     hash   fair deferral's V, pinned head     ack (readmission pass);
                                  ``pin``/``pt`` (its overtakes:     overtakes: enqueue
                                  state ``ao:<c>``)
``lane:<l>:adm:t`` (der.)  hash   '<c>|<tenant>' -> admitted jobs    enqueue, ack, sweep, cancel
``lane:<l>:adm:tu`` (der.) hash   '<c>|<tenant>' -> reserved m-units enqueue, ack, sweep, cancel
``lane:<l>:adm:rej`` (der.) hash  tenant -> 'count|window start'     enqueue (rejections)
``kept:<task>:ok`` (der.)  zset   completed job id -> finish (ms)    ack (retention index)
``kept:<task>:failed``     zset   failed/expired/cancelled -> (ms)   ack, sweep, cancel
``kept:<t>:<o>:links``     set    kept ids whose removal takes more  ack, sweep, cancel
 (derived)                        than a DEL (an idempotency key, a  (trimmed with the
                                  run's keys)                        index); redrive
``run:<id>:steps`` (der.)  list   a workflow run's checkpointed      wf_step, wf_wait,
                                  operations, in order (msgpack)     wf_children; trim
``run:<id>:log`` (der.)    list   slices, suspensions, the end       wf_load, ack, finish
``run:<id>:sig`` (der.)    list   signals not yet consumed           signal, wf_wait
``run:<id>:h`` (der.)      hash   ``k:<child>`` settled children,    finish (of a child),
                                  ``s:<id>`` signal ids, ``a:<step>``  signal, wf_step
                                  failed attempts
=========================  =====  =================================  ========================

The ``stats`` hash counts each admission decision on a submitted job (lanes with an
admission pool only) in a field ``adm:<outcome>:<reason>:<lane>:<class>``: outcome
``accepted``, ``deferred`` or ``rejected``, reason ``none`` when accepted, else the
reason admission gave. Lane and class names hold no colon, so the fields split cleanly;
``fairlane.metrics.store`` exports them as ``fairlane_admission_decisions_total``.
Fields ``units:est:<lane>:<class>`` and ``units:used:<lane>:<class>`` (ack, in lanes
that learn costs) sum, in milli-units, the estimate the store held for each finished
attempt and what it used; exported as ``fairlane_work_units_estimated_total`` and
``fairlane_work_units_used_total``.

The tenant sweep (``lua/tenantsweep.lua``, rules in ``fairlane.policy.tenantstate``)
deletes what tenants leave behind: ``f:<t>`` fields of ``vt`` and the ``seen`` marks,
``cost:*`` and ``sig:*`` keys, ``adm:rej`` counters past their window, ``adm:t``/``adm:tu``
fields at 0. Its table ``TENANT_SWEEP.rows`` names each pattern it sweeps.

Pub/sub channel ``<prefix>done`` carries the id of a finished job that a producer
is waiting on (only jobs whose ``w`` flag is set are published).
"""

from __future__ import annotations

import itertools
from typing import Final

import msgspec
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

__all__ = [
    "COST_KEY_SEP",
    "JOB_FIELDS",
    "SHARDED_PREFIX_PATTERN",
    "AppKeys",
    "LaneKeys",
    "cost_key_name",
    "job_shard",
    "namespace",
    "shard_job_id",
    "shard_namespace",
]


def namespace(app: str) -> str:
    """The key prefix of an app, hash tag included."""
    if not app or any(c in app for c in "{}: \t\n"):
        raise ValueError(
            f"app name must be non-empty and free of braces, colons and spaces: {app!r}"
        )
    return f"{{fl:{app}}}:"


#: A Lua pattern that a shard's prefix of an app of several shards matches and the prefix
#: of an app of one shard does not (``{fl:<app>:<i>:<k>}:`` against ``{fl:<app>}:``; an
#: app's name holds no colon or brace): the scripts keep what only sharded workers read
#: (a class's waiting weight) where it matches.
SHARDED_PREFIX_PATTERN: Final = "^{fl:[^:}]*:"

#: what separates a cost key's parts (``cost:<t>|<w>|<m>``); the scripts build the usual
#: key, a tenant's task with no model, with it (core.usual_cost_key)
COST_KEY_SEP: Final = "|"


def cost_key_name(tenant: str, workflow: str, model: str) -> str:
    """The cost key whose learned cost a job of ``tenant`` for ``workflow`` and ``model``
    reads (``cost:<key>``, and a job record's ``ck``)."""
    return f"{tenant}{COST_KEY_SEP}{workflow}{COST_KEY_SEP}{model}"


def shard_namespace(app: str, shard: int, count: int) -> str:
    """The key prefix of shard ``shard`` of an app split into ``count`` shards."""
    if count == 1:
        return namespace(app)
    namespace(app)  # validates the name
    if not 0 <= shard < count:
        raise ValueError(f"shard {shard} is not one of the app's {count} shards")
    low = shard * REDIS_CLUSTER_HASH_SLOTS // count
    high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // count
    for salt in itertools.count():
        tag = f"fl:{app}:{shard}:{salt}"
        if low <= key_slot(tag.encode()) < high:
            return f"{{{tag}}}:"
    raise AssertionError("unreachable")  # pragma: no cover


def shard_job_id(raw_id: str, shard: int, count: int) -> str:
    """A new job's id in a shard: ``s<shard>.<raw id>`` when the app has several."""
    return raw_id if count == 1 else f"s{shard}.{raw_id}"


def job_shard(job_id: str, count: int) -> int:
    """The shard a job id names (a workflow child's id extends its run's, so it names
    the run's shard); an id naming none, or no shard of ``count``, is shard 0's, where
    a lookup then finds nothing rather than the wrong job."""
    if count == 1 or not job_id.startswith("s"):
        return 0
    head, dot, _ = job_id[1:].partition(".")
    if not dot or not head.isdigit() or len(head) > 4:
        return 0
    shard = int(head)
    return shard if shard < count else 0


class LaneKeys(msgspec.Struct, frozen=True):
    """The fixed keys of one lane."""

    state: str
    cap: str
    delayed: str
    wake: str
    idle: str

    def as_list(self) -> list[str]:
        return [self.state, self.cap, self.delayed, self.wake, self.idle]


class AppKeys(msgspec.Struct, frozen=True):
    """The fixed keys of one app (one scheduling shard)."""

    prefix: str

    @classmethod
    def for_app(cls, app: str) -> AppKeys:
        return cls(namespace(app))

    @classmethod
    def for_shard(cls, app: str, shard: int, count: int) -> AppKeys:
        return cls(shard_namespace(app, shard, count))

    @property
    def fence(self) -> str:
        return self.prefix + "fence"

    @property
    def leases(self) -> str:
        return self.prefix + "leases"

    @property
    def stats(self) -> str:
        return self.prefix + "stats"

    @property
    def idem(self) -> str:
        return self.prefix + "idem"

    @property
    def dead(self) -> str:
        return self.prefix + "dead"

    @property
    def workers(self) -> str:
        return self.prefix + "workers"

    @property
    def gone(self) -> str:
        """Jobs retention removed, with when and by which bound (``store.retention``)."""
        return self.prefix + "gone"

    @property
    def beats(self) -> str:
        """Workers that beat, by their last beat: one silent past its timeout is dead."""
        return self.prefix + "beats"

    @property
    def tasks(self) -> str:
        return self.prefix + "tasks"

    @property
    def weights(self) -> str:
        return self.prefix + "weights"

    @property
    def fleet(self) -> str:
        return self.prefix + "fleet"

    @property
    def tlimits(self) -> str:
        return self.prefix + "tlimits"

    @property
    def throttles(self) -> str:
        return self.prefix + "thr"

    @property
    def throttle_waiters(self) -> str:
        return self.prefix + "thr:wait"

    def throttle_tags(self, key: str, which: str) -> str:
        """A throttle key's tenant start (``s``) or finish (``f``) tags (scripts derive the
        same name, ``<thr> .. ':' .. which .. ':' .. key``)."""
        return f"{self.throttles}:{which}:{key}"

    def rate_state(self, key: str) -> str:
        """A rate key's bucket, pause, adaptive value and counters (scripts derive the same
        name, ``<prefix> .. 'rate:' .. key``)."""
        return f"{self.prefix}rate:{key}"

    @property
    def rate_index(self) -> str:
        """Every rate key seen -> when it was last written (ms)."""
        return self.prefix + "rates"

    @property
    def rate_due(self) -> str:
        """Rate-blocked keys with waiters -> when they are due (ms): the rate timer."""
        return self.prefix + "ratedue"

    @property
    def global_keys(self) -> str:
        """The global keys this shard has used (scripts derive the same name,
        ``<prefix> .. 'gkeys'``): what the balancer's report reads."""
        return self.prefix + "gkeys"

    @property
    def balancer_epoch(self) -> str:
        """The global-key balancer's epoch counter (used in the home shard, 0)."""
        return self.prefix + "gk:epoch"

    @property
    def balancer_lead(self) -> str:
        """The worker that runs the global-key balancer's passes, with an expiry (shard 0)."""
        return self.prefix + "gk:lead"

    @property
    def pauses(self) -> str:
        """An operator's pauses: scope field -> end ms (scripts derive ``p .. 'pause'``)."""
        return self.prefix + "pause"

    @property
    def pause_reasons(self) -> str:
        """Scope field -> JSON reason, by, at, until (``p .. 'pause:why'``)."""
        return self.prefix + "pause:why"

    @property
    def durations(self) -> str:
        """Learned means of jobs' lengths (scripts derive ``p .. 'dur'``)."""
        return self.prefix + "dur"

    def tenant_durations(self, tenant: str) -> str:
        """A tenant's own learned lengths (scripts derive ``p .. 'dur:' .. tenant``)."""
        return f"{self.prefix}dur:{tenant}"

    def signals(self, tenant: str) -> str:
        """A tenant's submission rate ring and mean duration (``p .. 'sig:' .. tenant``)."""
        return f"{self.prefix}sig:{tenant}"

    def parked(self, field: str) -> str:
        """The jobs a pause of ``field`` parked (``p .. 'parked:' .. field``)."""
        return f"{self.prefix}parked:{field}"

    @property
    def tenant_rates(self) -> str:
        """Tenant -> its own rate ``'limit,per_ms,burst,units'``."""
        return self.prefix + "trate"

    @property
    def tenant_classes(self) -> str:
        """Tenant -> the restricted classes it may use and its default class (scripts
        derive the same name, ``<prefix> .. 'tclasses'``)."""
        return self.prefix + "tclasses"

    @property
    def gateway_keys(self) -> str:
        """The HTTP gateway's tenant API keys (``fairlane.gateway.apikeys``)."""
        return self.prefix + "gw:keys"

    @property
    def audit(self) -> str:
        """The gateway's audit trail: decisions that change state (``fairlane.store.audit``)."""
        return self.prefix + "gw:audit"

    @property
    def payloads(self) -> str:
        """The index of payloads kept in a payload store (``fairlane.store.payloadindex``)."""
        return self.prefix + "payloads"

    @property
    def done_channel(self) -> str:
        return self.prefix + "done"

    def lane_rejections(self, lane: str) -> str:
        """The lane's recent admission rejections per tenant (written by enqueue)."""
        return f"{self.prefix}lane:{lane}:adm:rej"

    def lane(self, lane: str) -> LaneKeys:
        base = f"{self.prefix}lane:{lane}:"
        return LaneKeys(
            state=base + "state",
            cap=base + "cap",
            delayed=base + "delayed",
            wake=base + "wake",
            idle=base + "idle",
        )

    def lane_deadlines(self, lane: str) -> str:
        """The lane's unfinished jobs with a deadline, by deadline (scripts derive
        ``lane_key(p, lane, 'dl')``): what the slots deadlines need are read from."""
        return f"{self.prefix}lane:{lane}:dl"

    def inbox(self, worker: str) -> str:
        """Jobs handed straight to an idle worker; the worker blocks on it."""
        return f"{self.prefix}inbox:{worker}"

    def worker_jobs(self, worker: str) -> str:
        """The ids leased to a worker, so that its death frees them at once."""
        return f"{self.prefix}wj:{worker}"

    def job(self, job_id: str) -> str:
        """A job's hash; scripts derive the same name (``prefix .. 'job:' .. id``)."""
        return f"{self.prefix}job:{job_id}"

    def events(self, job_id: str) -> str:
        """A job's lifecycle events; scripts derive the same name (``prefix .. 'ev:' .. id``)."""
        return f"{self.prefix}ev:{job_id}"

    def tenant_queue(self, lane: str, service_class: str, tenant: str) -> str:
        return f"{self.prefix}q:{lane}:{service_class}:{tenant}"

    def fairness_tags(self, lane: str, service_class: str, tenant: str) -> str:
        """A tenant queue's fairness keys' next tags (scripts derive the same name)."""
        return f"{self.prefix}fk:{lane}:{service_class}:{tenant}"

    def key_weights(self, tenant: str) -> str:
        """A tenant's fairness keys' weights (scripts derive the same name)."""
        return f"{self.prefix}fkw:{tenant}"

    def class_key(self, lane: str, service_class: str, what: str) -> str:
        """A class's ``fair``, ``vt`` or ``held`` key (scripts derive the same name)."""
        return f"{self.prefix}lane:{lane}:c:{service_class}:{what}"

    def run(self, run_id: str, what: str) -> str:
        """A workflow run's ``steps``, ``log``, ``sig`` or ``h`` key (scripts derive the same)."""
        return f"{self.prefix}run:{run_id}:{what}"

    def kept(self, task: str, outcome: str) -> str:
        return f"{self.prefix}kept:{task}:{outcome}"

    def common(self) -> list[str]:
        """The fixed keys every script receives first, in the order the Lua library expects."""
        return [
            self.fence,
            self.leases,
            self.stats,
            self.idem,
            self.dead,
            self.workers,
            self.tasks,
            self.weights,
            self.fleet,
            self.tlimits,
            self.throttles,
            self.throttle_waiters,
        ]

    def match_all(self) -> str:
        """A SCAN pattern matching every key of the app (for purge)."""
        return self.prefix.replace("{", "\\{").replace("}", "\\}") + "*"


#: How this library lays its data out, kept in the ``stats`` hash's ``layout`` field by
#: the first app to declare itself on a shard (``claim_layout``). 1: every job field
#: written (no ``layout`` field; the FIFO counter is ``stats``'s ``seq``); 2: fields at
#: their defaults left out of job records (``JOB_FIELDS`` says what an absent one reads
#: as), the FIFO counter ``fifo``. Data of another layout is refused,
#: not misread. 3: also left out, a job's tenant, lane, attempt budget and timeout at the
#: values of ``RECORD_DEFAULTS``, its class at ``standard``, and ``run`` when it equals
#: ``enq``. 4: a running job's throttle grant kept whole in its record (``ttok``), not in
#: the ``thr`` hash.
STORE_LAYOUT: Final = 4

#: What a record's ``tenant``, ``lane``, ``max``, ``to`` and ``cls`` read as when absent:
#: the values most jobs have, left out of their records (a waiting job's hash is then
#: small enough to take a smaller allocation on the server). The Lua library has them
#: written in (``library.py``).
RECORD_DEFAULTS: Final[dict[str, str]] = {
    "tenant": "default",
    "lane": "default",
    "max": "3",
    "to": "300",
    "cls": "standard",
}

#: Fields of a job hash, as written by the Lua library.
JOB_FIELDS: dict[str, str] = {
    "x": "'1' when the record may hold optional fields (dl, lim, tp, par, toff, fk, rk, "
    "rmu, w, mu, wfr, idem); absent or '' when it holds none; every writer of one sets it. "
    "An enqueue writes '-' when it holds none of the fields an ack reads (dl, par, idem, w, "
    "mu, wfr: its keys or fairness key alone). A running job's grant (ttok) needs no mark: "
    "the ack reads it with the common fields (lua core.lua, core.read and core.read_whole)",
    "task": "task name",
    "tenant": "tenant the job belongs to (absent = RECORD_DEFAULTS)",
    "lane": "lane that runs it (absent = RECORD_DEFAULTS)",
    "prio": "priority within the tenant (higher runs first; absent = 0)",
    "args": "encoded arguments (JSON)",
    "max": "attempt budget (absent = RECORD_DEFAULTS)",
    "bo": "backoff: 'base,cap,jitter' (absent = the default backoff)",
    "to": "timeout in seconds (0 = none; absent = RECORD_DEFAULTS)",
    "dl": "deadline, server ms (absent = none)",
    "idem": "idempotency key (absent = none)",
    "rc": "retention of completed records: 'count,age_ms' (-1 = unbounded; absent = the "
    "default retention)",
    "rf": "retention of failed records: 'count,age_ms' (absent = the default retention)",
    "enq": "enqueued at, server ms",
    "run": "eligible to run at, server ms (absent = enq)",
    "seq": "order within a priority: the FIFO number, a keyed job's fair tag, or a "
    "deadline order (< 0)",
    "fk": "fairness key: whose share of its tenant's part it takes (absent = none)",
    "st": "status",
    "att": "attempts started (absent = 0)",
    "tok": "fencing token of the current lease",
    "wk": "worker holding the lease",
    "start": "last attempt started at, server ms",
    "fin": "finished at, server ms",
    "res": "encoded result (JSON)",
    "err": "last error (JSON: type, message, traceback)",
    "w": "1 when a producer waits on the result",
    "cx": "1 when cancellation was requested while running",
    "cls": "service class (absent = RECORD_DEFAULTS)",
    "sl": "worker slots it occupies (absent = 1)",
    "lim": "throttle keys and limits (msgpack [[key, limit] or, adaptive, [key, max, min], ..], "
    "absent = none)",
    "rk": "rate keys (msgpack [[key, limit, per_ms, burst, units 0/1], ..] sorted, absent = none)",
    "rmu": "milli-units its rate keys counting units take (absent = none)",
    "pb": "pushbacks (Throttled) it has taken without spending an attempt",
    "hb": "first hand-back, server ms: a worker that could not run it (task unknown, arguments "
    "that do not fit) handed it back; dead-lettered worker.deploy_window later (absent = none)",
    "ttok": "the throttle grant it holds, only while leased: 'rate cost (units; empty: none "
    "kept)<TAB>key<TAB>key..' (absent = none)",
    "toff": "1 while it holds offers a throttle key woke it with (queued; absent = none)",
    "mu": "milli-units admission reserved for it, while reserved",
    "emu": "milli-units admission reserved for it (kept)",
    "dmu": "milli-units it will reserve when admitted (a deferred job)",
    "readmit": "milli-units a retry held: it passes the gate again when due",
    "retry": "1 when a deferred job is a retry (it may use the recovery reserve)",
    "ck": "cost key 'tenant|workflow|model' whose learned cost applies (absent = "
    "'tenant|task|', the usual one; '' = none)",
    "cu": "milli-units its tenant is charged at dispatch (cost mode)",
    "amu": "milli-units its last attempt used",
    "use": "what its last attempt reported of its time in model and tool calls, "
    "'<model ms>,<tool ms>': written when that attempt ends the job (an attempt that ends "
    "earlier keeps it in its event; absent = nothing reported)",
    "par": "the workflow run a child job belongs to (absent = none)",
    "wfr": "1 once a workflow run has started (it has run:<id>:* keys)",
    "wf": "what a suspended run waits for: yield, sleep, signal:<name> or children",
    "wfw": "the wait in progress: '<seq>|<deadline ms>|<since ms>'",
    "wfk": "the children a run waits for (msgpack list of ids)",
    "qw": "why its last attempt waited, as dispatch saw it (JSON, '' = nothing to say; "
    "fairlane.insight.explain)",
    "pz": "the pause-table field of the operator's pause that parked it, while parked "
    "(absent = none; fairlane/policy/pauses.py, P3)",
    "tp": "W3C trace context of the enqueue: 'traceparent' or 'traceparent tracestate' "
    "(absent = not traced; fairlane.tracing)",
}
