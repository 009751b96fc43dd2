"""The producer's calls: storing jobs through admission, and the declarations they obey.

A submission passes the lane's admission and stores the jobs admitted or deferred in
one atomic step (the enqueue script); batches travel as one msgpack argument. Before
they are sent, jobs pass the store's memory mark (``StoreFull`` above it, nothing
written: ``fairlane.store.memory``), then ``prepare_jobs`` (the app's payload offload,
``fairlane.payloads``): arguments over the threshold go to the payload store and
travel as references. The declarations -- a task's retention, a lane's classes and
charge mode, its admission pool -- are recorded where the scripts read them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import msgspec
from redis.exceptions import ResponseError

from fairlane.errors import StoreLayoutError
from fairlane.policy.admission import EstimationSettings, PoolConfig, QueueBounds
from fairlane.policy.classes import ClassTable
from fairlane.store.apikeys import (
    KEY_REFUSED_ERROR,
    KEY_SCOPE_ERROR,
    KeyGuard,
    KeyOutOfScope,
    KeyRefused,
)
from fairlane.store.argv import (
    ClaimLayoutArg,
    DeclareAdmissionArg,
    DeclareBoundsArg,
    DeclareLaneArg,
    DeclareTaskArg,
    EnqueueArg,
    EnqueueAsArg,
    argv,
)
from fairlane.store.audit import DEFAULT_ENTRIES
from fairlane.store.base import StoreBase
from fairlane.store.keys import STORE_LAYOUT
from fairlane.store.library import FUNCTION_PREFIX, encode_admission, encode_classes
from fairlane.store.wire import NewJob, Submitted, as_text, parse_submitted

__all__ = ["Submission"]

_PACK: Final = msgspec.msgpack.Encoder()


class Submission(StoreBase):
    """Enqueueing jobs and declaring what the scripts apply to them."""

    #: what jobs pass through before they are sent (the app's payload offload,
    #: ``fairlane.payloads``), called with the store and the jobs; None sends them as
    #: they are
    prepare_jobs: Callable[[Any, Sequence[NewJob]], Awaitable[Sequence[NewJob]]] | None = None
    #: the entries the app's audit trail keeps (the ``audit_entries`` setting)
    audit_entries: int = DEFAULT_ENTRIES

    async def submit(
        self, lane: str, jobs: Sequence[NewJob], guard: KeyGuard | None = None
    ) -> list[Submitted]:
        """Pass jobs through the lane's admission and store those admitted or deferred,
        in one atomic step; one reply per job (codes as the enqueue script says).

        With ``guard`` (a gateway caller's key, whose records must be in this shard),
        the same step first checks that the key still stands as the caller holds it:
        ``KeyRefused``, with nothing stored, if it was revoked, rotated or has expired
        (by the server's clock), ``KeyOutOfScope`` if it may not submit; and records
        each job's outcome in the app's audit trail (``fairlane.store.audit``).

        While the server is above the app's memory mark the call is refused whole with
        ``StoreFull`` before anything is offloaded or sent (``fairlane.store.memory``)."""
        reckoned = await self.memory.admit(self.read_memory, jobs)
        try:
            return await self._send(lane, await self.prepare(jobs), guard)
        finally:
            self.memory.settled(reckoned)

    async def _send(
        self, lane: str, jobs: Sequence[NewJob], guard: KeyGuard | None
    ) -> list[Submitted]:
        blob = _PACK.encode(jobs)
        keys = self._lane_keys([lane])
        if guard is None:
            return parse_submitted(
                await self.fcall("enqueue", keys, argv(EnqueueArg, lane=lane, jobs=blob))
            )
        try:
            reply = await self.fcall(
                "enqueue_as",
                [*keys, guard.records, guard.audit],
                argv(
                    EnqueueAsArg,
                    lane=lane,
                    jobs=blob,
                    key_id=guard.key_id,
                    key_hash=guard.sha256,
                    tenant=guard.tenant,
                    audit_cap=guard.audit_cap,
                ),
            )
        except ResponseError as exc:
            message = str(exc)
            if message.startswith(KEY_REFUSED_ERROR):
                raise KeyRefused(message.removeprefix(KEY_REFUSED_ERROR).strip()) from None
            if message.startswith(KEY_SCOPE_ERROR):
                raise KeyOutOfScope(message.removeprefix(KEY_SCOPE_ERROR).strip()) from None
            raise
        return parse_submitted(reply)

    async def prepare(self, jobs: Sequence[NewJob]) -> Sequence[NewJob]:
        """Jobs as they are to be sent: arguments over the payload threshold stored in
        the app's payload store and replaced by references. Every enqueue path calls it,
        once the memory mark has admitted the jobs."""
        hook = self.prepare_jobs
        return jobs if hook is None else await hook(self, jobs)

    def enqueue_call(self, lane: str, jobs: Sequence[NewJob]) -> tuple[Any, ...]:
        """The enqueue FCALL's arguments, for a caller that sends it in a pipeline."""
        keys = self._lane_keys([lane])
        args = argv(EnqueueArg, lane=lane, jobs=_PACK.encode(jobs))
        return (FUNCTION_PREFIX + "enqueue", len(keys), *keys, *args)

    async def enqueue(self, lane: str, jobs: Sequence[NewJob]) -> list[tuple[str, int]]:
        """Store jobs atomically; returns (id, code) per job: 1 new, 2 deferred, 0 existing,
        negative: refused (nothing written)."""
        return [(s.id, s.code) for s in await self.submit(lane, jobs)]

    async def declare_admission(
        self,
        lane: str,
        table: ClassTable,
        pool: PoolConfig | None,
        estimation: EstimationSettings | None = None,
    ) -> None:
        """Record a lane's admission config (None: no admission control in the lane)."""
        config, units = "", ""
        if pool is not None:
            config, units = encode_admission(
                table, pool, estimation or EstimationSettings(), self.shards
            )
        await self.fcall(
            "declare_admission",
            self._lane_keys([lane]),
            argv(DeclareAdmissionArg, lane=lane, config=config, units=units),
        )

    async def declare_bounds(self, lane: str, bounds: QueueBounds | None) -> None:
        """Record a lane's default queue bounds (``fairlane.policy.admission.bounds``, as
        this shard applies them); None, or both lifted, records none (a lane with an
        admission pool is bounded by its pool)."""
        encoded = ""
        if bounds is not None and not bounds.unbounded:
            encoded = ",".join(
                str(-1 if n is None else n) for n in (bounds.tenant_max, bounds.lane_max)
            )
        await self.fcall(
            "declare_bounds",
            self._lane_keys([lane]),
            argv(DeclareBoundsArg, lane=lane, bounds=encoded),
        )

    async def claim_layout(self) -> None:
        """Claim this shard for the library's store layout, or raise ``StoreLayoutError``
        when it holds data of another layout (which this library would misread)."""
        found = as_text(
            await self.fcall(
                "claim_layout", self._common, argv(ClaimLayoutArg, layout=STORE_LAYOUT)
            )
        )
        if found != str(STORE_LAYOUT):
            raise StoreLayoutError(
                self.keys.prefix, int(found) if found else 1, STORE_LAYOUT, _release()
            )

    async def declare_task(self, task: str, keep_completed: str, keep_failed: str) -> None:
        retention = f"{keep_completed}|{keep_failed}"
        await self.fcall(
            "declare_task", self._common, argv(DeclareTaskArg, task=task, retention=retention)
        )

    async def declare_lane(self, lane: str, classes: ClassTable, charge: str = "jobs") -> None:
        """Record a lane's service classes and how its tenants are charged ("jobs": one
        unit per job; "cost": what each job was learned to cost, corrected as it ends);
        the next decision in the lane uses them."""
        await self.fcall(
            "declare_lane",
            self._lane_keys([lane]),
            argv(DeclareLaneArg, lane=lane, table=encode_classes(classes), charge=charge),
        )


def _release() -> str:
    """This library's release, for the layout error: read where it is said, as finding
    the distribution's metadata costs a worker's start-up milliseconds (every installed
    distribution looked at, its metadata parsed as mail headers)."""
    import importlib.metadata  # noqa: PLC0415 - see the docstring

    return importlib.metadata.version("fairlane")
