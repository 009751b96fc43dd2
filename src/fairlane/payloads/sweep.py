"""Removing payloads with their job's record: one pass of the sweep over the index.

Every stored payload has an entry in the ``payloads`` index
(``fairlane.store.payloadindex``). A pass (``sweep_once``) takes up to
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

if TYPE_CHECKING:
    from fairlane.payloads.offload import Payloads
    from fairlane.store.api import Store
    from fairlane.store.payloadindex import IndexEntry

__all__ = ["remove_all", "sweep_once"]

log = logging.getLogger("fairlane.worker")


async def sweep_once(server: Store, payloads: Payloads, now_ms: int) -> tuple[int, int]:
    """One bounded pass; returns (entries checked, payloads removed)."""
    due = await server.due_payloads(now_ms, payloads.settings.sweep_batch)
    if not due:
        return 0, 0
    alive = await server.records_exist([entry.job_id for entry in due])
    gone: list[IndexEntry] = []
    names: list[str] = []
    kept: list[IndexEntry] = []
    for entry, exists in zip(due, alive, strict=True):
        if exists and entry.job_id:
            kept.append(entry)
            continue
        gone.append(entry)
        try:
            names.append(check_name(entry.name))
        except MalformedReference:
            log.warning("dropping a malformed payload index entry: %r", entry.member[:120])
    if names:
        # the files first: an entry dropped before its file would leave the file forever
        await payloads.store.delete(names)
    await server.drop_payload_entries(gone)
    recheck = now_ms + round(payloads.settings.recheck_interval * 1000)
    await server.recheck_payloads(kept, recheck)
    return len(due), len(names)


async def remove_all(server: Store, payloads: Payloads) -> int:
    """Delete every payload the index of ``server``'s shard names, whatever its job's
    state (for ``App.purge``); returns how many were removed."""
    batch, removed = payloads.settings.sweep_batch, 0
    while True:
        entries = await server.indexed_payloads(batch)
        if not entries:
            return removed
        names = []
        for entry in entries:
            with contextlib.suppress(MalformedReference):
                names.append(check_name(entry.name))
        if names:
            await payloads.store.delete(names)  # the files first, as in the sweep
        await server.drop_payload_entries(entries)
        removed += len(names)
