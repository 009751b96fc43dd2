"""Other jobs' retries in a job's class while it waited (``explain``'s last step).

A job waiting in its tenant's queue waits for a slot of its class; each retry of another
job that starts meanwhile takes one of those slots (a tenant's retries keep their place
at the head of its queue, so they go before its new work). The class's ring of starts
(``fairlane.policy.starts``, read as ``fairlane.store.views.starts.ClassStarts``) tells,
over the seconds a wait touched, how many starts there were and how many of them were
retries; the job's own retry starts are taken out. A queued segment whose share of other
jobs' retries is worth telling (``StartsWhile.worth_telling``) says so, with the figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fairlane.insight.walk import Segment
from fairlane.policy.starts import StartsWhile, starts_while
from fairlane.store.views.starts import ClassStarts

__all__ = ["retries_told", "retries_while"]


def retries_while(
    waits: Sequence[Segment], runs: Sequence[Segment], starts: ClassStarts
) -> StartsWhile | None:
    """The class's starts over the seconds the queued segments ``waits`` touched, less
    the job's own retry starts (its ``runs`` after the first attempt)."""
    own = [s.from_ms for s in runs if s.attempt > 1]
    return starts_while(starts.buckets, [(s.from_ms, s.to_ms) for s in waits], own, starts.now_ms)


def _told(seen: StartsWhile, cls: str) -> str:
    n = seen.others_retries
    attempts = "retry attempt" if n == 1 else "retry attempts"
    return (
        f"meanwhile {n} {attempts} of other jobs started in class {cls}: {seen.share:.0%} of "
        f"the {seen.starts} starts there in the {seen.seconds} s around its wait"
    )


def retries_told(
    segments: Sequence[Segment], starts: ClassStarts | None, lane: str, cls: str
) -> tuple[tuple[Segment, ...], StartsWhile | None]:
    """The segments, each wait for a slot in class ``cls`` of ``lane`` told the other jobs' retries
    that started meanwhile where they were worth telling, and the figures over all its
    waits (None: no ring of its class read, no wait, or seconds the ring no longer keeps)."""
    if starts is None or starts.service_class != cls or (lane and starts.lane != lane):
        return tuple(segments), None
    runs = [s for s in segments if s.what == "running"]
    waits = [s for s in segments if s.what == "queued"]
    out: list[Segment] = []
    for s in segments:
        seen = retries_while([s], runs, starts) if s.what == "queued" else None
        if seen is not None and seen.worth_telling:
            out.append(dataclasses.replace(s, why=f"{s.why}; {_told(seen, cls)}"))
        else:
            out.append(s)
    return tuple(out), retries_while(waits, runs, starts)
