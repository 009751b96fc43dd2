"""What the demo measures: each job's admission answer and record, and per-row figures.

This module owns the demo's bookkeeping. The submitter records each admission answer
(:meth:`Tracker.answered`); :meth:`Tracker.poll` reads the records of unfinished jobs in
one pipelined round trip (status, when each was due, started and finished: the server's
milliseconds), a workflow run's log, and the lanes' capacity and in-flight slots;
:meth:`Tracker.snapshot` turns it all into figures per row -- a row is one tenant's jobs
in one lane and class, as the workload names them (in the FIFO run every job is
submitted as one tenant in one class, but is still counted under the tenant it came from).

**Start delay** is the time from when a job was due -- enqueued, or its retry's backoff
over, or a workflow's next slice ready -- to when a worker started it, on the server's
clock (record fields ``run`` and ``start``; a workflow's slices from its run log). Jobs
still waiting when a run ends count with the wait so far, a lower bound (``censored``).

**Share of capacity** is the slot-time a row's jobs held in their lane (each job's last
attempt, each slice of a workflow) over the lane's slots times the time elapsed.

An app split into scheduling shards is read in all of them: each job's record and run
log in the shard its id names, and a lane's in-flight and waiting slots summed over
the shards (its capacity is not: every shard counts all the workers' slots).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fairlane.app.admission import Admission
from fairlane.demo.workload import Arrival
from fairlane.store.api import Store
from fairlane.store.keys import job_shard
from fairlane.store.records import TIMES, JobRecord
from fairlane.store.views.jobs import read_jobs
from fairlane.store.views.lanes import LaneState, lane_states

__all__ = [
    "TERMINAL",
    "LaneFigures",
    "RowFigures",
    "RowKey",
    "Snapshot",
    "Tracked",
    "Tracker",
    "percentile",
]

TERMINAL = frozenset({"completed", "failed", "cancelled", "expired"})
# statuses in which the record's start is the start of the attempt that was due at run
_STARTED = frozenset({"running", "completed", "failed"})
# admitted, not started: waiting in a queue, for admission or for a throttle key
_WAITING = frozenset({"queued", "deferred", "throttled"})


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True, order=True)
class RowKey:
    tenant: str
    lane: str
    service_class: str


@dataclass(slots=True)
class Tracked:
    """One arrival: its answers, and its job's record as last read."""

    arrival: Arrival
    row: RowKey
    job_id: str | None = None
    status: str = "pending"
    """``pending`` before an answer, ``rejected`` once given up, else the record's status."""
    enq_ms: int | None = None
    run_ms: int | None = None
    start_ms: int | None = None
    fin_ms: int | None = None
    attempts: int = 0
    slice_waits: list[int] = field(default_factory=list)
    """A workflow run's slices: each one's start delay (ms)."""
    slice_busy_ms: int = 0
    steps: int = 0
    history_final: bool = False

    @property
    def workflow(self) -> bool:
        return self.arrival.kind == "research"

    @property
    def final(self) -> bool:
        if self.status == "rejected":
            return True
        return self.status in TERMINAL and (not self.workflow or self.history_final)


@dataclass(slots=True)
class _Answers:
    """A row's admission answers."""

    sent: int = 0
    accepted: int = 0
    deferred: int = 0
    rejected: int = 0
    gave_up: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    retry_after: list[float] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        """The answers as a row's figures count them (``RowFigures``' own fields)."""
        waits = self.retry_after
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            "deferred": self.deferred,
            "rejected": self.rejected,
            "gave_up": self.gave_up,
            "reasons": dict(self.reasons),
            "retry_after": (min(waits), max(waits)) if waits else None,
        }


@dataclass(frozen=True, slots=True)
class RowFigures:
    """One row's figures at one moment."""

    key: RowKey
    weight: float | None
    sent: int
    accepted: int
    deferred: int
    rejected: int
    gave_up: int
    reasons: dict[str, int]
    retry_after: tuple[float, float] | None
    queued: int
    """Admitted, not started (deferred ones included)."""
    deferred_now: int
    running: int
    done: int
    failed: int
    retried: int
    samples: int
    censored: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    oldest_waiting_ms: float | None
    busy_s: float
    share: float

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant": self.key.tenant,
            "lane": self.key.lane,
            "class": self.key.service_class,
            "weight": self.weight,
            "submitted": self.sent,
            "admission": {
                "accepted": self.accepted,
                "deferred": self.deferred,
                "rejected": self.rejected,
                "gave_up": self.gave_up,
                "reasons": self.reasons,
                "retry_after_s": list(self.retry_after) if self.retry_after else None,
            },
            "done": self.done,
            "failed": self.failed,
            "retried": self.retried,
            "unfinished": self.queued + self.running,
            "start_delay_ms": {
                "p50": self.p50_ms,
                "p99": self.p99_ms,
                "max": self.max_ms,
                "samples": self.samples,
                "censored": self.censored,
            },
            "busy_slot_seconds": round(self.busy_s, 3),
            "share_of_lane_capacity": round(self.share, 4),
        }


