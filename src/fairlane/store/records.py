"""A job's record and its lifecycle events, decoded in one place.

The scripts write a job's hash (``job:<id>``, its fields listed in ``JOB_FIELDS``) and
its event list (``ev:<id>``); every reader outside the store -- ``Job.info()``,
``explain``, a run's view, the dashboard, the command line, the demo -- reads them as
:class:`JobRecord` and :class:`Event`, never by field name.

A record read to be shown may hold fields damaged outside Fairlane (a worker
dead-letters such a job as ``MalformedJob``), so decoding is lenient, as
``fairlane.store.fields`` reads: a field that does not parse reads as its default and
hides nothing else. The scripts and the worker read strictly; this is for readers.

A reader that needs a few fields of many jobs reads a *projection* (``OWNER``,
``LISTING``, ...: attribute names of :class:`JobRecord`), which :func:`job_fields`
turns into the hash fields to ``HMGET`` and :func:`from_values` back into a record;
the attributes it did not read keep their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal

import msgspec

from fairlane.codec import ErrorInfo, decode_error
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import RECORD_DEFAULTS

__all__ = [
    "AGE",
    "DEFAULT_CLASS",
    "DELAYS",
    "LISTING",
    "OWNER",
    "PLACEMENT",
    "STATUS",
    "TIMES",
    "Event",
    "JobAttr",
    "JobRecord",
    "decode_event",
    "decode_limits",
    "decode_reported",
    "from_hash",
    "from_values",
    "job_fields",
]

_MSGPACK: Final = msgspec.msgpack.Decoder()
DEFAULT_CLASS: Final = RECORD_DEFAULTS["cls"]


class Event(msgspec.Struct, frozen=True):
    """One lifecycle event: server time (ms), kind and its detail fields.

    ``derived`` marks an event rebuilt from the job's record rather than logged."""

    ms: int
    kind: str
    detail: dict[str, Any] = msgspec.field(default_factory=dict)
    derived: bool = False


def decode_event(raw: bytes) -> Event:
    """An ``ev:<id>`` entry as the scripts pack it (msgpack ``[ms, kind, detail]``)."""
    value = _MSGPACK.decode(raw)
    if not isinstance(value, list) or len(value) < 2 or not isinstance(value[0], int):
        raise ValueError(f"not a lifecycle event: {raw!r}")
    detail = value[2] if len(value) > 2 and isinstance(value[2], dict) else {}
    return Event(int(value[0]), str(value[1]), {str(k): v for k, v in detail.items()})


def decode_limits(raw: Any) -> dict[str, int]:
    """A job's throttle limits (msgpack ``[[key, limit], ..]``, an adaptive key's entry
    ``[key, max, min]`` read as its max): each entry that reads as a key and a whole
    number; none when the field is absent or not msgpack."""
    if not raw:
        return {}
    try:
        entries = _MSGPACK.decode(raw if isinstance(raw, bytes) else field_text(raw).encode())
    except (msgspec.DecodeError, UnicodeEncodeError):
        return {}
    out: dict[str, int] = {}
    for entry in entries if isinstance(entries, list) else ():
        if isinstance(entry, list) and len(entry) in (2, 3):
            limit = field_int(entry[1])
            if limit is not None:
                out[field_text(entry[0])] = limit
    return out


class JobRecord(msgspec.Struct, frozen=True):
    """A job's hash, typed. Text fields are ``""`` and numbers None when absent (or
    damaged); blobs (arguments, result, error) stay as stored."""

    id: str
    task: str = ""
    tenant: str = ""
    lane: str = ""
    service_class: str = DEFAULT_CLASS
    priority: int = 0
    status: str = ""
    attempts: int = 0
    max_attempts: int | None = None
    enqueued_ms: int | None = None
    run_ms: int | None = None
    """When its last attempt became eligible to run (after any delay or backoff)."""
    started_ms: int | None = None
    finished_ms: int | None = None
    worker: str = ""
    slots: int = 1
    args: bytes = b""
    result: bytes = b""
    error: bytes = b""
    cancel_requested: bool = False
    limits: dict[str, int] = msgspec.field(default_factory=dict)
    kept_mu: int | None = None
    deferred_mu: int | None = None
    charged_mu: int | None = None
    used_mu: int | None = None
    parent: str = ""
    run_started: bool = False
    """A workflow run that has started (it has ``run:<id>:*`` keys)."""
    waiting_for: str = ""
    queue_wait: str = ""
    """Dispatch's view of why its last attempt waited (JSON; ``fairlane.insight.explain``)."""
    trace_context: str = ""
    fairness_key: str = ""
    """Whose share of its tenant's part it takes ('' none)."""
    deadline_ms: int | None = None
    """Past this server time it expires instead of running (None: no deadline)."""
    idempotency_key: str = ""
    """The key that names it to a repeated submission ('' none)."""
    paused_under: str = ""
    """The pause-table field of the operator's pause that parked it ('' none:
    ``fairlane.store.pausing.field_scope`` reads it)."""
    reported_ms: tuple[int, int] | None = None
    """What the attempt that ended it reported of its time in model calls and in tool
    calls, in ms (None: nothing reported, or it has not ended)."""

    @property
    def failure(self) -> ErrorInfo | None:
        """The recorded error (type, message, traceback), None when there is none."""
        return decode_error(self.error) if self.error else None

    @property
    def reserved_mu(self) -> int | None:
        """Milli-units admission reserved for it, or will once a deferred job is admitted."""
        return self.kept_mu if self.kept_mu is not None else self.deferred_mu


