"""The arguments (``ARGV``) of each function of the Lua library, by name.

Each function reads its own arguments as ``args[WfStepArg.RUN]``, and the library writes
the numbers in when it is assembled (``wire.lua_names``), so a name costs the server
nothing; the Python side builds the list by the same names with ``argv``. A function
that takes a variadic tail (pairs, ids) names the tail's first place ``FIRST_*``.
"""

from __future__ import annotations

from enum import IntEnum
from functools import cache
from typing import Any, Final


class EnqueueArg(IntEnum):
    """``enqueue``."""

    LANE = 1
    JOBS = 2  # msgpack [NewJob, ..]


class EnqueueAsArg(IntEnum):
    """``enqueue_as``: ``enqueue``'s arguments first, then the key that submits them."""

    LANE = 1
    JOBS = 2
    KEY_ID = 3
    KEY_HASH = 4  # SHA-256 of the key
    TENANT = 5  # the key's tenant
    AUDIT_CAP = 6  # the audit trail's cap


class ExchangeArg(IntEnum):
    """``exchange``."""

    PACKED = 1  # msgpack ExchangeField


class LeaveArg(IntEnum):
    """``leave``."""

    PACKED = 1  # msgpack LeaveField


class AckArg(IntEnum):
    """``ack``."""

    OUTCOMES = 1  # msgpack [Outcome, ..]
    WORKER = 2  # optional: the worker that ran them, whose leased ids are kept exact


class RenewArg(IntEnum):
    """``renew``."""

    WORKER = 1
    LEASE_MS = 2
    FIRST_HELD = 3  # then pairs: id, token


class SweepArg(IntEnum):
    """``sweep``."""

    LIMIT = 1
    SEED = 2  # random seed
    STALE_WORKER_MS = 3


class BeatArg(IntEnum):
    """``beat``."""

    WORKER = 1
    DEAD_MS = 2
    LIMIT = 3
    SEED = 4  # random seed


class DeclareTaskArg(IntEnum):
    """``declare_task``."""

    TASK = 1
    RETENTION = 2  # 'rc|rf'


class ClaimLayoutArg(IntEnum):
    """``claim_layout``."""

    LAYOUT = 1  # the store layout this library writes (keys.STORE_LAYOUT)


class ConfigureTenantArg(IntEnum):
    """``configure_tenant``."""

    TENANT = 1
    WEIGHT = 2  # '': back to the default


class ConfigureLimitsArg(IntEnum):
    """``configure_limits``."""

    TENANT = 1
    LIMITS = 2  # 'floor,max,burst_floor,burst_pct' ('': none)


class ConfigureClassesArg(IntEnum):
    """``configure_classes``."""

    TENANT = 1
    SET_CLASSES = 2  # '1': set its restricted classes, else kept
    CLASSES = 3  # JSON array
    SET_DEFAULT = 4  # '1': set its default class, else kept
    DEFAULT = 5  # '': none


class DeclareLaneArg(IntEnum):
    """``declare_lane``."""

    LANE = 1
    TABLE = 2  # its class table, JSON
    CHARGE = 3  # 'jobs' or 'cost'


class DeclareAdmissionArg(IntEnum):
    """``declare_admission``."""

    LANE = 1
    CONFIG = 2  # admission config JSON ('': none)
    UNITS = 3  # unit class table JSON


class DeclareBoundsArg(IntEnum):
    """``declare_bounds``."""

    LANE = 1
    BOUNDS = 2  # '<tenant max>,<lane max>' ('': none)


class TenantLimitNowArg(IntEnum):
    """``tenant_limit_now``."""

    LANE = 1
    TENANT = 2


class CancelArg(IntEnum):
    """``cancel``."""

    ID = 1


class DrainArg(IntEnum):
    """``drain``: one source of waiting jobs, the filters, and the call's bounds."""

    STATE = 1  # queued | deferred | scheduled | throttled: the source's state
    LANE = 2  # '': any (a throttled source only)
    SERVICE_CLASS = 3  # '': any (not a queued or deferred source)
    TENANT = 4  # '': any (not a queued source)
    CURSOR = 5  # ZSCAN's: '0' starts
    LIMIT = 6  # entries looked at per call
    BUDGET_US = 7  # the server's CPU time a call may take, looked at between pages
    DRY_RUN = 8  # '1': count only
    TASK = 9  # '': any
    FAIRNESS_KEY = 10  # '': any
    AFTER_MS = 11  # enqueued at or after (server ms; '': any)
    BEFORE_MS = 12  # enqueued before (server ms; '': any)
    PARKED = 13  # a queued source that is a pause's parked set: the pause's field ('' none)


class WatchArg(IntEnum):
    """``watch``."""

    ID = 1


class RedriveArg(IntEnum):
    """``redrive``."""

    LIMIT = 1  # when no id is given: the oldest ``limit``
    FIRST_ID = 2  # then ids


class TenantSweepArg(IntEnum):
    """``tenant_sweep``."""

    CURSOR = 1  # '0' starts a cycle
    LIMIT = 2
    IDLE_TTL_MS = 3


class WfLoadArg(IntEnum):
    """``wf_load``."""

    RUN = 1
    TOKEN = 2
    WORKER = 3


