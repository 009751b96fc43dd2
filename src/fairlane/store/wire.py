"""The structs that travel to and from the Lua library, and the decoders of its replies.

Batches travel as one msgpack argument / reply: one argument to pack instead of five
per job, and one buffer to parse instead of eleven reply elements per job. A reply
row that does not decode is kept apart (``Fetched.malformed``) so one bad record never
fails its whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import IntEnum, StrEnum
from typing import Any, Final

import msgspec

from fairlane.policy.ceilings import TenantLimits
from fairlane.policy.rates import Rate
from fairlane.store.argv import ARGV


class OutcomeKind(StrEnum):
    """How an attempt ended, as ``Outcome.kind`` carries it (text on the wire, as before)."""

    OK = "ok"
    RETRY = "retry"
    DEAD = "dead"
    CANCEL = "cancel"
    RELEASE = "release"  # handed back unstarted by a stopping worker
    SUSPEND = "suspend"  # a workflow run waits
    THROTTLE = "throttle"  # an upstream pushed back on one of its rate keys
    HANDBACK = "handback"  # the worker could not run it: another may
    EXPIRE = "expire"  # stopped at its job's deadline while running: the job expires


AckKind = str


class Reply(IntEnum):
    """A job's code in the enqueue script's reply (``Submitted.code``)."""

    EXISTING = 0  # an idempotency key names a job already stored
    ACCEPTED = 1
    DEFERRED = 2  # stored, admitted when room frees
    DEADLINE_UNMEETABLE = -1
    UNKNOWN_CLASS = -2
    REJECTED = -4  # by admission: detail 'reason|earlier rejections'
    CLASS_NOT_ENTITLED = -5
    TENANT_PAUSED = -6  # a quarantine refused it: detail 'tenant_paused|ms to its end (0: none)'


class PauseField(StrEnum):
    """The kind that opens a pause's field in the store's pause table (``kind:names``)."""

    TENANT = "t"
    KEY = "k"  # 'k:<tenant>\0<key>'
    TASK = "j"
    LANE = "l"  # 'l:<lane>\0<class>', '' = every class
    REFUSE = "r"  # a tenant's quarantine


class AckCode(IntEnum):
    """An outcome's code in the ack and exchange replies."""

    FENCED = 0  # stale: another lease holds the job, or none
    APPLIED = 1
    RESETTLED = 2  # this lease's settlement again, after its reply was lost: not applied twice


class SubmittedField(IntEnum):
    """Places of a job's entry in the enqueue reply, which is flat: entry ``k`` (from 0)
    holds place ``p`` at ``k * len(SubmittedField) + p`` as Lua counts."""

    ID = 1
    CODE = 2  # Reply
    DETAIL = 3  # 'reason|earlier rejections', or ''


class LoadReply(IntEnum):
    """Places of ``wf_load``'s reply: ``[0]`` when the lease is not the caller's."""

    HELD = 1  # 1: the caller holds the lease
    SERVICE_CLASS = 2
    STEPS = 3  # the checkpoints, msgpack each
    FAILURES = 4  # failed step attempts: name, count, ..


class DrainReply(IntEnum):
    """Places of ``drain``'s reply."""

    CURSOR = 1  # '0' once the source is walked through
    SEEN = 2  # entries looked at
    MATCHED = 3  # jobs cancelled, or counted in a dry run
    CPU_US = 4  # the server's CPU time the call took (a clock that stands still for none)


