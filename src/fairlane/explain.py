"""Where a job's time went, and why: its lifecycle events turned into one plain answer.

The store writes a job's lifecycle events to ``ev:<id>`` inside the scripts that
change its state, with the server's clock (``fairlane/store/keys.py``). Each is
``[ms, kind, detail]``:

==============  =============================================================
kind            detail
==============  =============================================================
``submitted``   ``v`` admission verdict (accepted | deferred), ``why`` the
                reason of a deferral, ``cls`` its service class
``scheduled``   ``at``: it may start at this time (a delay or ``at=``)
``admitted``    ``at``: a deferred job was admitted; it may start at ``at``
``due``         a scheduled job became due and joined its tenant's queue (``v``
                deferred and ``why``: a retry that admission deferred instead)
``parked``      ``key``: dispatch parked it on this full throttle key
``granted``     ``tok``: a throttle handed it a slot; it waits for a worker
``dispatched``  ``wk`` worker, ``att`` attempt, ``cls`` class
``retry``       ``delay`` ms, ``err`` error type, ``at`` when it is due again
``suspended``   ``wait`` what a workflow run waits for, ``at`` its wake-up
``reclaimed``   ``wk``, ``att``: the lease expired, the worker was lost
``released``    a stopping worker handed it back unstarted
``redriven``    a dead letter sent back to its queue
``completed``   --
``failed``      ``err`` (also ``cancelled`` and ``expired``)
==============  =============================================================

:func:`explain` is pure: it takes the job's record fields and its decoded events
and returns an :class:`Explanation`, segments of time each with what the job was
doing and why, and one summary sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = ["Event", "Explanation", "Segment", "decode_event", "explain", "format_ms"]

_DECODER = msgspec.msgpack.Decoder()
_FINAL = frozenset({"completed", "failed", "cancelled", "expired"})


@dataclass(frozen=True, slots=True)
class Event:
    """One lifecycle event: server time (ms), kind and its detail fields."""

    ms: int
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


def decode_event(raw: bytes) -> Event:
    """An ``ev:<id>`` entry as the scripts pack it (msgpack ``[ms, kind, detail]``)."""
    value = _DECODER.decode(raw)
    if not isinstance(value, list) or len(value) < 2:
        raise ValueError(f"not a lifecycle event: {raw!r}")
    detail = value[2] if len(value) > 2 and isinstance(value[2], dict) else {}
    return Event(int(value[0]), str(value[1]), {str(k): v for k, v in detail.items()})


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of a job's life: ``what`` it was doing from ``from_ms`` to ``to_ms``, and why.

    ``what`` is one of queued, deferred, scheduled, parked, backoff, suspended, running.
    ``open`` marks the segment still going on (it ends at the time of the question)."""

    from_ms: int
    to_ms: int
    what: str
    why: str
    open: bool = False
    worker: str = ""
    attempt: int = 0

    @property
    def ms(self) -> int:
        return max(0, self.to_ms - self.from_ms)


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a job's time went: its segments in order, the totals, and one sentence."""

    status: str
    segments: tuple[Segment, ...]
    waited_ms: int
    ran_ms: int
    summary: str


def format_ms(ms: int) -> str:
    """A duration as people read it: ``12 ms``, ``4.2 s``, ``3.5 min``."""
    if ms < 1000:
        return f"{ms} ms"
    if ms < 120_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 60_000:.1f} min"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _int(value: Any) -> int | None:
    try:
        return int(_text(value))
    except ValueError:
        return None