@dataclass(frozen=True, slots=True)
class LaneFigures:
    lane: str
    slots: int
    capacity: int
    """Live workers' slots, as the server counts them now."""
    in_flight: dict[str, int]
    waiting: dict[str, int]
    utilisation: float
    """Busy slot-time over ``slots`` times the time elapsed."""

    @property
    def busy(self) -> int:
        return sum(self.in_flight.values())

    def as_json(self) -> dict[str, Any]:
        return {"lane": self.lane, "slots": self.slots, "utilisation": round(self.utilisation, 4)}


@dataclass(frozen=True, slots=True)
class Snapshot:
    mode: str
    app: str
    elapsed: float
    seconds: float
    window: float
    submitting: bool
    rows: list[RowFigures]
    lanes: list[LaneFigures]
    jobs: int
    final: int


class Tracker:
    """Every arrival of one run, its answers and its record."""

    def __init__(
        self,
        *,
        mode: str,
        app: str,
        seconds: float,
        window: float,
        lanes: Mapping[str, int],
        rows: Sequence[RowKey],
        weights: Mapping[str, float] | None,
    ) -> None:
        self.mode = mode
        self.app = app
        self.seconds = seconds
        self.window = window
        self.lane_slots = dict(lanes)
        self.rows = list(rows)
        self.weights = dict(weights) if weights is not None else None
        self.jobs: list[Tracked] = []
        self.answers: dict[RowKey, _Answers] = {row: _Answers() for row in self.rows}
        self.lane_states: dict[str, LaneState] = {}
        self.start_ms: int | None = None
        self.now_ms: int = 0
        self.submitting = True
        self._shards: tuple[Store, list[Store]] | None = None  # a home store, and all

    # -- the submitter's side ------------------------------------------------------------

    def track(self, arrival: Arrival) -> Tracked:
        row = RowKey(arrival.tenant, arrival.lane, arrival.service_class)
        tracked = Tracked(arrival, row)
        self.jobs.append(tracked)
        self.answers.setdefault(row, _Answers()).sent += 1
        return tracked

    def answered(self, tracked: Tracked, admission: Admission[Any]) -> None:
        answers = self.answers[tracked.row]
        if admission.job is not None:
            tracked.job_id = admission.job.id
            tracked.status = "deferred" if admission.status == "deferred" else "queued"
            if admission.status == "deferred":
                answers.deferred += 1
                answers.reasons[f"deferred: {admission.reason or 'class_full'}"] += 1
            else:
                answers.accepted += 1
            return
        answers.rejected += 1
        answers.reasons[admission.reason or admission.status] += 1
        if admission.retry_after is not None:
            answers.retry_after.append(admission.retry_after)

    def gave_up(self, tracked: Tracked) -> None:
        tracked.status = "rejected"
        self.answers[tracked.row].gave_up += 1

    # -- reading the store ---------------------------------------------------------------

    async def poll(self, stores: Store | Sequence[Store]) -> None:
        """Read unfinished jobs' records, the server's time, the lanes and the runs' logs.

        ``stores``: the app's, one per shard (``App.stores``); given one store of an app
        of several shards, the others are reached through its connections."""
        shards = self._all_shards(stores)
        home, count = shards[0], len(shards)
        pending = [t for t in self.jobs if t.job_id is not None and t.status not in TERMINAL]
        # a cluster pipeline refuses TIME, which names no key: it is read on its own
        self.now_ms = await home.server_time_ms()
        ids = [(t.job_id or "", job_shard(t.job_id or "", count)) for t in pending]
        records = await home.view(read_jobs, ids, TIMES)
        if self.start_ms is None:
            self.start_ms = self.now_ms
        for t, record in zip(pending, records, strict=True):
            _apply(t, record)
        self.lane_states.update(await home.view(lane_states, list(self.lane_slots)))
        for t in self.jobs:
            if t.workflow and t.job_id is not None and not t.history_final:
                await self._read_run(shards[job_shard(t.job_id, count)], t)

    def _all_shards(self, stores: Store | Sequence[Store]) -> list[Store]:
        if not isinstance(stores, Store):
            return list(stores)
        if stores.shards == 1:
            return [stores]
        if self._shards is None or self._shards[0] is not stores:
            siblings = [
                stores if i == stores.shard else stores.shard_store(i, stores.shards)
                for i in range(stores.shards)
            ]
            self._shards = (stores, siblings)
        return self._shards[1]

    async def _read_run(self, store: Store, t: Tracked) -> None:
        history = await store.runs.history(t.job_id or "")
        ready = t.enq_ms
        began: int | None = None
        waits: list[int] = []
        busy = 0
        for event in history.log:
            if event.kind == "slice":
                if ready is not None:
                    waits.append(max(0, event.at_ms - ready))
                began, ready = event.at_ms, None
            elif event.kind in ("suspend", "end"):
                if began is not None:
                    busy += max(0, event.at_ms - began)
                began = None
                ready = event.extra if event.kind == "suspend" else None
        if began is not None:  # a slice running now
            busy += max(0, self.now_ms - began)
        t.slice_waits, t.slice_busy_ms, t.steps = waits, busy, len(history.steps)
        t.history_final = t.status in TERMINAL

    # -- figures -------------------------------------------------------------------------

    def snapshot(self, *, final: bool = False) -> Snapshot:
        elapsed_ms = max(1, self.now_ms - (self.start_ms or self.now_ms))
        by_row: dict[RowKey, list[Tracked]] = {row: [] for row in self.rows}
        for t in self.jobs:
            by_row.setdefault(t.row, []).append(t)
        busy_by_lane: dict[str, float] = dict.fromkeys(self.lane_slots, 0.0)
        rows = []
        for row, jobs in by_row.items():
            figures = self._row(row, jobs, elapsed_ms, final=final)
            busy_by_lane[row.lane] = busy_by_lane.get(row.lane, 0.0) + figures.busy_s
            rows.append(figures)
        lanes = []
        for lane, slots in self.lane_slots.items():
            state = self.lane_states.get(lane)
            lanes.append(
                LaneFigures(
                    lane=lane,
                    slots=slots,
                    capacity=state.capacity if state else 0,
                    in_flight=dict(state.in_flight) if state else {},
                    waiting=dict(state.waiting) if state else {},
                    utilisation=busy_by_lane.get(lane, 0.0) / (slots * elapsed_ms / 1000),
                )
            )
        return Snapshot(
            mode=self.mode,
            app=self.app,
            elapsed=elapsed_ms / 1000,
            seconds=self.seconds,
            window=self.window,
            submitting=self.submitting,
            rows=rows,
            lanes=lanes,
            jobs=len(self.jobs),
            final=sum(t.final for t in self.jobs),
        )

    def all_final(self) -> bool:
        return all(t.final for t in self.jobs)

    def _waits(self, t: Tracked, *, final: bool) -> tuple[list[float], int]:
        """A job's start delays (a workflow's: one per slice), and how many are lower
        bounds (a job still waiting at the end of the run)."""
        if t.job_id is None or t.status in ("pending", "rejected"):
            return [], 0
        if t.workflow:
            return [float(w) for w in t.slice_waits], 0
        if t.status in _STARTED and t.start_ms is not None and t.run_ms is not None:
            return [float(max(0, t.start_ms - t.run_ms))], 0
        if final and t.status in _WAITING and t.run_ms is not None:
            return [float(max(0, self.now_ms - t.run_ms))], 1
        return [], 0

    def group(self, rows: Callable[[RowKey], bool], *, final: bool = True) -> dict[str, Any]:
        """Start delays (ms) of every job of the rows ``rows`` picks, pooled."""
        waits: list[float] = []
        censored = 0
        for t in self.jobs:
            if rows(t.row):
                got, lower = self._waits(t, final=final)
                waits += got
                censored += lower
        return {
            "p50": percentile(waits, 50),
            "p99": percentile(waits, 99),
            "max": max(waits) if waits else None,
            "samples": len(waits),
            "censored": censored,
        }

    def _row(self, row: RowKey, jobs: list[Tracked], elapsed_ms: int, *, final: bool) -> RowFigures:
        answers = self.answers.get(row, _Answers())
        waits: list[float] = []
        censored = 0
        oldest: float | None = None
        busy_ms = 0
        queued = deferred_now = running = done = failed = retried = 0
        for t in jobs:
            if t.status in ("pending", "rejected") or t.job_id is None:
                continue
            if t.attempts > 1 and not t.workflow:
                retried += 1
            if t.status == "running":
                running += 1
            elif t.status == "completed":
                done += 1
            elif t.status in TERMINAL:
                failed += 1
            else:
                queued += 1
                deferred_now += t.status == "deferred"
            got, lower = self._waits(t, final=final)
            waits += got
            censored += lower
            if t.workflow:
                busy_ms += t.slice_busy_ms
            elif t.status in _STARTED and t.start_ms is not None:
                end = t.fin_ms if t.fin_ms is not None else self.now_ms
                busy_ms += max(0, end - t.start_ms)
            if t.status in _WAITING and t.run_ms is not None:
                age = float(max(0, self.now_ms - t.run_ms))
                oldest = age if oldest is None else max(oldest, age)
        slots = self.lane_slots.get(row.lane, 1)
        weight = None
        if self.weights is not None:
            weight = self.weights.get(row.tenant, 1.0)
        return RowFigures(
            key=row,
            weight=weight,
            **answers.figures(),
            queued=queued,
            deferred_now=deferred_now,
            running=running,
            done=done,
            failed=failed,
            retried=retried,
            samples=len(waits),
            censored=censored,
            p50_ms=percentile(waits, 50),
            p99_ms=percentile(waits, 99),
            max_ms=max(waits) if waits else None,
            oldest_waiting_ms=oldest,
            busy_s=busy_ms / 1000,
            share=busy_ms / (slots * elapsed_ms),
        )


def _apply(t: Tracked, record: JobRecord | None) -> None:
    if record is None:
        t.status = "expired"  # the record is gone: nothing more will happen to it
        return
    t.status = record.status
    t.enq_ms = record.enqueued_ms
    t.run_ms = record.run_ms
    t.start_ms = record.started_ms
    t.fin_ms = record.finished_ms
    t.attempts = record.attempts
