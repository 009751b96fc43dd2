"""Where a job's time went, and why: its record and lifecycle events turned into one answer.

A job's record (``JOB_FIELDS``) already says when it was enqueued (``enq``), when its
last attempt started, where and which one it was (``start``, ``wk``, ``att``), and how
and when it ended (``st``, ``fin``, ``err``). The store's scripts log to ``ev:<id>``
only what the record cannot tell, with the server's clock
(``fairlane/store/keys.py``), so that a job accepted, dispatched at once and completed
logs nothing. Each event is ``[ms, kind, detail]``:

==============  =============================================================
kind            detail
==============  =============================================================
``submitted``   only for a deferral: ``v`` deferred, ``why`` the reason,
                ``cls`` its service class
``scheduled``   ``at``: it may start at this time (a delay or ``at=``)
``admitted``    ``at``: a deferred job was admitted; it may start at ``at``
``due``         a scheduled job became due and joined its tenant's queue (``v``
                deferred and ``why``: a retry that admission deferred instead)
``parked``      ``key``: dispatch parked it on this full throttle key, or on this
                rate key short of tokens or paused, in its tenant's group of the
                key's waiters
``granted``     ``key``: this key woke it (the key serves its waiting tenants
                fairly): it is back in its tenant's queue with an offer on each
                of its keys, which it takes with its worker slot (logged as
                ``tok`` by earlier versions, which held the grant while queued)
``pushback``    the task raised ``Throttled`` for a key it holds (``key``, when
                logged; else the job's only key), which is paused until ``at``;
                the job is due again then, its attempt given back; the pushed
                attempt's ``start``, ``wk``, ``att``, ``qw``. Past the bound it
                is an ordinary ``retry``
``retry``       ``delay`` ms, ``err`` error type, ``at`` when it is due again;
                the failed attempt's ``start``, ``wk``, ``att`` and ``qw``
``handback``    the worker could not run it (``err`` UnknownTask: the task is not
                in that worker; MalformedArguments: the arguments do not fit
                its signature there), as in a rolling deploy: due again at
                ``at``, its attempt given back; the attempt's ``start``, ``wk``,
                ``att``, ``qw``
``suspended``   ``wait`` what a workflow run waits for, ``at`` its wake-up; the
                slice's ``start``, ``wk``, ``att``, ``qw``
``reclaimed``   ``wk``, ``att``, ``start``, ``qw``: the lease expired, the worker
                was lost
``released``    ``start``, ``wk``: a stopping worker handed it back unstarted
``redriven``    a dead letter sent back to its queue; its first life's last
                attempt (``start``, ``wk``, ``att``, ``qw``) and end (``fin``,
                ``err``), which the record forgets
==============  =============================================================

``qw`` (a record field, and copied into the events above) is dispatch's view of why a
job that waited starts only now, JSON: ``by`` maps each other class that held more
than its assured slots (it was borrowing the capacity the job's class was owed) to
``[held, assured]``; ``ten`` counts the other tenants fair dispatch was sharing the
job's class with. It is written with the start of the attempt, so it costs no command.

A job on rate keys is explained with what its record and the keys say now
(``fairlane.store.views.rates.JobRates``, passed in as ``rates``): a key it parked on
is named with its rate, and, while it still waits, when the key's next tokens are due
and a pause with its cause.

Jobs logged by earlier versions of the store carry ``dispatched`` and final events
(``completed``, ``failed``, ``cancelled``, ``expired``) as well; they are read as they
are.

:func:`timeline` merges the events with those the record implies (marked
``derived``); :func:`explain` walks that timeline and returns an :class:`Explanation`:
segments of time each with what the job was doing, why (a sentence, a ``cause`` and
what it names), and one summary sentence. Both are pure.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairlane.policy.rates import Rate
from fairlane.store.fields import field_int, field_text
from fairlane.store.records import Event, JobRecord, from_hash
from fairlane.store.views.rates import JobRates, RateKeyView

__all__ = [
    "Explanation",
    "Segment",
    "as_record",
    "explain",
    "format_ms",
    "rate_keys_now",
    "rate_now",
    "rate_text",
    "timeline",
]

_FINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# events that end an attempt and keep its start, which the next attempt overwrites
_ATTEMPT_ENDS = (
    "retry", "pushback", "handback", "reclaimed", "suspended", "released", "redriven"
)  # fmt: skip
# what may happen in the same millisecond as an attempt's start, after it
_AFTER_START = frozenset(
    {"retry", "pushback", "handback", "reclaimed", "suspended", "released", *_FINAL}
)


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of a job's life: ``what`` it was doing from ``from_ms`` to ``to_ms``, and why.

    ``what`` is one of queued, deferred, scheduled, parked, paused, backoff, suspended,
    running.
    ``open`` marks the segment still going on (it ends at the time of the question).
    ``cause`` says why it waited, in one word: ``slot`` (a free worker slot, nothing
    else recorded), ``class`` (other classes were borrowing its class's capacity),
    ``tenants`` (fair dispatch shared its class with other tenants), ``throttle``,
    ``rate`` (a rate key short of tokens or paused), ``pushback`` (its own attempt was
    pushed back by the upstream), ``admission``, ``schedule``, ``backoff``, ``deploy``
    (a worker that could not run it handed it back) or ``workflow``; ``about`` what
    that cause names: the borrowing classes, the throttle or rate key, the deferral
    reason, the error. A running segment has no cause but
    ``pushback`` when the upstream pushed that attempt back (its attempt given back)."""

    from_ms: int
    to_ms: int
    what: str
    why: str
    open: bool = False
    worker: str = ""
    attempt: int = 0
    cause: str = ""
    about: tuple[str, ...] = ()

    @property
    def ms(self) -> int:
        return max(0, self.to_ms - self.from_ms)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a job's time went: its segments in order, the totals, and one sentence.

    ``causes`` lists the causes of its waiting, first seen first; ``events`` is the
    timeline the answer was read from (see :func:`timeline`)."""

    status: str
    segments: tuple[Segment, ...]
    waited_ms: int
    ran_ms: int
    summary: str
    causes: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    fairness_key: str = ""
    """The end user of its tenant it was enqueued for ('' none): its place in the
    tenant's queue is that key's fair share (``fairlane.policy.fairkeys``)."""


def format_ms(ms: int) -> str:
    """A duration as people read it: ``12 ms``, ``4.2 s``, ``3.5 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def _error_type(err: Any) -> str:
    """The type of a recorded error (JSON ``{"type": ...}``), or ''."""
    try:
        value = json.loads(field_text(err))
    except ValueError:
        return ""
    return field_text(value.get("type")) if isinstance(value, dict) else ""


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _names(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(frozen=True, slots=True)
class _Why:
    why: str
    cause: str
    about: tuple[str, ...] = ()


def _queued_why(qw: Any, cls: str) -> _Why | None:
    """Dispatch's ``qw`` view of a wait in words, or None when it says nothing."""
    text = field_text(qw)
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    by = data.get("by") if isinstance(data.get("by"), dict) else {}
    rivals = field_int(data.get("ten")) or 0
    parts: list[str] = []
    borrowers: list[str] = []
    if by:
        shown = []
        for name in sorted(by):
            held = by[name] if isinstance(by[name], list) and len(by[name]) == 2 else ["?", "?"]
            borrowers.append(name)
            shown.append(f"{name} (holding {held[0]} slots, its share {held[1]})")
        who = f"class {shown[0]} was" if len(shown) == 1 else f"classes {_names(shown)} were"
        parts.append(f"waited for capacity in class {cls} while {who} borrowing")
    if rivals > 0:
        tenants = _plural(rivals, "other tenant", "other tenants")
        if parts:
            parts.append(f"fair dispatch shared it with {tenants}")
        else:
            parts.append(
                f"queued behind other tenants' work in class {cls} "
                f"(fair dispatch shared it with {tenants})"
            )
    if not parts:
        return None
    return _Why(", and ".join(parts), "class" if borrowers else "tenants", tuple(borrowers))


def _number(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) and abs(x) >= 1000 else f"{x:g}"


def rate_text(rate: Rate) -> str:
    """A rate as people read it: ``2 per 1 s, burst 2``; ``90,000 units per 60 s, ...``."""
    what = " units" if rate.units else ""
    return f"{_number(rate.limit)}{what} per {_number(rate.per)} s, burst {_number(rate.capacity)}"


def _later(at: int, now: int) -> str:
    return "now" if at <= now else f"in {format_ms(at - now)}"


def rate_now(view: RateKeyView, cost: float = 1.0) -> str:
    """What a rate key says now to a job of ``cost`` waiting on it: a pause and its
    cause, when its next tokens are due; '' when nothing holds it."""
    parts: list[str] = []
    if view.paused and view.paused_until_ms is not None:
        cause = f" ({view.pause_cause})" if view.pause_cause else ""
        parts.append(
            f"the key is paused{cause} for {format_ms(view.paused_until_ms - view.now_ms)} more"
        )
    due = view.due_ms if view.due_ms is not None else view.next_tokens_ms(cost)
    if due is not None and due > view.now_ms:
        parts.append(f"its next tokens are due {_later(due, view.now_ms)}")
    return ", ".join(parts)


def rate_keys_now(rates: JobRates) -> list[dict[str, Any]]:
    """A job's rate and adaptive keys with their state now, as plain values (the
    command line's JSON and the dashboard's job detail): its rate, its cost on it, the
    key's tokens, pause, cause and due time, an adaptive key's limit and bounds, and a
    sentence."""
    rows: list[dict[str, Any]] = []
    for key in sorted({*rates.rates, *rates.adaptive}):
        rate, view, bounds = rates.rates.get(key), rates.keys.get(key), rates.adaptive.get(key)
        cost = rates.cost(key) if rate is not None else None
        parts = [rate_text(rate)] if rate is not None else []
        limit = view.adaptive_limit if view is not None else None
        if bounds is not None:
            limit = limit if limit is not None else bounds.max
            parts.append(f"adaptive limit {limit} in [{bounds.min}, {bounds.max}]")
        if view is not None and view.tokens is not None and rate is not None:
            parts.append(f"{view.tokens:.2f} tokens now")
        told = rate_now(view, cost or 1.0) if view is not None and rate is not None else ""
        rows.append(
            {
                "key": key,
                "rate": None
                if rate is None
                else {
                    "limit": rate.limit,
                    "per": rate.per,
                    "burst": rate.capacity,
                    "cost": rate.cost,
                },
                "cost": cost,
                "tokens": view.tokens if view is not None else None,
                "paused_until_ms": view.paused_until_ms if view is not None else None,
                "pause_cause": view.pause_cause if view is not None else "",
                "due_ms": view.due_ms if view is not None else None,
                "adaptive": None
                if bounds is None
                else {"limit": limit, "max": bounds.max, "min": bounds.min},
                "text": f"key {key}: " + "; ".join(parts) + (f"; {told}" if told else ""),
            }
        )
    return rows


class _Walk:
    """The state of a walk through the timeline: the segment open and what is known."""

    def __init__(self, record: JobRecord, rates: JobRates | None = None) -> None:
        self.cls = record.service_class
        self.record = record
        self.rates = rates or JobRates()
        self.segments: list[Segment] = []
        self.state: tuple[str, _Why] | None = None
        self.since = 0
        self.running: dict[str, Any] = {}

    def close(self, ms: int, *, why: _Why | None = None, still: bool = False) -> None:
        if self.state is not None:
            what, reason = self.state
            worker, att = "", 0
            if what == "running":
                worker, att = self.running.get("worker", ""), self.running.get("attempt", 0)
            reason = why or reason
            self.segments.append(
                Segment(
                    self.since,
                    ms,
                    what,
                    reason.why,
                    still,
                    worker,
                    att,
                    reason.cause,
                    reason.about,
                )
            )
        self.state = None

    def open(self, ms: int, what: str, why: _Why) -> None:
        self.close(ms)
        self.state, self.since = (what, why), ms

    def queued(self, ms: int) -> None:
        self.open(ms, "queued", _Why(f"queued for a worker slot in class {self.cls}", "slot"))

    def deferred(self, ms: int, reason: Any, cls: Any) -> None:
        where, because = field_text(cls) or self.cls, field_text(reason) or "?"
        self.open(
            ms,
            "deferred",
            _Why(f"deferred by admission ({because} in {where})", "admission", (because,)),
        )

    def from_now_or_later(self, ms: int, at: Any) -> None:
        until = field_int(at)
        if until is not None and until > ms:
            later = f"scheduled to start {format_ms(until - ms)} later"
            self.open(ms, "scheduled", _Why(later, "schedule"))
        else:
            self.queued(ms)

    def end_running(self, ms: int, how: str) -> None:
        if self.state and self.state[0] == "running":
            run = self.state[1]
            self.close(ms, why=_Why(f"{run.why}, {how}", run.cause, run.about))

    def parked(self, ms: int, key: str, why: str = "") -> None:
        limit = self.record.limits.get(key)
        rate = self.rates.rates.get(key)
        if rate is not None and why != "room":
            shown = rate_text(rate) + (f"; limit {limit}" if limit is not None else "")
            paused = " (paused)" if why == "pause" else ""
            self.open(
                ms,
                "parked",
                _Why(
                    f"parked on rate key {key}{paused} ({shown}) in its tenant's group",
                    "rate",
                    (key,),
                ),
            )
            return
        shown = f" (limit {limit})" if limit is not None else ""
        why_ = _Why(
            f"parked on throttle key {key or '?'}{shown} in its tenant's group",
            "throttle",
            (key,),
        )
        self.open(ms, "parked", why_)

    def woken(self, ms: int, key: str) -> None:
        # the wake is fair between the key's tenants; the offer is not a slot: the job
        # takes the key's slot in the same step as a worker slot, so this is lane time
        kind = "rate key" if key in self.rates.rates else "throttle key"
        by = f"{kind} {key}" if key else "its throttle key"
        taken = ", its tokens taken" if key in self.rates.rates else ""
        why = _Why(
            f"woken by {by}{taken} (its waiters served fairly by tenant), back in its "
            f"tenant's queue in class {self.cls} with an offer on its keys, taking the "
            "key's slot with a worker slot",
            "slot",
        )
        self.open(ms, "queued", why)

    def pushed_back(self, ms: int, d: Mapping[str, Any]) -> None:
        # the event names its key when the store logs it; else the job's only key is it
        held = {*self.rates.rates, *self.rates.adaptive, *self.record.limits}
        key = field_text(d.get("key")) or (next(iter(held)) if len(held) == 1 else "")
        self._pushed_run(ms, key)
        if not key:
            self.open(
                ms,
                "paused",
                _Why(
                    "one of its keys paused by the upstream's pushback, due again at the "
                    "pause's end with its attempt given back",
                    "pushback",
                ),
            )
            return
        until = field_int(d.get("until")) or field_int(d.get("at"))
        rate = self.rates.rates.get(key)
        shown = f" ({rate_text(rate)})" if rate is not None else ""
        pause = f" for {format_ms(until - ms)}" if until is not None and until > ms else ""
        self.open(
            ms,
            "paused",
            _Why(
                f"key {key}{shown} paused{pause} by the upstream's pushback, due again at "
                "the pause's end with its attempt given back",
                "pushback",
                (key,),
            ),
        )

    def _pushed_run(self, ms: int, key: str) -> None:
        """End the running attempt the upstream pushed back: its cause says so (the
        attempt is given back, so its number is not the job's count)."""
        on = f"key {key}" if key else "one of its keys"
        self.end_running(ms, f"pushed back by the upstream on {on} (Throttled)")
        last = self.segments[-1] if self.segments else None
        if last is not None and last.what == "running" and last.to_ms == ms:
            about = (key,) if key else ()
            self.segments[-1] = dataclasses.replace(last, cause="pushback", about=about)

    def live(self) -> None:
        """The segment still open, told what its rate key says now."""
        if self.state is None or self.state[0] not in ("parked", "paused"):
            return
        what, reason = self.state
        if reason.cause not in ("rate", "pushback") or not reason.about:
            return
        key = reason.about[0]
        view = self.rates.keys.get(key)
        told = rate_now(view, self.rates.cost(key)) if view is not None else ""
        if told:
            self.state = (what, _Why(f"{reason.why}; {told}", reason.cause, reason.about))

    def dispatched(self, ms: int, d: Mapping[str, Any]) -> None:
        if self.state and self.state[0] == "queued":
            told = _queued_why(d.get("qw"), self.cls)
            if told is not None:
                self.close(ms, why=told)
        worker, att = field_text(d.get("wk")) or "?", field_int(d.get("att")) or 0
        self.running = {"worker": worker, "attempt": att}
        shown = f"attempt {att} on worker {worker}" if att else f"on worker {worker}"
        self.open(ms, "running", _Why(shown, ""))

    def step(self, ev: Event) -> None:  # noqa: C901, PLR0912 - one branch per kind
        d, ms = ev.detail, ev.ms
        if d.get("cls"):
            self.cls = field_text(d["cls"])
        match ev.kind:
            case "submitted" | "due":
                if d.get("v") == "deferred":
                    self.deferred(ms, d.get("why"), d.get("cls"))
                else:
                    self.queued(ms)
            case "scheduled" | "admitted":
                self.from_now_or_later(ms, d.get("at"))
            case "parked":
                self.parked(ms, field_text(d.get("key")), field_text(d.get("why")))
            case "granted":
                self.woken(ms, field_text(d.get("key")))
            case "dispatched":
                self.dispatched(ms, d)
            case "pushback":
                self.pushed_back(ms, d)
            case "retry":
                err = field_text(d.get("err")) or "an error"
                self.end_running(ms, f"failed with {err}")
                delay = field_int(d.get("delay"))
                shown = format_ms(delay) if delay is not None else "a"
                self.open(
                    ms, "backoff", _Why(f"retry backoff ({shown} after {err})", "backoff", (err,))
                )
            case "handback":
                err = field_text(d.get("err")) or "an error"
                self.end_running(ms, f"handed back ({err}: that worker could not run it)")
                self.open(
                    ms,
                    "backoff",
                    _Why(f"handed back for another worker to run ({err})", "deploy", (err,)),
                )
            case "reclaimed":
                self.end_running(ms, "lost (its lease expired)")
            case "suspended":
                wait = field_text(d.get("wait")) or "something"
                self.end_running(ms, "suspended")
                self.open(
                    ms, "suspended", _Why(f"suspended waiting for {wait}", "workflow", (wait,))
                )
            case "released":
                self.end_running(ms, "handed back unstarted by its stopping worker")
                self.queued(ms)
            case "redriven":
                self.queued(ms)
            case kind if kind in _FINAL:
                if kind != "completed":
                    err = field_text(d.get("err"))
                    self.end_running(ms, kind + (f" ({err})" if err else ""))
                self.close(ms)
            case _:
                pass


def _attempt(start: int, detail: Mapping[str, Any]) -> Event:
    kept = {k: detail[k] for k in ("wk", "att", "qw") if detail.get(k) not in (None, b"", "")}
    return Event(start, "dispatched", kept, derived=True)


def _last_attempt(record: JobRecord) -> dict[str, Any]:
    """The record's last attempt as an event's detail, in the events' own names."""
    att = str(record.attempts) if record.attempts else None
    return {"wk": record.worker, "att": att, "qw": record.queue_wait}


def as_record(record: JobRecord | Mapping[str, Any]) -> JobRecord:
    """A typed record, from one already typed or a job hash's fields (bytes or text)."""
    if isinstance(record, JobRecord):
        return record
    return from_hash("", record) or JobRecord("")


def _insert(out: list[Event], ev: Event) -> None:
    """Put a derived event where it happened: by time, and within one millisecond
    a submission first, a start before what ended that attempt, an end last."""
    at = len(out)
    for i, other in enumerate(out):
        if other.ms > ev.ms or (
            other.ms == ev.ms
            and (
                ev.kind == "submitted"
                or (ev.kind == "dispatched" and other.kind in _AFTER_START)
                or (ev.kind in _FINAL and other.kind == "redriven")
            )
        ):
            at = i
            break
    out.insert(at, ev)


def timeline(record: JobRecord | Mapping[str, Any], events: Sequence[Event]) -> list[Event]:
    """The job's life in order: its logged events and those its record implies.

    The record gives the submission (``enq``; a deferral logs its own), the last
    attempt's start (``start``, ``wk``, ``att``, ``qw``) and the end (``st``, ``fin``,
    ``err``); events that ended earlier attempts keep those attempts' starts. A kind
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
    if not kinds & _FINAL:
        for e in logged:
            fin = field_int(e.detail.get("fin")) if e.kind == "redriven" else None
            if fin is not None:
                derived.append(Event(fin, "failed", {"err": field_text(e.detail.get("err"))}, True))
        status, fin = record.status, record.finished_ms
        if status in _FINAL and fin is not None:
            err = _error_type(record.error) if status != "completed" else ""
            derived.append(Event(fin, status, {"err": err} if err else {}, derived=True))
    out = list(logged)
    for ev in derived:
        _insert(out, ev)
    return out


def _summary(status: str, segments: Sequence[Segment], max_attempts: int | None) -> str:
    waits = [s for s in segments if s.what != "running"]
    runs = [s for s in segments if s.what == "running"]
    parts: list[str] = []
    if waits:
        by_reason: dict[str, int] = {}
        for s in waits:
            by_reason[s.why] = by_reason.get(s.why, 0) + s.ms
        waited = sum(by_reason.values())
        detail = ", ".join(f"{format_ms(ms)} {why}" for why, ms in by_reason.items())
        ongoing = " so far" if waits[-1].open else ""
        parts.append(f"waited {format_ms(waited)}{ongoing}: {detail}")
    if runs:
        last = runs[-1]
        notes = [f"attempt {last.attempt}" + (f" of {max_attempts}" if max_attempts else "")]
        if last.cause == "pushback":  # the attempt was given back: no number to show
            notes = ["pushed back by the upstream, its attempt given back"]
        before = segments[: segments.index(last)]
        backoffs = [s for s in before if s.what == "backoff" and s.cause == "backoff"]
        if backoffs:
            notes.append(f"after a {format_ms(backoffs[-1].ms)} retry backoff")
        if len(runs) > 1:
            earlier = sum(s.ms for s in runs[:-1])
            notes.append(f"earlier attempts ran {format_ms(earlier)}")
        verb = "running for" if last.open else "ran"
        so_far = " so far" if last.open else ""
        parts.append(
            f"{verb} {format_ms(last.ms)}{so_far} on worker {last.worker} ({', '.join(notes)})"
        )
    elif status not in _FINAL:
        parts.append("not started yet")
    if status in _FINAL:
        parts.append(status)
    elif not parts:
        parts.append(f"status {status or 'unknown'}")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


def explain(
    record: JobRecord | Mapping[str, Any],
    events: Sequence[Event],
    *,
    now_ms: int | None = None,
    rates: JobRates | None = None,
) -> Explanation:
    """Explain a job from its record (a ``JobRecord``, or the hash's fields as bytes or
    text) and its events; ``rates``: its rate keys and their state now
    (``fairlane.store.views.rates.job_rates``).

    A job not finished yet has its last segment end at ``now_ms`` (server time), or at its
    last event when ``now_ms`` is not given."""
    record = as_record(record)
    status = record.status
    ordered = timeline(record, events)
    walk = _Walk(record, rates)
    for ev in ordered:
        walk.step(ev)
    if walk.state is not None:
        walk.live()
        end = max(now_ms if now_ms is not None else walk.since, walk.since)
        walk.close(end, still=True)
    segments = tuple(walk.segments)
    ran = sum(s.ms for s in segments if s.what == "running")
    waited = sum(s.ms for s in segments if s.what != "running")
    causes = tuple(dict.fromkeys(s.cause for s in segments if s.what != "running" and s.cause))
    return Explanation(
        status=status,
        segments=segments,
        waited_ms=waited,
        ran_ms=ran,
        summary=_summary(status, segments, record.max_attempts),
        causes=causes,
        events=tuple(ordered),
        fairness_key=record.fairness_key,
    )
