"""The ``payloads`` index: which job's record keeps each stored payload alive.

Retention removes job records inside the server, where no script can reach a file
or a bucket. So every stored payload has an entry in the ``payloads`` sorted set
(``fairlane.store.keys``): member ``<job id>|<name>``, score the time (ms) it is
next due for a check. Producers and workers add entries before they write a payload
(``fairlane.payloads.offload``); the sweep (``fairlane.payloads.sweep``) reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fairlane.store.api import Store

__all__ = ["add_to_index", "index_member", "split_member"]


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
