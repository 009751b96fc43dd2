"""The gateway's part of the audit trail: the entries of decisions made outside a script.

A submit whose key the enqueue checks itself (``Caller.guard``) is recorded by the
enqueue script in the same step (``enqueue_as``); every other decision that changes
state -- a submit on the other path (a tenant of another shard, an app that waits for
durability, a key read just now), a refusal of a known caller's input, a cancel, a
signal -- is written here, once its answer is known. The entry follows the answer: a
trail that cannot be written is logged and the caller still gets the answer the store
gave (its job is stored either way). The trail itself is ``fairlane.store.audit``.
"""

from __future__ import annotations

import logging

from fairlane.app.admission import STORE_FULL, Admission
from fairlane.errors import StoreFull
from fairlane.gateway.auth import Caller
from fairlane.gateway.state import GatewayState
from fairlane.store.audit import AuditTrail
from fairlane.store.wire import StoreUnavailable

__all__ = ["record", "record_admission", "trail"]

log = logging.getLogger(__name__)


def trail(state: GatewayState) -> AuditTrail:
    """The app's audit trail, on the gateway's connection (the app must be connected)."""
    return state.app.store.key_records.audit


async def record(
    state: GatewayState,
    who: Caller,
    action: str,
    outcome: str,
    *,
    detail: str = "",
    job_id: str = "",
) -> None:
    """Write one entry of a tenant's request (the admin changes nothing it could log)."""
    if who.tenant is None or who.key_id is None:
        return
    try:
        await trail(state).record(
            action, who.key_id, who.tenant, outcome, detail=detail, job_id=job_id
        )
    except (StoreUnavailable, StoreFull) as exc:
        log.warning("audit entry of %s by key %s not written: %s", action, who.key_id, exc)


async def record_admission(state: GatewayState, who: Caller, admission: Admission[object]) -> None:
    """The entry of a submit the store answered, unless the enqueue wrote it itself
    (a guarded one that reached the script: a ``store_full`` refusal did not) or
    nothing was decided (the store was unreachable)."""
    if admission.status == "unavailable":
        return
    if who.guard is not None and admission.reason != STORE_FULL:
        return
    job = admission.job
    detail = admission.reason or ""
    if job is not None and not job.created:
        detail = "existing"  # an idempotency key named a job stored before
    stored = job.id if job is not None and admission.admitted else ""
    await record(state, who, "submit", admission.status, detail=detail, job_id=stored)