class EstimateReply(IntEnum):
    """Places of ``estimate``'s reply: what a start-time estimate rests on
    (``fairlane.policy.startpredict``)."""

    NOW = 1  # server ms
    STATE = 2  # the job's status ('' unknown; 'new' for one not yet submitted)
    TENANT = 3
    LANE = 4
    CLASS = 5
    TASK = 6
    AHEAD = 7  # jobs of its tenant ahead of it in its queue (-1: not in it)
    CAPACITY = 8  # the lane's live slots
    TABLE = 9  # the lane's class table (JSON, ``encode_classes``)
    LOADS = 10  # in-flight and waiting slots of each class of the table, in its order
    TENANTS = (
        11  # waiting tenants read: tenant, weight, jobs, mean slot-ms, mean units ('' unknown)
    )
    UNREAD = 12  # waiting tenants beyond those read
    CLASS_MEAN = 13  # the class's mean slot-ms per job ('' unknown)
    OWN_MS = 14  # the job's own expected ms ('' unknown)
    DEADLINE = 15  # its deadline, server ms ('' none)
    RUN_AT = 16  # when it may run, server ms ('' now)
    PAUSED = 17  # 1: an operator's pause holds it
    USAGE = 18  # slot-ms per ms each tenant read finished lately ('' none), then the class's
    CHARGE = 19  # how the lane charges a start: 'cost' (its units) or else one per job


def at(reply: Sequence[Any], place: IntEnum) -> Any:
    """A script reply's element at ``place``, a position as Lua counts it (from 1)."""
    return reply[place - 1]


class ClassField(IntEnum):
    """Positions (from 1, as Lua counts) of a class row in a class table as the scripts
    read it (``encode_classes``); ``max_wait``, ``restricted`` and ``deadline_order``
    trail, so a table stored before them still reads."""

    NAME = 1
    SHARE = 2
    MIN_SLOTS = 3
    LENDABLE = 4
    BORROWABLE = 5  # -1: up to C
    BATCH = 6  # 0/1
    MAX_WAIT = 7  # ms; -1: never ages
    RESTRICTED = 8  # 0/1
    DEADLINE_ORDER = 9  # 0/1: its jobs with a deadline run earliest deadline first


class AdmissionField(IntEnum):
    """Positions of a class's bounds in a lane's admission config (``encode_admission``)."""

    MAX_QUEUE = 1
    MAX_QUEUE_MU = 2  # -1: none
    TENANT_MAX_QUEUE = 3
    MAX_DEFERRED = 4
    DEFER = 5  # 1: defer when full, else reject
    TENANT_MAX_QUEUE_MU = 6  # -1: none


class LimitField(IntEnum):
    """Positions of a key limit in ``NewJob.limits`` (and in a job record's ``lim``):
    ``[key, limit]``, or ``[key, max, min]`` for an adaptive limit. Its first three places
    are a rate key's too (key, a number, a number), which the lease checks once for both."""

    KEY = 1
    LIMIT = 2  # the limit, or an adaptive key's max
    MIN = 3  # an adaptive key's min; absent for a fixed limit


class RateField(IntEnum):
    """Positions of a rate key in ``NewJob.rates``."""

    KEY = 1
    LIMIT = 2
    PER_MS = 3
    BURST = 4
    UNITS = 5  # 1: the key counts work units, 0: jobs


class GkReportField(IntEnum):
    """Places of one key's entry in a shard's report to the global-key balancer
    (``gk_report``, ``store/globalkeys.py``)."""

    KEY = 1
    PART = 2  # the part in force, '%.17g'
    USED = 3  # slots held and offered
    LIMIT = 4  # the concurrency limit in force; -1: none (a key of rates only, or idle)
    WAITING = 5  # jobs parked on the key
    WEIGHT = 6  # the sum of the weights of the tenants waiting, '%.17g'
    ACTIVE = 7  # 1 while a job of the shard names the key
    PAUSED_UNTIL = 8  # server ms; 0: not paused


class GkOrderField(IntEnum):
    """Places of one order of the global-key balancer (``gk_order``)."""

    KEY = 1
    PART = 2
    PAUSED_UNTIL = 3  # lengthens the key's pause to it; 0: no pause


class GkHeldField(IntEnum):
    """Places of one key's entry in ``gk_order``'s reply."""

    KEY = 1
    HELD = 2  # what the shard holds of the key now, '%.17g'


class ExchangeField(IntEnum):
    """Positions of the exchange's one msgpack argument (``Exchange.exchange``)."""

    OUTCOMES = 1
    WORKER = 2
    WANT = 3
    LEASE_MS = 4
    PROMOTE_LIMIT = 5
    LANES = 6
    IDLE_MS = 7
    SLOTS = 8