JobAttr = Literal[
    "task",
    "tenant",
    "lane",
    "service_class",
    "priority",
    "status",
    "attempts",
    "max_attempts",
    "enqueued_ms",
    "run_ms",
    "started_ms",
    "finished_ms",
    "worker",
    "slots",
    "args",
    "result",
    "error",
    "cancel_requested",
    "limits",
    "kept_mu",
    "deferred_mu",
    "charged_mu",
    "used_mu",
    "parent",
    "run_started",
    "waiting_for",
    "queue_wait",
    "trace_context",
    "fairness_key",
    "deadline_ms",
    "idempotency_key",
    "paused_under",
    "reported_ms",
]


def _blob(value: Any) -> bytes:
    if value is None:
        return b""
    return value if isinstance(value, bytes) else field_text(value).encode()


def _flag(value: Any) -> bool:
    # the scripts write "1"; a reader has always taken any value as set
    return bool(field_text(value))


def _text_or(default: str) -> Callable[[Any], str]:
    return lambda value: field_text(value) or default


def _int_or(default: int) -> Callable[[Any], int]:
    return lambda value: field_int(value, default)


def decode_reported(value: Any) -> tuple[int, int] | None:
    """What an attempt reported of its time (``use``, a record field and an event's
    detail: ``'<model ms>,<tool ms>'``) as (model ms, tool ms); None when absent or
    damaged."""
    model, _, tool = field_text(value).partition(",")
    m, t = field_int(model), field_int(tool)
    if m is None or t is None or m < 0 or t < 0:
        return None
    return m, t


#: attribute -> (hash field, how its value reads)
_FIELDS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "task": ("task", field_text),
    "tenant": ("tenant", _text_or(RECORD_DEFAULTS["tenant"])),
    "lane": ("lane", _text_or(RECORD_DEFAULTS["lane"])),
    "service_class": ("cls", _text_or(DEFAULT_CLASS)),
    "priority": ("prio", _int_or(0)),
    "status": ("st", field_text),
    "attempts": ("att", _int_or(0)),
    "max_attempts": ("max", _int_or(int(RECORD_DEFAULTS["max"]))),
    "enqueued_ms": ("enq", field_int),
    "run_ms": ("run", field_int),
    "started_ms": ("start", field_int),
    "finished_ms": ("fin", field_int),
    "worker": ("wk", field_text),
    "slots": ("sl", _int_or(1)),
    "args": ("args", _blob),
    "result": ("res", _blob),
    "error": ("err", _blob),
    "cancel_requested": ("cx", _flag),
    "limits": ("lim", decode_limits),
    "kept_mu": ("emu", field_int),
    "deferred_mu": ("dmu", field_int),
    "charged_mu": ("cu", field_int),
    "used_mu": ("amu", field_int),
    "parent": ("par", field_text),
    "run_started": ("wfr", _flag),
    "waiting_for": ("wf", field_text),
    "queue_wait": ("qw", field_text),
    "trace_context": ("tp", field_text),
    "fairness_key": ("fk", field_text),
    "deadline_ms": ("dl", field_int),
    "idempotency_key": ("idem", field_text),
    "paused_under": ("pz", field_text),
    "reported_ms": ("use", decode_reported),
}

#: who a job belongs to: enough to check a caller may see it, and what it runs
OWNER: Final[tuple[JobAttr, ...]] = ("tenant", "task")
#: its status alone
STATUS: Final[tuple[JobAttr, ...]] = ("status",)
#: where it runs and how wide it is
PLACEMENT: Final[tuple[JobAttr, ...]] = ("lane", "service_class", "tenant", "slots")
#: when it was due and started, and where (start delays)
DELAYS: Final[tuple[JobAttr, ...]] = ("lane", "service_class", "tenant", "run_ms", "started_ms")
#: when it became eligible to run (the age of a waiting job)
AGE: Final[tuple[JobAttr, ...]] = ("run_ms", "enqueued_ms")
#: status, times and attempts
TIMES: Final[tuple[JobAttr, ...]] = (
    "status",
    "enqueued_ms",
    "run_ms",
    "started_ms",
    "finished_ms",
    "attempts",
)
#: a row of a listing
LISTING: Final[tuple[JobAttr, ...]] = (
    "task",
    "tenant",
    "lane",
    "service_class",
    "status",
    "attempts",
    "max_attempts",
    "enqueued_ms",
    "started_ms",
    "finished_ms",
    "error",
    "waiting_for",
)


#: read with every projection, after its own fields: the status, which every record
#: holds (a record without one is no record), and when it was enqueued, which an absent
#: ``run`` reads as (the scripts leave ``run`` out while it equals ``enq``)
_TAIL: Final = ("st", "enq")


def job_fields(only: Sequence[JobAttr]) -> list[str]:
    """The hash fields holding the attributes ``only``, in that order, and ``_TAIL``."""
    return [*(_FIELDS[name][0] for name in only), *_TAIL]


def from_values(job_id: str, only: Sequence[JobAttr], values: Sequence[Any]) -> JobRecord | None:
    """A record of the attributes ``only`` from an ``HMGET`` of :func:`job_fields`
    (None when the job has no status: no record)."""
    *own, status, enqueued = values
    if status is None:
        return None
    read = {name: _FIELDS[name][1](value) for name, value in zip(only, own, strict=True)}
    if "run_ms" in read and read["run_ms"] is None:
        read["run_ms"] = field_int(enqueued)
    return JobRecord(job_id, **read)


def from_hash(job_id: str, raw: Mapping[Any, Any]) -> JobRecord | None:
    """A record from the whole hash (``HGETALL``; field names as bytes or text), None
    when it is empty: no such job, or its record was removed."""
    if not raw:
        return None
    fields = {field_text(k): v for k, v in raw.items()}
    read = {name: parse(fields.get(key)) for name, (key, parse) in _FIELDS.items()}
    if read["run_ms"] is None:
        read["run_ms"] = read["enqueued_ms"]
    return JobRecord(job_id, **read)
