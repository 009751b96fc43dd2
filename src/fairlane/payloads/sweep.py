"""Removing payloads with their job's record: one pass of the sweep over the index.

Every stored payload has an entry in the ``payloads`` index
(``fairlane.payloads.index``). A pass (``sweep_once``) takes up to
``payloads.sweep_batch`` due entries, asks whether each job's record still exists,
deletes the payloads of those gone and drops their entries, and puts the others back
for ``payloads.recheck_interval``. Each worker runs a pass every
``lease.sweep_interval``, repeating while a pass comes back full
(``fairlane.runtime.payload_sweep``); ``remove_all`` empties a shard's index for purge.

A payload therefore outlives its record by at most ``recheck_interval`` plus a
sweep interval (longer only while the sweep is behind), and a new one is first
checked after ``payloads.grace``. Two workers may check the same entry at once;
deleting twice is harmless. Scores are the worker's clock: they only pace checks.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

from fairlane.codec.refs import MalformedReference, check_name
from fairlane.payloads.index import split_member

if TYPE_CHECKING:
    from fairlane.payloads.offload import Payloads
    from fairlane.store.api import Store

__all__ = ["remove_all", "sweep_once"]

log = logging.getLogger("fairlane.worker")


async def sweep_once(server: Store, payloads: Payloads, now_ms: int) -> tuple[int, int]:
    """One bounded pass; returns (entries checked, payloads removed)."""
    key = server.keys.payloads
    due: list[bytes] = await server._call(
        server.client.zrangebyscore, key, "-inf", now_ms, start=0, num=payloads.settings.sweep_batch
    )
    if not due:
        return 0, 0
    entries = [split_member(member) for member in due]
    pipe = server.client.pipeline(transaction=False)
    for job_id, _ in entries:
        pipe.exists(server.keys.job(job_id))
    alive = await server._call(pipe.execute)
    gone: list[bytes] = []
    names: list[str] = []
    kept: dict[bytes, int] = {}
    recheck = now_ms + round(payloads.settings.recheck_interval * 1000)
    for member, (job_id, name), exists in zip(due, entries, alive, strict=True):
        if exists and job_id:
            kept[member] = recheck
            continue
        gone.append(member)
        try:
            names.append(check_name(name))
        except MalformedReference:
            log.warning("dropping a malformed payload index entry: %r", member[:120])
    if names:
        # the files first: an entry dropped before its file would leave the file forever
        await payloads.store.delete(names)
    if gone:
        await server._call(server.client.zrem, key, *gone)
    if kept:
        await server._call(server.client.zadd, key, kept, xx=True)
    return len(due), len(names)


async def remove_all(server: Store, payloads: Payloads) -> int:
    """Delete every payload the index of ``server``'s shard names, whatever its job's
    state (for ``App.purge``); returns how many were removed."""
    key, batch, removed = server.keys.payloads, payloads.settings.sweep_batch, 0
    while True:
        members: list[bytes] = await server._call(server.client.zrange, key, 0, batch - 1)
        if not members:
            return removed
        names = []
        for member in members:
            with contextlib.suppress(MalformedReference):
                names.append(check_name(split_member(member)[1]))
        if names:
            await payloads.store.delete(names)  # the files first, as in the sweep
        await server._call(server.client.zrem, key, *members)
        removed += len(names)
