"""The walk through a job's timeline that cuts it into segments, each with what the job
was doing and why (``explain``'s second step)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fairlane.insight.globalkeys import global_key_text
from fairlane.insight.pauses import CAUSE, holding, parked_why, paused_why
from fairlane.insight.rates import rate_now, rate_text
from fairlane.insight.timeline import FINAL
from fairlane.insight.words import Why, attempt_time, format_ms, queued_why
from fairlane.store.fields import field_int, field_text
from fairlane.store.pausing import PauseEntry
from fairlane.store.records import Event, JobRecord, decode_reported
from fairlane.store.views.globalkeys import JobGlobalKeys
from fairlane.store.views.rates import JobRates

__all__ = ["Segment", "Walk"]


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
    (a worker that could not run it handed it back), ``workflow`` or ``operator`` (an
    operator's pause of its lane, class, tenant, task or fairness key); ``about`` what
    that cause names: the borrowing classes, the throttle or rate key, the deferral
    reason, the error, the paused scope. A running segment has no cause but
    ``pushback`` when the upstream pushed that attempt back (its attempt given back), or
    ``deadline`` when it was still running at its job's deadline (the job expired);
    ``reported_ms`` is what its task reported of its time in model calls and in tool
    calls, in ms (None: nothing, or not kept: its attempt is still running)."""

    from_ms: int
    to_ms: int
    what: str
    why: str
    open: bool = False
    worker: str = ""
    attempt: int = 0
    cause: str = ""
    about: tuple[str, ...] = ()
    reported_ms: tuple[int, int] | None = None

    @property
    def ms(self) -> int:
        return max(0, self.to_ms - self.from_ms)


