"""The ``payloads`` index: which job's record keeps each stored payload alive.

Retention removes job records inside the server, where no script can reach a file
or a bucket. So every stored payload has an entry in the ``payloads`` sorted set
(``fairlane.store.keys``): member ``<job id>|<name>``, score the time (ms) it is
next due for a check. Producers and workers add entries before they write a payload
(``fairlane.payloads.offload``); the sweep (``fairlane.payloads.sweep``) reads them
through the calls here, and no script touches the index. This module owns the
member's format and every command on the key.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fairlane.store.base import StoreBase

__all__ = ["IndexEntry", "PayloadIndexCalls", "index_member", "split_member"]


def index_member(job_id: str, name: str) -> str:
    """An index entry: the job whose record keeps the payload, then the payload's name
    (a name holds no ``|``; a job id may, so the name is split off from the right)."""
    return f"{job_id}|{name}"


def split_member(member: bytes | str) -> tuple[str, str]:
    text = member.decode() if isinstance(member, bytes) else member
    job_id, _, name = text.rpartition("|")
    return job_id, name


class IndexEntry(NamedTuple):
    """One entry as read: the member as stored (to drop or reschedule it exactly),
    the job whose record keeps the payload ("" when the member names none) and the
    payload's name, not yet checked."""

    member: bytes
    job_id: str
    name: str


def _entries(members: Sequence[bytes]) -> list[IndexEntry]:
    return [IndexEntry(member, *split_member(member)) for member in members]


class PayloadIndexCalls(StoreBase):
    """This shard's payload index."""

    async def index_payloads(self, entries: Sequence[tuple[str, str]], due_ms: int) -> None:
        """Add ``(job id, payload name)`` entries, first due for a check at ``due_ms``."""
        if entries:
            members = dict.fromkeys((index_member(*entry) for entry in entries), due_ms)
            await self._call(self.client.zadd, self.keys.payloads, members)

    async def due_payloads(self, now_ms: int, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` entries due for a check at ``now_ms``, the longest due first."""
        due = await self._call(
            self.client.zrangebyscore, self.keys.payloads, "-inf", now_ms, start=0, num=limit
        )
        return _entries(due)

    async def indexed_payloads(self, limit: int) -> list[IndexEntry]:
        """Up to ``limit`` entries, due or not (for emptying the index)."""
        return _entries(await self._call(self.client.zrange, self.keys.payloads, 0, limit - 1))

    async def drop_payload_entries(self, entries: Sequence[IndexEntry]) -> None:
        if entries:
            members = [entry.member for entry in entries]
            await self._call(self.client.zrem, self.keys.payloads, *members)

    async def recheck_payloads(self, entries: Sequence[IndexEntry], due_ms: int) -> None:
        """Put entries back, next due at ``due_ms``; one dropped meanwhile stays dropped."""
        if entries:
            members = dict.fromkeys((entry.member for entry in entries), due_ms)
            await self._call(self.client.zadd, self.keys.payloads, members, xx=True)
