"""The gateway's audit trail: each decision that changes state, with who, what and when.

One Redis stream per app (``AppKeys.audit``, ``gw:audit``) in the home shard, beside the
API key records: the enqueue script that checks a caller's key (``enqueue_as``) records
the submit in the same step, and a key record's change and its entry are one
transaction. An entry's stream id is ``<server ms>-<n>``: its time is the server's.

Entries, newest first (``AuditTrail.read``):

=============  =================================  ==========================================
action         outcome                            detail, id
=============  =================================  ==========================================
submit         accepted, deferred, rejected,      the reason the gateway answered (e.g.
               refused                            ``class_full``, ``unknown_task``;
                                                  ``existing`` for an idempotent repeat);
                                                  the job id when a job is stored
cancel         the status answered (cancelled,    the job id
               cancelling, or its final status)
signal         delivered, duplicate, finished     the signal's name; the run id
drain          started, done                      the filter; at its end the counts
                                                  (``App.drain``: the entry's key is who
                                                  asked, ``cli:<user>`` from the CLI)
key_created    ok                                 the key acted on is the entry's key
key_rotated    ok
key_updated    ok                                 scopes or expiry changed, same secret
key_revoked    ok
pause          paused, quarantined                the scope and the reason; the entry's key
                                                  is who acted (an operator's name, ``cli``,
                                                  or the admin key)
resume         resumed                            the scope, the parked jobs put back
drain          drained, dry_run, stopped          the filter and the jobs cancelled
=============  =================================  ==========================================

A request refused before its key is known (401) changes nothing and is not recorded.

Every entry carries the same fields in the same order (``FIELDS``, '' for none): a
stream block stores the names of its first entry once and marks each later entry that
has the same names, so an entry costs its values and a few bytes of framing. Bounded by
count: each XADD trims with ``MAXLEN ~ cap``, which drops whole blocks (100 entries by
default), so the trail holds from ``cap`` to ``cap`` plus one block. No age bound: the
count bounds the memory, and an age would need the server's clock on every writer.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from fairlane.policy.retention import DEFAULT_AUDIT_ENTRIES
from fairlane.store.base import unavailable
from fairlane.store.connection import AsyncClient
from fairlane.store.fields import field_text
from fairlane.store.keys import AppKeys

__all__ = [
    "ACTIONS",
    "DEFAULT_ENTRIES",
    "FIELDS",
    "SUBMIT_OUTCOMES",
    "AuditEntry",
    "AuditTrail",
]

#: the entries a trail keeps by default (the ``audit_entries`` setting's default)
DEFAULT_ENTRIES: Final = DEFAULT_AUDIT_ENTRIES
ACTIONS: Final = (
    "submit",
    "cancel",
    "signal",
    "drain",
    "key_created",
    "key_rotated",
    "key_updated",
    "key_revoked",
    "pause",
    "resume",
    "drain",
)
SUBMIT_OUTCOMES: Final = ("accepted", "deferred", "rejected", "refused")
#: every entry's fields, in this order (the enqueue script writes the same)
FIELDS: Final = ("action", "key", "tenant", "outcome", "detail", "id")
#: the longest value kept in a field: an entry's size stays bounded whatever it is given
MAX_TEXT: Final = 200
#: entries one read looks at, at most, to find those of a tenant or an action
MAX_SCAN: Final = 200_000
_PAGE: Final = 1000


class AuditEntry(msgspec.Struct, frozen=True):
    """One recorded decision."""

    entry: str
    """The stream entry's id, ``<ms>-<n>``."""
    at_ms: int
    """When, in the server's ms."""
    action: str
    key_id: str
    """The key that made the request, or the key acted on (``key_*``)."""
    tenant: str
    outcome: str
    detail: str
    job_id: str
    """The job or run, where there is one."""


def entry_fields(
    action: str, key_id: str, tenant: str, outcome: str, *, detail: str = "", job_id: str = ""
) -> dict[str, str]:
    """An entry's fields, in ``FIELDS`` order, each cut to ``MAX_TEXT`` characters."""
    if action not in ACTIONS:
        raise ValueError(f"not an audited action: {action!r} (one of {', '.join(ACTIONS)})")
    values = (action, key_id, tenant, outcome, detail, job_id)
    return {name: value[:MAX_TEXT] for name, value in zip(FIELDS, values, strict=True)}


def _entry(entry_id: Any, raw: dict[Any, Any]) -> AuditEntry:
    text = field_text(entry_id)
    got = {field_text(k): field_text(v) for k, v in raw.items()}
    return AuditEntry(
        entry=text,
        at_ms=int(text.partition("-")[0]),
        action=got.get("action", ""),
        key_id=got.get("key", ""),
        tenant=got.get("tenant", ""),
        outcome=got.get("outcome", ""),
        detail=got.get("detail", ""),
        job_id=got.get("id", ""),
    )


class AuditTrail:
    """The audit trail of one app: writing entries and reading them back."""

    def __init__(
        self, client: AsyncClient, app_name: str, shards: int = 1, cap: int = DEFAULT_ENTRIES
    ) -> None:
        if cap < 1:
            raise ValueError(f"an audit trail keeps at least one entry, not {cap}")
        self.client = client
        self.stream = AppKeys.for_shard(app_name, 0, shards).audit
        self.cap = cap

    def add(self, pipe: Any, action: str, key_id: str, tenant: str, outcome: str) -> None:
        """Queue a key action's entry in ``pipe`` (a transaction on the key records)."""
        fields = entry_fields(action, key_id, tenant, outcome)
        pipe.xadd(self.stream, fields, maxlen=self.cap, approximate=True)

    async def record(
        self,
        action: str,
        key_id: str,
        tenant: str,
        outcome: str,
        *,
        detail: str = "",
        job_id: str = "",
    ) -> str:
        """Append one entry (a decision made outside a script); its stream id."""
        fields = entry_fields(action, key_id, tenant, outcome, detail=detail, job_id=job_id)
        with unavailable():
            entry_id = await self.client.xadd(
                self.stream,
                fields,  # type: ignore[arg-type]
                maxlen=self.cap,
                approximate=True,
            )
        return field_text(entry_id)

    async def read(
        self, limit: int = 100, *, tenant: str | None = None, action: str | None = None
    ) -> list[AuditEntry]:
        """The newest ``limit`` entries, newest first, of ``tenant`` and ``action`` if
        given (looking at no more than ``MAX_SCAN`` entries to find them)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        if action is not None and action not in ACTIONS:
            raise ValueError(f"not an audited action: {action!r} (one of {', '.join(ACTIONS)})")
        found: list[AuditEntry] = []
        end, scanned = "+", 0
        while len(found) < limit and scanned < MAX_SCAN:
            page = _PAGE if tenant or action else limit - len(found)
            with unavailable():
                rows: list[Any] = list(
                    await self.client.xrevrange(self.stream, end, "-", count=page) or ()
                )
            for entry_id, raw in rows:
                entry = _entry(entry_id, raw or {})
                if (tenant is None or entry.tenant == tenant) and (
                    action is None or entry.action == action
                ):
                    found.append(entry)
            scanned += len(rows)
            if len(rows) < page:
                break
            end = "(" + field_text(rows[-1][0])
        return found[:limit]

    async def length(self) -> int:
        """How many entries the trail holds now."""
        with unavailable():
            return int(await self.client.xlen(self.stream))
