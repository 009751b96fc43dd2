"""A job's life in order: its logged events and those its record implies (``explain``'s
first step; the event kinds are in ``fairlane.insight.explain``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fairlane.store.fields import field_int, field_text
from fairlane.store.records import Event, JobRecord, from_hash

__all__ = ["FINAL", "as_record", "timeline"]

# the kinds that end a job: derived from its record now, logged by earlier versions
FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# events that end an attempt and keep its start, which the next attempt overwrites
_ATTEMPT_ENDS = (
    "retry", "pushback", "handback", "reclaimed", "suspended", "released", "redriven"
)  # fmt: skip
# what may happen in the same millisecond as an attempt's start, after it
_AFTER_START = frozenset(
    {"retry", "pushback", "handback", "reclaimed", "suspended", "released", *FINAL}
)


def _error_type(err: Any) -> str:
    """The type of a recorded error (JSON ``{"type": ...}``), or ''."""
    try:
        value = json.loads(field_text(err))
    except ValueError:
        return ""
    return field_text(value.get("type")) if isinstance(value, dict) else ""


def _attempt(start: int, detail: Mapping[str, Any]) -> Event:
    kept = {
        k: detail[k] for k in ("wk", "att", "qw", "use") if detail.get(k) not in (None, b"", "")
    }
    return Event(start, "dispatched", kept, derived=True)


def _last_attempt(record: JobRecord) -> dict[str, Any]:
    """The record's last attempt as an event's detail, in the events' own names (what it
    reported of its time is on the record only once it ended the job)."""
    att = str(record.attempts) if record.attempts else None
    use = ",".join(map(str, record.reported_ms)) if record.reported_ms else None
    return {"wk": record.worker, "att": att, "qw": record.queue_wait, "use": use}


def as_record(record: JobRecord | Mapping[str, Any]) -> JobRecord:
    """A typed record, from one already typed or a job hash's fields (bytes or text)."""
    if isinstance(record, JobRecord):
        return record
    return from_hash("", record) or JobRecord("")


def _ended(start: Event, other: Event) -> bool:
    """Whether ``other``, in the millisecond attempt ``start`` began, ended that attempt
    rather than an earlier one: a retry due at once is started again in the call that
    settled it, so both fall in one millisecond (the event names the start it ended)."""
    if other.kind not in _AFTER_START:
        return False
    began = field_int(other.detail.get("start"))
    return began is None or began == start.ms


def _insert(out: list[Event], ev: Event) -> None:
    """Put a derived event where it happened: by time, and within one millisecond
    a submission first, a start before what ended that attempt, an end last."""
    at = len(out)
    for i, other in enumerate(out):
        if other.ms > ev.ms or (
            other.ms == ev.ms
            and (
                ev.kind == "submitted"
                or (ev.kind == "dispatched" and _ended(ev, other))
                or (ev.kind in FINAL and other.kind == "redriven")
            )
        ):
            at = i
            break
    out.insert(at, ev)


def timeline(record: JobRecord | Mapping[str, Any], events: Sequence[Event]) -> list[Event]:
    """The job's life in order: its logged events and those its record implies.

    The record gives the submission (``enq``; a deferral logs its own), the last
    attempt's start (``start``, ``wk``, ``att``, ``qw``; ``use``, what it reported of
    its time) and the end (``st``, ``fin``, ``err``); events that ended earlier attempts
    keep those attempts' starts (and ``use``). A kind
    the events already hold (as logged by earlier versions) is not derived again."""
    record = as_record(record)
    cls = record.service_class
    logged = sorted(events, key=lambda e: e.ms)
    kinds = {e.kind for e in logged}
    derived: list[Event] = []
    enq = record.enqueued_ms
    # a job scheduled at enqueue logs that; a submission at the same instant adds nothing
    scheduled_at_once = any(e.kind == "scheduled" and e.ms == enq for e in logged)
    if "submitted" not in kinds and enq is not None and not scheduled_at_once:
        derived.append(Event(enq, "submitted", {"v": "accepted", "cls": cls}, derived=True))
    if "dispatched" not in kinds:
        starts: dict[int, Event] = {}
        for e in logged:
            start = field_int(e.detail.get("start")) if e.kind in _ATTEMPT_ENDS else None
            if start is not None and start not in starts:
                starts[start] = _attempt(start, e.detail)
        start = record.started_ms
        if start is not None and start not in starts:
            starts[start] = _attempt(start, _last_attempt(record))
        derived.extend(starts[ms] for ms in sorted(starts))
    if not kinds & FINAL:
        for e in logged:
            fin = field_int(e.detail.get("fin")) if e.kind == "redriven" else None
            if fin is not None:
                derived.append(Event(fin, "failed", {"err": field_text(e.detail.get("err"))}, True))
        status, fin = record.status, record.finished_ms
        if status in FINAL and fin is not None:
            err = _error_type(record.error) if status != "completed" else ""
            derived.append(Event(fin, status, {"err": err} if err else {}, derived=True))
    out = list(logged)
    for ev in derived:
        _insert(out, ev)
    return out
