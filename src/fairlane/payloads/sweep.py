"""Removing payloads with their job's record: the ``payloads`` index and its sweep.

Retention removes job records inside the server, where no script can reach a file
or a bucket. So every stored payload has an entry in the ``payloads`` sorted set
(``fairlane.store.keys``): member ``<job id>|<name>``, score the time (ms) it is
next due for a check. Each worker, every ``lease.sweep_interval``, takes up to
``payloads.sweep_batch`` due entries (repeating while a pass comes back full),
asks whether each job's record still exists, deletes the payloads of those gone
and drops their entries, and puts the others back for ``payloads.recheck_interval``.

A payload therefore outlives its record by at most ``recheck_interval`` plus a
sweep interval (longer only while the sweep is behind), and a new one is first
checked after ``payloads.grace``. Two workers may check the same entry at once;
deleting twice is harmless. Scores are the worker's clock: they only pace checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from fairlane.codec.refs import MalformedReference, check_name
from fairlane.payloads import PayloadError
from fairlane.runtime.lease import wait_or_stop
from fairlane.store.wire import StoreUnavailable

if TYPE_CHECKING:
    from fairlane.payloads.offload import Payloads
    from fairlane.store.api import Store

__all__ = ["add_to_index", "index_member", "payload_sweep_loop", "split_member", "sweep_once"]

log = logging.getLogger("fairlane.worker")
_MAX_PASSES: Final = 20


def index_member(job_id: str, name: str) -> str:
    """An index entry: the job whose record keeps the payload, then the payload's name
    (a name holds no ``|``; a job id may, so the name is split off from the right)."""
    return f"{job_id}|{name}"


def split_member(member: bytes | str) -> tuple[str, str]:
    text = member.decode() if isinstance(member, bytes) else member
    job_id, _, name = text.rpartition("|")
    return job_id, name


async def add_to_index(server: Store, members: Sequence[str], due_ms: int) -> None:
    if members:
        await server._call(server.client.zadd, server.keys.payloads, dict.fromkeys(members, due_ms))


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


async def payload_sweep_loop(
    server: Store, payloads: Payloads, interval: float, stop: asyncio.Event
) -> None:
    """Sweep every ``interval`` seconds until ``stop`` is set."""
    batch = payloads.settings.sweep_batch
    while not await wait_or_stop(stop, interval):
        for _ in range(_MAX_PASSES):
            try:
                checked, removed = await sweep_once(server, payloads, int(time.time() * 1000))
            except (StoreUnavailable, PayloadError, OSError) as exc:
                log.warning("payload sweep failed: %s", exc)
                break
            except Exception:  # a store's unexpected error must not stop the worker
                log.exception("payload sweep failed")
                break
            if removed:
                log.info("removed %d payload(s) whose job records are gone", removed)
            if checked < batch:
                break
