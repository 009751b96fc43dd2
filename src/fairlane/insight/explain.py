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
``paused``      ``scope``: dispatch parked it under this field of the pause table,
                its task or fairness key paused by an operator
                (``fairlane.policy.pauses``, P3); back in its queue on resume
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

A waiting job an operator's pause holds (its lane or class, its tenant, its task or its
fairness key paused) is explained with the pause as its shard's pause table holds it now
(``pauses``: ``Store.pause_entries()``): ``paused by an operator at <time>: <reason>``,
with the scope, who paused it and until when (``fairlane.insight.pauses``).

A job on rate keys is explained with what its record and the keys say now
(``fairlane.store.views.rates.JobRates``, passed in as ``rates``): a key it parked on
is named with its rate, and, while it still waits, when the key's next tokens are due
and a pause with its cause. A job parked on a key its app's shards share
(``fairlane.store.views.globalkeys.JobGlobalKeys``, passed in as ``global_keys``) is
told, while it still waits, what part of the key its shard holds, how much of it is in
use and how many wait there, and what the other shards hold.

An attempt whose task reported its time in model and tool calls (``fairlane.context()``,
``report_usage(model_seconds=..., tool_seconds=...)``) is told how much of its run that
was: ``use`` in the event that ended it, or on the record when it ended the job. A wait
for a slot in its class is told the retries of other jobs that started there meanwhile,
with their share of the starts (``fairlane.insight.retries``, from the class's ring of
starts passed in as ``starts``: ``fairlane.store.views.starts.ClassStarts``).

Jobs logged by earlier versions of the store carry ``dispatched`` and final events
(``completed``, ``failed``, ``cancelled``, ``expired``) as well; they are read as they
are.

:func:`timeline` merges the events with those the record implies (marked
``derived``); :func:`explain` walks that timeline and returns an :class:`Explanation`:
segments of time each with what the job was doing, why (a sentence, a ``cause`` and
what it names), and one summary sentence. Both are pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fairlane.insight.rates import rate_keys_now, rate_now, rate_text
from fairlane.insight.retries import retries_told
from fairlane.insight.startestimate import StartEstimate, start_text
from fairlane.insight.timeline import FINAL, as_record, timeline
from fairlane.insight.walk import Segment, Walk
from fairlane.insight.words import attempt_time, format_ms
from fairlane.policy.starts import StartsWhile
from fairlane.store.pausing import PauseEntry
from fairlane.store.records import Event, JobRecord
from fairlane.store.views.globalkeys import JobGlobalKeys
from fairlane.store.views.rates import JobRates
from fairlane.store.views.starts import ClassStarts

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


@dataclass(frozen=True, slots=True)
class Explanation:
    """Where a job's time went: its segments in order, the totals, and one sentence.

    ``causes`` lists the causes of its waiting, first seen first (and ``retries`` last
    when a wait is told of other jobs' retries in its class); ``events`` is the
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
    retries: StartsWhile | None = None
    """Its class's starts over the seconds its waits for a slot touched, and how many
    were other jobs' retries (None: not read, no such wait, or no longer kept)."""
    estimated_start: datetime | None = None
    """A waiting job's expected start, when its estimate was given (``start``)."""


# the attempts whose reported time the summary tells, the latest (the segments tell all)
_REPORTED_TOLD = 3


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
    elif status not in FINAL:
        parts.append("not started yet")
    reported = [(s, s.reported_ms) for s in runs if s.reported_ms is not None]
    parts.extend(
        f"its attempt {s.attempt} {attempt_time(s.ms, use, still=s.open)}"
        for s, use in reported[-_REPORTED_TOLD:]
    )
    if status in FINAL and runs and runs[-1].cause == "deadline":
        parts.append("expired at its deadline while running")
    elif status in FINAL:
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
    global_keys: JobGlobalKeys | None = None,
    pauses: Sequence[PauseEntry] = (),
    starts: ClassStarts | None = None,
    start: StartEstimate | None = None,
) -> Explanation:
    """Explain a job from its record (a ``JobRecord``, or the hash's fields as bytes or
    text) and its events; ``rates``: its rate keys and their state now
    (``fairlane.store.views.rates.job_rates``); ``global_keys``: the keys it names that
    its app's shards share (``fairlane.store.views.globalkeys.job_global_keys``);
    ``pauses``: its shard's pause table (``Store.pause_entries()``); ``starts``: its
    class's ring of starts (``fairlane.store.views.starts.class_starts``); ``start``:
    a waiting job's start estimate (``Job.start_estimate``), told after the summary.

    A job not finished yet has its last segment end at ``now_ms`` (server time), or at its
    last event when ``now_ms`` is not given."""
    record = as_record(record)
    status = record.status
    ordered = timeline(record, events)
    walk = Walk(record, rates, global_keys, pauses)
    for ev in ordered:
        walk.step(ev)
    if walk.state is not None:
        end = max(now_ms if now_ms is not None else walk.since, walk.since)
        walk.held(end)
        walk.live()
        walk.close(max(end, walk.since), still=True)
    segments, retries = retries_told(walk.segments, starts, record.lane, record.service_class)
    ran = sum(s.ms for s in segments if s.what == "running")
    waited = sum(s.ms for s in segments if s.what != "running")
    causes = tuple(dict.fromkeys(s.cause for s in segments if s.what != "running" and s.cause))
    if any(a.why != b.why for a, b in zip(segments, walk.segments, strict=True)):
        causes = (*causes, "retries")
    return Explanation(
        status=status,
        segments=segments,
        waited_ms=waited,
        ran_ms=ran,
        summary=_with_start(_summary(status, segments, record.max_attempts), status, start),
        causes=causes,
        events=tuple(ordered),
        fairness_key=record.fairness_key,
        retries=retries,
        estimated_start=start.at if start is not None and status in _WAITING else None,
    )


#: the statuses a start estimate is told for
_WAITING = frozenset({"queued", "scheduled"})


def _with_start(summary: str, status: str, start: StartEstimate | None) -> str:
    if start is None or status not in _WAITING:
        return summary
    return f"{summary.rstrip('.')}; {start_text(start)}."
