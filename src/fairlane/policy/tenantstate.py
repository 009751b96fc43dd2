"""What a tenant leaves behind in the store, and when deleting it changes no decision.

Every tenant the store has ever seen leaves state: a finish tag in each class it ran in,
learned costs per (tenant, workflow, model), its signals (submission-rate buckets and a
mean duration), rejection counters. Tenants that come once (per-end-user tenant ids) would
grow that state for ever, so the tenant sweep (``lua/tenantsweep.lua``, run by the worker's
``runtime/tenant_sweep``) deletes each piece by the rules here. They are pure functions of
the values the sweep reads, so each rule is tested here and the script is held to them.

Two kinds of rule:

**Decision-neutral** -- the piece carries no information: every script reads it exactly as
it reads a missing one, so deleting it cannot change any decision.

* A rejection counter ``count|window start`` whose window has passed: ``note_rejection``
  starts a fresh count for it exactly as for a missing one.
* A rate bucket whose index is at or below ``now_index - RATE_BUCKETS``: the rate counts
  only buckets in ``(index - RATE_BUCKETS, index]`` and the index only grows, and a
  submission overwrites a stale bucket exactly as it writes a missing one.
* An admitted-jobs or reserved-units counter of 0: it reads as a missing one.
* An idle tenant's finish tag ``F`` in a class. A tenant activates at ``max(F, B)`` with
  ``B = V - r / m`` (``V`` the class's virtual time, ``r`` its work in flight, ``m`` its
  active tenants; ``B = V`` when ``m = 0``), and a missing tag gives ``B``. So deleting
  ``F`` leaves an activation unchanged **exactly when ``F <= B`` at that activation**.
  ``V`` never decreases, but ``r`` grows with dispatches and ``m`` shrinks as tenants go
  idle, so no test made before the activation can promise that for every future. The
  sweep deletes a tag when ``F <= V - r`` as it looks (``finish_tag_removable``): since
  ``B' >= V' - r'`` whatever ``m'``, every later activation at which the work in flight
  has grown by no more than ``V`` has (``r' - r <= V' - V``; in particular whenever no
  more is in flight than at the sweep) is unchanged. Past that, the tenant starts at
  ``B'`` rather than ``F``: ahead by at most ``r' - r``, within the credit every new
  tenant gets (``r' / m'``, bounded by work in flight, never by how long it was away).
  The cost correction of an idle tenant reads its tag only through ``max(V, F)``, so a
  tag ``F <= V`` reads as ``V`` there either way.

**Forgotten after ``idle_ttl``** -- the piece does carry information, but a tenant idle
that long is taken as new: its learned costs (a returning tenant starts from the default
estimate, and charges as it did before anything was learned), its signals (no mean
duration: its ceiling is its floor until it runs again), and a finish tag still above
``V - r`` (by the fair queue's invariant I2 it is at most ``V + c / w``: the tenant is let
off at most its last job's charge and the credit of the work in flight). A learned cost
or a signal hash is idle when no script has read or written it for ``idle_ttl`` (the
server's own idle clock of the key); a finish tag is idle when the sweep has seen the
same value for ``idle_ttl``.
"""

from __future__ import annotations

from typing import Final

import msgspec

from fairlane.policy.ceilings import RATE_BUCKETS, RATE_WIDTH_MS

__all__ = [
    "DEFAULT_IDLE_TTL",
    "REJECTION_WINDOW_MS",
    "SIGNAL_WINDOW_MS",
    "TENANT_STATE",
    "StateKind",
    "activation_start",
    "bucket_expired",
    "counter_empty",
    "finish_tag_forgotten",
    "finish_tag_removable",
    "key_forgotten",
    "rejection_expired",
    "signals_forgotten",
]

#: A week: how long an idle tenant's learned costs and signals are kept by default.
DEFAULT_IDLE_TTL: Final = 7 * 86400.0
#: The window of a tenant's counted rejections (``note_rejection`` in ``lua/admission.lua``).
REJECTION_WINDOW_MS: Final = 60_000
#: The span of the submission-rate ring: a bucket older than this is never counted again.
SIGNAL_WINDOW_MS: Final = RATE_BUCKETS * RATE_WIDTH_MS