def exchange_args(
    outcomes: Sequence[Outcome],
    *,
    worker: str,
    want: int,
    lease_ms: int,
    promote_limit: int,
    lanes: Sequence[str],
    idle_ms: int,
    slots: int,
) -> bytes:
    """The exchange's argument, its fields in ``ExchangeField``'s order."""
    fields: dict[ExchangeField, object] = {
        ExchangeField.OUTCOMES: outcomes,
        ExchangeField.WORKER: worker,
        ExchangeField.WANT: want,
        ExchangeField.LEASE_MS: lease_ms,
        ExchangeField.PROMOTE_LIMIT: promote_limit,
        ExchangeField.LANES: lanes,
        ExchangeField.IDLE_MS: idle_ms,
        ExchangeField.SLOTS: slots,
    }
    return _PACK.encode([fields[f] for f in ExchangeField])


class LeaveField(IntEnum):
    """Positions of ``leave``'s one msgpack argument (``Exchange.leave``)."""

    WORKER = 1
    LEASE_MS = 2
    LANES = 3


def leave_args(*, worker: str, lease_ms: int, lanes: Sequence[str]) -> bytes:
    """``leave``'s argument, its fields in ``LeaveField``'s order."""
    fields: dict[LeaveField, object] = {
        LeaveField.WORKER: worker,
        LeaveField.LEASE_MS: lease_ms,
        LeaveField.LANES: lanes,
    }
    return _PACK.encode([fields[f] for f in LeaveField])


def pushback_payload(key: str, error: str) -> str:
    """A ``throttle`` outcome's payload: the rate key pushed back on, then the error JSON
    (JSON holds no raw newline)."""
    return f"{key}\n{error}"


def handback_payload(window_ms: int, error: str, final: str) -> str:
    """A ``handback`` outcome's payload: how long after its first hand-back the job may
    still be handed back (ms; 0: dead-lettered now), the error of this attempt, and the
    error it is dead-lettered with once the window is over."""
    return "\n".join((str(window_ms), error, final))


# Batches travel as one msgpack argument / reply: one argument to pack instead of
# five per job, and one buffer to parse instead of eleven reply elements per job.
_PACK: Final = msgspec.msgpack.Encoder()
# [next_due_ms, ack codes, jobs]; each job as fetch returns it in the Lua library


class StoreError(ConnectionError):
    """The store could not carry out a call, for a reason that passes (the server down,
    a slot moving, every connection busy): a caller that retries later may succeed."""