class _Walk:
    """The state of a walk through the events: the segment open and what is known."""

    def __init__(self, cls: str) -> None:
        self.cls = cls
        self.segments: list[Segment] = []
        self.state: tuple[str, str] | None = None
        self.since = 0
        self.running: dict[str, Any] = {}

    def close(self, ms: int, *, why: str | None = None, still: bool = False) -> None:
        if self.state is not None:
            what, reason = self.state
            worker, att = "", 0
            if what == "running":
                worker, att = self.running.get("worker", ""), self.running.get("attempt", 0)
            self.segments.append(Segment(self.since, ms, what, why or reason, still, worker, att))
        self.state = None

    def open(self, ms: int, what: str, why: str) -> None:
        self.close(ms)
        self.state, self.since = (what, why), ms

    def queued(self, ms: int) -> None:
        self.open(ms, "queued", f"queued behind fair dispatch in class {self.cls}")

    def deferred(self, ms: int, reason: Any, cls: Any) -> None:
        where = _text(cls) or self.cls
        self.open(ms, "deferred", f"deferred by admission ({_text(reason) or '?'} in {where})")

    def from_now_or_later(self, ms: int, at: Any) -> None:
        until = _int(at)
        if until is not None and until > ms:
            self.open(ms, "scheduled", f"scheduled to start {format_ms(until - ms)} later")
        else:
            self.queued(ms)

    def step(self, ev: Event) -> None:  # noqa: C901, PLR0912 - one branch per kind
        d, ms = ev.detail, ev.ms
        if d.get("cls"):
            self.cls = _text(d["cls"])
        match ev.kind:
            case "submitted":
                if d.get("v") == "deferred":
                    self.deferred(ms, d.get("why"), d.get("cls"))
                else:
                    self.queued(ms)
            case "scheduled" | "admitted":
                self.from_now_or_later(ms, d.get("at"))
            case "due":
                if d.get("v") == "deferred":
                    self.deferred(ms, d.get("why"), d.get("cls"))
                else:
                    self.queued(ms)
            case "parked":
                self.open(ms, "parked", f"parked on throttle key {_text(d.get('key')) or '?'}")
            case "granted":
                self.open(
                    ms,
                    "queued",
                    f"waiting for a worker slot in class {self.cls} after its throttle grant",
                )
            case "dispatched":
                worker, att = _text(d.get("wk")) or "?", _int(d.get("att")) or 0
                self.running = {"worker": worker, "attempt": att}
                self.open(ms, "running", f"attempt {att} on worker {worker}")
            case "retry":
                err = _text(d.get("err")) or "an error"
                if self.state and self.state[0] == "running":
                    self.close(ms, why=f"{self.state[1]}, failed with {err}")
                delay = _int(d.get("delay"))
                shown = format_ms(delay) if delay is not None else "a"
                self.open(ms, "backoff", f"retry backoff ({shown} after {err})")
            case "reclaimed":
                if self.state and self.state[0] == "running":
                    self.close(ms, why=f"{self.state[1]}, lost (its lease expired)")
            case "suspended":
                wait = _text(d.get("wait")) or "something"
                if self.state and self.state[0] == "running":
                    self.close(ms, why=f"{self.state[1]}, suspended")
                self.open(ms, "suspended", f"suspended waiting for {wait}")
            case "released" | "redriven":
                self.queued(ms)
            case kind if kind in _FINAL:
                if self.state and self.state[0] == "running" and kind != "completed":
                    err = _text(d.get("err"))
                    self.close(ms, why=f"{self.state[1]}, {kind}" + (f" ({err})" if err else ""))
                self.close(ms)
            case _:
                pass


def _fallback(record: Mapping[str, Any], cls: str) -> list[Event]:
    """Events rebuilt from the record alone (a job written before events were kept)."""
    events: list[Event] = []
    enq, start, fin = _int(record.get("enq")), _int(record.get("start")), _int(record.get("fin"))
    if enq is not None:
        events.append(Event(enq, "submitted", {"v": "accepted", "cls": cls}))
    if start is not None:
        wk = _text(record.get("wk")) or "?"
        events.append(Event(start, "dispatched", {"wk": wk, "att": _int(record.get("att")) or 1}))
    status = _text(record.get("st"))
    if fin is not None and status in _FINAL:
        events.append(Event(fin, status, {}))
    return events


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
        before = segments[: segments.index(last)]
        backoffs = [s for s in before if s.what == "backoff"]
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
    record: Mapping[str, Any], events: Sequence[Event], *, now_ms: int | None = None
) -> Explanation:
    """Explain a job from its record fields (``JOB_FIELDS``; bytes or text) and its events.

    A job not finished yet has its last segment end at ``now_ms`` (server time), or at its
    last event when ``now_ms`` is not given."""
    cls = _text(record.get("cls")) or "standard"
    status = _text(record.get("st"))
    ordered = sorted(events, key=lambda e: e.ms) if events else _fallback(record, cls)
    walk = _Walk(cls)
    for ev in ordered:
        walk.step(ev)
    if walk.state is not None:
        end = max(now_ms if now_ms is not None else walk.since, walk.since)
        walk.close(end, still=True)
    segments = tuple(walk.segments)
    ran = sum(s.ms for s in segments if s.what == "running")
    waited = sum(s.ms for s in segments if s.what != "running")
    return Explanation(
        status=status,
        segments=segments,
        waited_ms=waited,
        ran_ms=ran,
        summary=_summary(status, segments, _int(record.get("max"))),
    )