class Walk:
    """The state of a walk through the timeline: the segment open and what is known."""

    def __init__(
        self,
        record: JobRecord,
        rates: JobRates | None = None,
        global_keys: JobGlobalKeys | None = None,
        pauses: Sequence[PauseEntry] = (),
    ) -> None:
        self.cls = record.service_class
        self.record = record
        self.pauses = pauses
        self.rates = rates or JobRates()
        self.global_keys = global_keys or JobGlobalKeys()
        self.segments: list[Segment] = []
        self.state: tuple[str, Why] | None = None
        self.since = 0
        self.running: dict[str, Any] = {}

    def close(self, ms: int, *, why: Why | None = None, still: bool = False) -> None:
        if self.state is not None:
            what, reason = self.state
            worker, att, use = "", 0, None
            reason = why or reason
            if what == "running":
                worker, att = self.running.get("worker", ""), self.running.get("attempt", 0)
                use = self.running.get("use")
                if use is not None:
                    told = attempt_time(max(0, ms - self.since), use, still=still)
                    reason = Why(f"{reason.why}; {told}", reason.cause, reason.about)
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
                    use,
                )
            )
        self.state = None

    def open(self, ms: int, what: str, why: Why) -> None:
        self.close(ms)
        self.state, self.since = (what, why), ms

    def queued(self, ms: int) -> None:
        self.open(ms, "queued", Why(f"queued for a worker slot in class {self.cls}", "slot"))

    def deferred(self, ms: int, reason: Any, cls: Any) -> None:
        where, because = field_text(cls) or self.cls, field_text(reason) or "?"
        self.open(
            ms,
            "deferred",
            Why(f"deferred by admission ({because} in {where})", "admission", (because,)),
        )

    def from_now_or_later(self, ms: int, at: Any) -> None:
        until = field_int(at)
        if until is not None and until > ms:
            later = f"scheduled to start {format_ms(until - ms)} later"
            self.open(ms, "scheduled", Why(later, "schedule"))
        else:
            self.queued(ms)

    def end_running(self, ms: int, how: str, cause: str = "") -> None:
        if self.state and self.state[0] == "running":
            run = self.state[1]
            self.close(ms, why=Why(f"{run.why}, {how}", cause or run.cause, run.about))

    def ended(self, ms: int, kind: str, err: str) -> None:
        """The job's end (``kind``, one of ``FINAL``): an attempt still running at its
        job's deadline was stopped there, and the job expired."""
        if kind != "completed":
            how, cause = kind + (f" ({err})" if err else ""), ""
            deadline = self.record.deadline_ms
            if kind == "expired" and deadline is not None and ms >= deadline:
                how, cause = f"stopped at its deadline while running, {how}", "deadline"
            self.end_running(ms, how, cause)
        self.close(ms)

    def parked(self, ms: int, key: str, why: str = "") -> None:
        limit = self.record.limits.get(key)
        rate = self.rates.rates.get(key)
        if rate is not None and why != "room":
            shown = rate_text(rate) + (f"; limit {limit}" if limit is not None else "")
            paused = " (paused)" if why == "pause" else ""
            self.open(
                ms,
                "parked",
                Why(
                    f"parked on rate key {key}{paused} ({shown}) in its tenant's group",
                    "rate",
                    (key,),
                ),
            )
            return
        shown = f" (limit {limit})" if limit is not None else ""
        why_ = Why(
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
        why = Why(
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
                Why(
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
            Why(
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

    def held(self, now: int) -> None:
        """The wait still open, told which operator's pause holds the job now: a job
        waiting in its queue is paused from the pause's start (its lane, class or tenant
        paused), a job parked by a pause is told its reason, who and until when, or that
        its pause has ended since."""
        if self.state is None or self.state[0] not in ("queued", "paused"):
            return
        what, reason = self.state
        if what == "paused" and reason.cause != CAUSE:
            return  # the upstream's pushback, not an operator
        held = holding(self.record, self.pauses, now)
        if not held:
            if what == "paused":
                ended = Why(f"{reason.why}; its pause has ended since", CAUSE, reason.about)
                self.state = (what, ended)
            return
        if what == "paused":  # parked: since its park, told by the pause that decides now
            self.state = (what, paused_why(held[0]))
            return
        # waiting in its queue: from each pause's start, named by the first of those begun
        for at in sorted({e.at_ms for e in held if e.at_ms <= now}):
            told = paused_why(next(e for e in held if e.at_ms <= at))
            if self.state is not None and self.state[1] == told:
                continue
            if at > self.since:
                self.open(at, "paused", told)
            else:
                self.state = ("paused", told)

    def live(self) -> None:
        """The segment still open, told what its rate key says now, and, for a key
        shared by the app's shards, what part of it the job's shard holds."""
        if self.state is None or self.state[0] not in ("parked", "paused"):
            return
        what, reason = self.state
        if not reason.about:
            return
        key = reason.about[0]
        told: list[str] = []
        if reason.cause in ("rate", "pushback"):
            view = self.rates.keys.get(key)
            told.append(rate_now(view, self.rates.cost(key)) if view is not None else "")
        shared = self.global_keys.keys.get(key)
        if what == "parked" and shared is not None:
            told.append(global_key_text(shared, self.global_keys.shard))
        said = "; ".join(t for t in told if t)
        if said:
            self.state = (what, Why(f"{reason.why}; {said}", reason.cause, reason.about))

    def dispatched(self, ms: int, d: Mapping[str, Any]) -> None:
        if self.state and self.state[0] == "queued":
            told = queued_why(d.get("qw"), self.cls)
            if told is not None:
                self.close(ms, why=told)
        worker, att = field_text(d.get("wk")) or "?", field_int(d.get("att")) or 0
        self.running = {"worker": worker, "attempt": att, "use": decode_reported(d.get("use"))}
        shown = f"attempt {att} on worker {worker}" if att else f"on worker {worker}"
        self.open(ms, "running", Why(shown, ""))

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
            case "paused":
                self.open(ms, "paused", parked_why(field_text(d.get("scope"))))
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
                    ms, "backoff", Why(f"retry backoff ({shown} after {err})", "backoff", (err,))
                )
            case "handback":
                err = field_text(d.get("err")) or "an error"
                self.end_running(ms, f"handed back ({err}: that worker could not run it)")
                self.open(
                    ms,
                    "backoff",
                    Why(f"handed back for another worker to run ({err})", "deploy", (err,)),
                )
            case "reclaimed":
                self.end_running(ms, "lost (its lease expired)")
            case "suspended":
                wait = field_text(d.get("wait")) or "something"
                self.end_running(ms, "suspended")
                self.open(
                    ms, "suspended", Why(f"suspended waiting for {wait}", "workflow", (wait,))
                )
            case "released":
                self.end_running(ms, "handed back unstarted by its stopping worker")
                self.queued(ms)
            case "redriven":
                self.queued(ms)
            case kind if kind in FINAL:
                self.ended(ms, kind, field_text(d.get("err")))
            case _:
                pass
