"""``Payloads``: moving large arguments and results into a payload store and back.

An app with a payload store gets one ``Payloads``. Jobs pass through it on their
way into the server (``offload_jobs``: every enqueue path ends in ``Store.submit``,
which calls it), a worker resolves a job's reference only when an attempt runs
(``resolve``), and a result over the threshold goes to the store before the
attempt settles (``offload_result``); ``Job.result()`` resolves on the producer side.

Each payload is put in the index (``payloads`` in ``fairlane.store.keys``, kept by
``fairlane.store.payloadindex``) *before* it is written, so that no crash leaves a payload
nobody will ever remove: the sweep (``fairlane.payloads.sweep``) removes it once its
job's record is gone. A new entry is first checked only after ``payloads.grace``: its
job may not be stored yet.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import msgspec

from fairlane.codec import PayloadTooLarge
from fairlane.codec.refs import PayloadRef, decode_ref, encode_ref, is_ref, new_name
from fairlane.payloads.base import PayloadMissing, PayloadStore

if TYPE_CHECKING:
    from fairlane.config.settings import PayloadSettings
    from fairlane.store.api import Store
    from fairlane.store.wire import NewJob

__all__ = ["Payloads"]

# hashing a large payload in a thread keeps the loop responsive; a small one is quicker inline
_HASH_IN_THREAD: Final = 1 << 20


async def _sha256(data: bytes) -> str:
    if len(data) >= _HASH_IN_THREAD:
        return await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
    return hashlib.sha256(data).hexdigest()


class Payloads:
    """An app's payload store with its settings: what goes by reference, and how."""

    def __init__(self, store: PayloadStore, settings: PayloadSettings) -> None:
        self.store = store
        self.settings = settings
        self.threshold = settings.threshold_bytes
        self.max_bytes = settings.max_bytes

    def __repr__(self) -> str:
        return f"Payloads({self.store!r}, threshold={self.threshold})"

    def by_reference(self, blob: bytes | str) -> bool:
        """Whether ``blob`` travels as a reference: it is over the threshold, or (a
        result) its JSON begins like a reference and must not be read as one."""
        return len(blob) > self.threshold or is_ref(blob)

    def check_size(self, blob: bytes | str, what: str) -> None:
        if len(blob) > self.max_bytes:
            raise PayloadTooLarge(
                f"{what} are {len(blob)} bytes, over the payload store's "
                f"{self.max_bytes}-byte limit (payloads.max_bytes)"
            )

    async def offload_jobs(self, server: Store, jobs: Sequence[NewJob]) -> Sequence[NewJob]:
        """``jobs`` with every argument blob over the threshold stored and replaced by
        its reference; raises (storing no job) if a payload cannot be stored."""
        todo = [i for i, job in enumerate(jobs) if self.by_reference(job.args)]
        if not todo:
            return jobs
        out = list(jobs)
        writes: list[tuple[str, str, bytes]] = []
        for i in todo:
            job = jobs[i]
            # a copy of a stored job (a retry from the dashboard) gets a copy of its
            # payload: the original goes with the original's record
            blob = await self.resolve(job.args) if is_ref(job.args) else job.args.encode()
            self.check_size(blob, f"arguments of {job.task}")
            name = new_name(job.id, "args")
            ref = encode_ref(PayloadRef(name, len(blob), await _sha256(blob)))
            out[i] = msgspec.structs.replace(job, args=ref.decode())
            writes.append((job.id, name, blob))
        await self._index(server, [(job_id, name) for job_id, name, _ in writes])
        await asyncio.gather(*(self.store.put(name, blob) for _, name, blob in writes))
        return out

    async def offload_result(
        self, server: Store, job_id: str, blob: bytes, parent: str = ""
    ) -> bytes:
        """Store a result and return the reference to settle the attempt with. A
        workflow child's result goes with its run's record, not its own (``parent``):
        the run reads it on every replay, long after the child's record may be gone."""
        self.check_size(blob, "the result's bytes")
        name = new_name(job_id, "result")
        ref = encode_ref(PayloadRef(name, len(blob), await _sha256(blob)))
        await self._index(server, [(parent or job_id, name)])
        await self.store.put(name, blob)
        return ref

    async def resolve(self, blob: bytes | str) -> bytes:
        """The payload ``blob`` refers to (``blob`` itself when it is no reference).

        Raises ``PayloadMissing`` when it is not in the store or does not match the
        size and SHA-256 its reference records, ``MalformedReference`` for a damaged
        reference."""
        if not is_ref(blob):
            return blob.encode() if isinstance(blob, str) else blob
        ref = decode_ref(blob)
        data = await self.store.get(ref.name)
        if len(data) != ref.size or await _sha256(data) != ref.sha256:
            raise PayloadMissing(
                f"payload {ref.name!r} is damaged: {len(data)} bytes that do not match "
                f"its reference ({ref.size} bytes, sha256 {ref.sha256[:12]}...)"
            )
        return data

    async def _index(self, server: Store, entries: Sequence[tuple[str, str]]) -> None:
        # the client's clock: it only delays a check, and the grace dwarfs any skew
        due = int((time.time() + self.settings.grace) * 1000)
        await server.index_payloads(entries, due)