class StateKind(msgspec.Struct, frozen=True):
    """One kind of per-tenant state: where it lives and which rule removes it."""

    name: str
    where: str  # the key pattern (after the app's prefix) and field, as in store/keys.py
    rule: str


#: What the tenant sweep covers, the same rows as the table in ``lua/tenantsweep.lua``.
TENANT_STATE: Final = (
    StateKind(
        "finish tag",
        "lane:<l>:c:<c>:vt field f:<tenant>",
        "finish_tag_removable, else finish_tag_forgotten",
    ),
    StateKind(
        "finish tag's first sighting (the sweep's own)",
        "lane:<l>:c:<c>:seen field <tenant>",
        "dropped with its tag, or when the tag is gone or changed",
    ),
    StateKind("learned cost", "cost:<tenant>|<workflow>|<model>", "key_forgotten"),
    StateKind("learned lengths", "dur:<tenant>", "key_forgotten"),
    StateKind("signals", "sig:<tenant>", "signals_forgotten"),
    StateKind("rejection counter", "lane:<l>:adm:rej field <tenant>", "rejection_expired"),
    StateKind(
        "admitted jobs and reserved units",
        "lane:<l>:adm:t, lane:<l>:adm:tu field <class>|<tenant>",
        "counter_empty",
    ),
)


def activation_start(finish: float | None, vtime: float, in_flight: float, active: int) -> float:
    """The start tag a tenant activates at (``activate`` in ``lua/fairqueue.lua``): ``max(F,
    V - r / m)``, ``V`` alone with no active tenant, ``F`` ignored when missing."""
    start = vtime - in_flight / active if active > 0 else vtime
    if finish is not None and finish > start:
        return finish
    return start


def finish_tag_removable(finish: float, vtime: float, in_flight: float) -> bool:
    """Whether an idle tenant's finish tag changes no activation while the work in flight
    grows by no more than ``V`` does: ``F <= V - r``, the least ``B`` can be with ``r``
    in flight (one active tenant)."""
    return finish <= vtime - max(0.0, in_flight)


def finish_tag_forgotten(seen_ms: int | None, now_ms: int, idle_ttl_ms: int) -> bool:
    """Whether a tag above ``B``, seen unchanged since ``seen_ms``, has been idle long enough."""
    return seen_ms is not None and now_ms - seen_ms >= idle_ttl_ms


def key_forgotten(idle_ms: int, idle_ttl_ms: int) -> bool:
    """Whether a learned cost no script touched for ``idle_ms`` is forgotten. ``idle_ms``
    is what is certain: the server's idle clock counts whole seconds, so the sweep takes
    one off what it reads."""
    return idle_ms >= idle_ttl_ms


def signals_forgotten(idle_ms: int, idle_ttl_ms: int) -> bool:
    """Whether a tenant's signals go: idle for ``idle_ttl`` and at least the rate window, so
    that every rate bucket is already out of the window (a bucket written at ``t`` counts
    only until ``t + SIGNAL_WINDOW_MS``) and only the mean duration is forgotten."""
    return idle_ms >= max(idle_ttl_ms, SIGNAL_WINDOW_MS)


def bucket_expired(stamp: int, now_ms: int) -> bool:
    """Whether a rate bucket of index ``stamp`` is out of the window for good."""
    return stamp <= now_ms // RATE_WIDTH_MS - RATE_BUCKETS


def rejection_expired(value: str, now_ms: int) -> bool:
    """Whether a rejection counter ``count|window start`` reads as none (window passed)."""
    _, _, start = value.partition("|")
    try:
        began = int(start)
    except ValueError:
        return True  # unreadable: note_rejection starts afresh on it too
    return now_ms - began >= REJECTION_WINDOW_MS


def counter_empty(value: str) -> bool:
    """Whether an admitted-jobs or reserved-units counter reads as none."""
    try:
        return int(value) == 0
    except ValueError:
        return False