class WfStepArg(IntEnum):
    """``wf_step``: a checkpoint's fields after the run, its token and its seq."""

    RUN = 1
    TOKEN = 2
    SEQ = 3
    KIND = 4
    NAME = 5
    STATUS = 6  # 'failed': counts a failed attempt instead
    VALUE = 7
    MS = 8
    WORKER = 9


class WfWaitArg(IntEnum):
    """``wf_wait``."""

    RUN = 1
    TOKEN = 2
    SEQ = 3
    KIND = 4  # sleep | signal
    NAME = 5
    MS = 6
    ABSOLUTE = 7  # '1': ms is a time
    WORKER = 8


class WfChildrenArg(IntEnum):
    """``wf_children``."""

    RUN = 1
    TOKEN = 2
    SEQ = 3
    NAME = 4
    CHILDREN = 5  # msgpack [id, ..]
    WORKER = 6


class SignalArg(IntEnum):
    """``signal``."""

    RUN = 1
    NAME = 2
    PAYLOAD = 3  # JSON text
    SIGNAL_ID = 4  # '': none


class GkEnableArg(IntEnum):
    """``gk_enable``."""

    SHARDS = 1  # the app's shard count


class GkReportArg(IntEnum):
    """``gk_report``."""

    EPOCH = 1  # the balancer pass's epoch
    LIMIT = 2  # at most this many keys
    SHARDS = 3  # the app's shard count: the report marks the shard's keys global again


class GkOrderArg(IntEnum):
    """``gk_order``."""

    EPOCH = 1
    ORDERS = 2  # msgpack [GkOrderField entry, ..]


class PauseArg(IntEnum):
    """``pause``."""

    FIELD = 1  # the scope's field (fairlane.store.pausing.scope_field)
    FOR_MS = 2  # 0: until resumed
    WHY = 3  # JSON {reason, by, ...}
    CANCEL_RUNNING = 4  # 0/1
    FIRST_LANE = 5  # the app's lanes, flagged as having pauses


class ResumeArg(IntEnum):
    """``resume``."""

    FIELD = 1
    BUDGET = 2  # parked jobs moved back by this call


class UnofferArg(IntEnum):
    """``unoffer``."""

    FIRST_ID = 1  # jobs a throttle key woke (``w:<job>`` in the throttle hash)


class EstimateArg(IntEnum):
    """``estimate``: a waiting job by its id, or one not yet submitted by its names."""

    JOB = 1  # '': a job of the names below, as if submitted now
    TENANT = 2
    LANE = 3
    CLASS = 4
    TASK = 5
    MAX_TENANTS = 6  # waiting tenants of the class read one by one
    BEFORE = 7  # a job not yet submitted: the score it would take ('' the queue's end)


class LearnArg(IntEnum):
    """``learn_durations``."""

    ALPHA = 1  # what one attempt moves a learned mean by
    FIRST_ENTRY = 2  # triples: field (fairlane.store.durations), attempts, their sum (ms)


#: every function's arguments; the Lua names each by its class name (``WfStepArg.RUN``)
ARGV: Final[tuple[type[IntEnum], ...]] = (
    EstimateArg,
    LearnArg,
    PauseArg,
    ResumeArg,
    UnofferArg,
    GkEnableArg,
    GkReportArg,
    GkOrderArg,
    EnqueueArg,
    EnqueueAsArg,
    ExchangeArg,
    LeaveArg,
    AckArg,
    RenewArg,
    SweepArg,
    BeatArg,
    DeclareTaskArg,
    ClaimLayoutArg,
    ConfigureTenantArg,
    ConfigureLimitsArg,
    ConfigureClassesArg,
    DeclareLaneArg,
    DeclareAdmissionArg,
    DeclareBoundsArg,
    TenantLimitNowArg,
    CancelArg,
    DrainArg,
    WatchArg,
    RedriveArg,
    TenantSweepArg,
    WfLoadArg,
    WfStepArg,
    WfWaitArg,
    WfChildrenArg,
    SignalArg,
)


@cache
def _layout(fields: type[IntEnum]) -> tuple[tuple[str, ...], bool]:
    """The keywords of ``fields`` in place order, and whether a tail follows them."""
    members = list(fields)
    if [int(m) for m in members] != list(range(1, len(members) + 1)):
        raise ValueError(f"{fields.__name__}: places must run 1, 2, .. in declared order")
    tail = members[-1].name.startswith("FIRST_")
    return tuple(m.name.lower() for m in (members[:-1] if tail else members)), tail


def argv(fields: type[IntEnum], /, *tail: Any, **values: Any) -> list[Any]:
    """A function's arguments: ``values`` (keyword: a member's name in lower case) in
    ``fields``' order, then ``tail`` where the last member is a ``FIRST_*`` place.

    A missing or unknown name raises ``TypeError``. Trailing ``None`` values are left
    off (the Lua reads an absent argument as nil; the server takes no None)."""
    named, has_tail = _layout(fields)
    try:
        out = [values[name] for name in named]
    except KeyError as exc:
        raise TypeError(f"{fields.__name__}: missing {exc}") from None
    # every name was found: any further keyword is one the function does not take
    if len(values) != len(named):
        raise TypeError(f"{fields.__name__}: unknown {sorted(values.keys() - set(named))}")
    if tail:
        if not has_tail:
            raise TypeError(f"{fields.__name__} takes no tail")
        out.extend(tail)
    elif out[-1] is None:
        while out and out[-1] is None:
            out.pop()
    return out