class StoreUnavailable(StoreError):
    """The server cannot be reached (or stopped answering within the timeout)."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.store.redis"


class NewJob(msgspec.Struct, array_like=True):
    """One job as the enqueue script takes it (encoded in this field order). Times in ms."""

    id: str
    tenant: str
    priority: int
    task: str
    args: str  # JSON text (bytes are accepted and decoded)
    max_attempts: int
    backoff: str
    timeout: float
    keep_completed: str
    keep_failed: str
    idempotency_key: str = ""
    delay_ms: int | None = None
    at_ms: int | None = None
    deadline: str = ""  # "" none, "+ms" relative, or absolute ms
    service_class: str = "standard"
    slots: int = 1
    # sorted by key: [key, limit], or [key, max, min] for an adaptive limit
    limits: list[list[str | int]] = msgspec.field(default_factory=list)
    declared_mu: int = 1000  # the caller's estimate (or the default cost), in milli-units
    cost_key: str = ""  # "tenant|workflow|model": whose learned cost applies
    declared: int = 0  # 1 when the caller declared an estimate (else learned cost rules)
    parent: str = ""  # the workflow run this job is a child of
    trace_context: str = ""  # W3C trace context of the enqueue ('' none; fairlane.tracing)
    # last, so that the fields before it keep their places for scripts that predate it
    fairness_key: str = ""  # the end user it is fair between, inside its tenant ('' none)
    # rate keys [(key, limit, per_ms, burst, units 0/1)], sorted; what their units keys take
    rates: list[tuple[str, float, float, float, int]] = msgspec.field(default_factory=list)
    rate_mu: int = 0
    # 0 when neither the call nor the task named the class: the store then gives the job
    # its tenant's default class, where the tenant has one it may use (1: as given)
    class_named: int = 1
    # ms from submission to its expected end (estimated wait and learned length; 0: not
    # estimated): a deadline it would miss is refused as one already past
    needs_ms: int = 0
    # its tenant's queued jobs when it was estimated (-1: not estimated), and what each
    # job queued since adds to needs_ms: a burst's estimates race, enqueue settles it
    needs_seen: int = -1
    needs_per_job_ms: int = 0
    # 1: with a deadline, it takes its place in its tenant's queue by it (its task's
    # deadline_order; its class's is in the lane's table)
    deadline_order: int = 0

    def __post_init__(self) -> None:
        args: object = self.args
        if isinstance(args, bytes):
            self.args = args.decode()


class FetchedJob(msgspec.Struct, array_like=True, frozen=True):
    """A job handed to a worker, with the lease token that fences its writes.

    Decoded straight from the fetch reply (the field order is the Lua library's).
    """

    id: str
    token: str
    attempt: int
    task: str
    args: str  # JSON text
    timeout: float  # seconds; 0 = none
    deadline_ms: int  # server ms; 0 = none
    tenant: str
    max_attempts: int
    backoff: str
    enqueued_ms: int
    slots: int = 1  # worker slots the job occupies
    service_class: str = "standard"
    trace_context: str = ""  # the producer's W3C trace context ('' none; fairlane.tracing)
    parent: str = ""  # the workflow run a child job belongs to ('' none)
    fairness_key: str = ""  # its fairness key ('' none): a workflow's children inherit it


class Submitted(msgspec.Struct, frozen=True):
    """One job's answer from the enqueue script."""

    id: str
    code: Reply
    reason: str | None  # why it was deferred or rejected
    earlier_rejections: int  # the tenant's rejections in the last minute, before this one
    paused_ms: int | None = None  # TENANT_PAUSED: ms to the quarantine's end (0: none)


class TenantSignal(msgspec.Struct, frozen=True):
    """A tenant's concurrency limit now (None: no settings) and what it follows."""

    limit: int | None
    rate_per_min: float
    mean_duration_s: float
    capacity: int
    load: int


class Fetched(msgspec.Struct, frozen=True):
    jobs: list[FetchedJob]
    next_due_ms: int | None  # time until the next scheduled job of the lanes, if any
    ack_codes: list[int]
    # (id, token) of leased rows the worker cannot read: to settle as dead, never to run
    malformed: list[tuple[str, str]] = msgspec.field(default_factory=list)
    # the lanes' waiting weight as the exchange left it (None: it made no fetch)
    waiting: float | None = None


class Outcome(msgspec.Struct, array_like=True, frozen=True, omit_defaults=True):
    """A settled attempt, sent back fenced by its token (encoded as the script reads it).

    Places at their defaults at the end are left off the wire (a plain completion sends
    five of eight): the script reads an absent place as its default.
    """

    id: str
    token: str
    kind: AckKind
    # the server's msgpack reads no binary type: payloads are UTF-8 JSON, sent as text
    payload: str = ""
    delay_ms: int = 0
    cost: float = -1.0  # work units the attempt used (-1: it did not run)
    # what the task reported of its time in model and in tool calls (fairlane.context()),
    # in ms; -1: it reported none. Kept with the attempt for ``fairlane explain``
    model_ms: int = -1
    tool_ms: int = -1

    def __post_init__(self) -> None:
        # accept the bytes a caller may hold; the wire needs text
        payload: object = self.payload
        if isinstance(payload, bytes):
            msgspec.structs.force_setattr(self, "payload", payload.decode())
        token: object = self.token
        if isinstance(token, bytes):
            msgspec.structs.force_setattr(self, "token", token.decode())


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class FetchReply(msgspec.Struct, array_like=True, frozen=True):
    """The exchange's reply (``Fetch.*`` in the Lua)."""

    next_due_ms: int  # -1: no scheduled job
    ack_codes: list[int]
    jobs: list[FetchedJob]
    # the weights of the tenants with jobs waiting, summed over the lanes asked for and
    # their classes (policy/shardshare.py); -1: no fetch was made
    waiting: float = -1.0


class FetchRows(msgspec.Struct, array_like=True, frozen=True):
    """``FetchReply`` with its jobs undecoded, read when one of them does not decode."""

    next_due_ms: int
    ack_codes: list[int]
    jobs: list[msgspec.Raw]
    waiting: float = -1.0


_UNPACK_FETCH: Final = msgspec.msgpack.Decoder(FetchReply)
UNPACK_JOB: Final = msgspec.msgpack.Decoder(FetchedJob)
UNPACK_JOBS: Final = msgspec.msgpack.Decoder(list[FetchedJob])
_UNPACK_ROWS: Final = msgspec.msgpack.Decoder(FetchRows)
UNPACK_RAWS: Final = msgspec.msgpack.Decoder(list[msgspec.Raw])
_UNPACK_ANY: Final = msgspec.msgpack.Decoder()


# read once per job of every enqueue: plain offsets, and each code's member at hand
_SUBMITTED_WIDTH: Final = len(SubmittedField)
_ID_AT: Final = SubmittedField.ID - 1
_CODE_AT: Final = SubmittedField.CODE - 1
_DETAIL_AT: Final = SubmittedField.DETAIL - 1
_REPLIES: Final = {int(r): r for r in Reply}


def parse_submitted(reply: Sequence[Any]) -> list[Submitted]:
    """The enqueue script's flat reply, one ``Submitted`` per job."""
    out: list[Submitted] = []
    for i in range(0, len(reply), _SUBMITTED_WIDTH):
        reason, _, earlier = as_text(reply[i + _DETAIL_AT]).partition("|")
        raw = int(reply[i + _CODE_AT])
        code = _REPLIES.get(raw)
        if code == Reply.TENANT_PAUSED:
            out.append(Submitted(as_text(reply[i + _ID_AT]), code, reason, 0, int(earlier or 0)))
            continue
        out.append(
            Submitted(
                as_text(reply[i + _ID_AT]),
                Reply(raw) if code is None else code,
                reason or None,
                int(earlier or 0),
            )
        )
    return out


def limit_entry(key: str, limit: int, minimum: int | None = None) -> list[str | int]:
    """A key limit as ``NewJob.limits`` holds it (``LimitField``): an adaptive one with its
    ``minimum``."""
    return [key, limit] if minimum is None else [key, limit, minimum]


def rate_entry(key: str, rate: Rate) -> tuple[str, float, float, float, int]:
    """A rate key as ``NewJob.rates`` holds it (``RateField``)."""
    return (key, rate.limit, rate.per_ms, rate.capacity, int(rate.units))


def encode_rate(rate: Rate) -> str:
    """A rate as the scripts read it: ``'limit,per_ms,burst,units'`` (units 1 or 0)."""
    return f"{rate.limit!r},{rate.per_ms!r},{rate.capacity!r},{int(rate.units)}"


def decode_rate(raw: bytes | str | None) -> Rate | None:
    """A rate written by ``encode_rate`` (None when absent or unreadable)."""
    if raw is None:
        return None
    try:
        limit, per_ms, burst, units = as_text(raw).split(",")
        return Rate(
            float(limit),
            per=float(per_ms) / 1000.0,
            burst=float(burst),
            cost="units" if units == "1" else "jobs",
        )
    except (ValueError, TypeError):
        return None


def encode_limits(limits: TenantLimits | None) -> str:
    if limits is None:
        return ""
    cap = -1 if limits.max_concurrency is None else limits.max_concurrency
    return f"{limits.floor},{cap},{limits.burst_floor},{limits.burst_pct!r}"


def decode_limits(raw: bytes | str | None) -> TenantLimits | None:
    if raw is None:
        return None
    floor, cap, burst_floor, burst_pct = as_text(raw).split(",")
    return TenantLimits(
        floor=int(floor),
        max_concurrency=None if int(cap) < 0 else int(cap),
        burst_floor=int(burst_floor),
        burst_pct=float(burst_pct),
    )


def parse_fetched(reply: bytes) -> Fetched:
    try:
        got = _UNPACK_FETCH.decode(reply)
    except msgspec.ValidationError:
        return parse_rows(reply)
    next_due = None if got.next_due_ms < 0 else got.next_due_ms
    return Fetched(got.jobs, next_due, got.ack_codes, waiting=_waiting(got.waiting))


def _waiting(raw: float) -> float | None:
    return None if raw < 0 else raw


def parse_rows(reply: bytes) -> Fetched:
    """The fetch reply row by row, when one row does not decode: the scripts check every
    record before leasing it, so this is a second line, which keeps one bad row from
    failing its whole batch (and the worker with it)."""
    got = _UNPACK_ROWS.decode(reply)
    jobs, malformed = decode_rows(got.jobs)
    next_due = None if got.next_due_ms < 0 else got.next_due_ms
    return Fetched(jobs, next_due, got.ack_codes, malformed, _waiting(got.waiting))


def positions(struct: type[msgspec.Struct]) -> dict[str, int]:
    """An array-like struct's field positions as Lua counts them (from 1), by field name."""
    return {name: i for i, name in enumerate(struct.__struct_fields__, 1)}


def lua_names() -> Mapping[str, str]:
    """Every name the Lua library may use for a place or value on the wire, as the
    library writes it in (``Job.FAIRNESS_KEY`` -> ``23``): the positions of a submitted
    job, a fetched row, an outcome, a class row, a class's admission bounds, a rate key,
    the exchange's argument and leave's; each function's ARGV (``fairlane.store.argv``);
    the reply and ack codes; the outcome kinds (quoted)."""
    names: dict[str, str] = {}
    structs: tuple[tuple[str, type[msgspec.Struct]], ...] = (
        ("Job", NewJob),
        ("Row", FetchedJob),
        ("Ack", Outcome),
        ("Fetch", FetchReply),
    )
    for prefix, struct in structs:
        for name, i in positions(struct).items():
            names[f"{prefix}.{name.upper()}"] = str(i)
    tables: tuple[tuple[str, type[IntEnum]], ...] = (
        ("ClassRow", ClassField),
        ("Adm", AdmissionField),
        ("Limit", LimitField),
        ("RateKey", RateField),
        ("Exchange", ExchangeField),
        ("Leave", LeaveField),
        ("Submitted", SubmittedField),
        ("Load", LoadReply),
        ("DrainReply", DrainReply),
        ("EstimateReply", EstimateReply),
        ("Reply", Reply),
        ("AckCode", AckCode),
        ("GkReport", GkReportField),
        ("GkOrder", GkOrderField),
        ("GkHeld", GkHeldField),
        *((args.__name__, args) for args in ARGV),
    )
    for prefix, enum in tables:
        for member in enum:
            names[f"{prefix}.{member.name}"] = str(member.value)
    for kind in OutcomeKind:
        names[f"Kind.{kind.name}"] = f"'{kind.value}'"
    for scope in PauseField:
        names[f"PauseField.{scope.name}"] = f"'{scope.value}'"
    return names


def decode_rows(rows: Sequence[msgspec.Raw]) -> tuple[list[FetchedJob], list[tuple[str, str]]]:
    """The rows that decode as jobs, and (id, token) of those that do not but name one."""
    jobs: list[FetchedJob] = []
    malformed: list[tuple[str, str]] = []
    for row in rows:
        try:
            jobs.append(UNPACK_JOB.decode(row))
        except msgspec.DecodeError:
            head = _UNPACK_ANY.decode(row)
            if isinstance(head, list) and len(head) > 1 and isinstance(head[0], str):
                malformed.append((head[0], str(head[1])))
            # else: not even an id; its lease expires and the sweep reclaims it
    return jobs, malformed
