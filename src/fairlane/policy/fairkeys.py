"""Fairness keys: the second level of fair sharing, between the end users of one tenant.

Inside a service class, tenants share dispatches by weight (``fairlane.policy.fairqueue``).
Inside a tenant, the jobs wait in one queue ordered by ``(-priority, order number)``,
and dispatch takes its head. A job without a fairness key has its FIFO number as its
order number (the app's ``seq`` counter, one step per job enqueued anywhere in the app),
so a tenant's jobs run by priority, then in arrival order. A job enqueued with a
fairness key ``k`` (``enqueue(..., tenant="acme", fairness_key="user-42")``) takes an
order number by start-time fair tagging among the tenant's keys instead, so that the
keys of a tenant share its part fairly and one end user cannot stall the others. Dispatch
is unchanged: it still takes the head of the tenant's queue; only the order numbers differ.

State, per tenant queue (one lane, one class, one tenant)
--------------------------------------------------------
* ``H``, the head's order number: that of the least-ordered job waiting in the queue
  (read from its score, ``score mod ORDER_SPAN``) that is not deadline-ordered
  (``fairlane.policy.deadlineorder``: those come first at their priority, placed by
  their deadlines, and are never tagged); undefined while there is none.
* ``F_k``, for each key ``k`` seen since the queue last drained: the start tag of the
  key's next job. ``w_k > 0`` is the key's weight (1 unless set for the tenant).

Rules
-----
1. **Tag** (a keyed job enters the queue for the first time, with FIFO number ``s``;
   a deadline-ordered one keeps its deadline order and charges its key nothing):
   the present is ``V = H``, or ``V = s`` when ``H`` is undefined -- and then every ``F``
   is dropped, since a drained queue has nothing left to be fair about. Otherwise every ``F_k <= H``
   is dropped: it is at or below the present and carries no information. The job's order
   number is ``tag = max(F_k, V)`` and ``F_k <- tag + 1 / w_k``.
2. **Dispatch** takes the head, as for any job; retries, expired leases and releases put
   a job back with the order number it has (its record's ``seq``), as they always did.
3. **First entry.** A keyed job is tagged when it first enters its tenant's queue: at its
   enqueue when it is due at once and admitted; when it is promoted, if it was scheduled
   for later (its first attempt only); when a readmission pass admits it, if admission
   deferred it (and it is due then; otherwise at its promotion). Until then it waits
   with its FIFO number and charges nothing to its key. A retry is never tagged again:
   it keeps the order number it has, as a release does (rule 2).

Scale. One job of a key of weight 1 advances the key by one FIFO step, so keyed and
unkeyed jobs live on the same scale: by induction every tag is at most the FIFO number
``s`` its job was given (``H`` is an earlier job's, and ``F_k <= s_prev + 1 <= s``) as
long as weights are ``>= 1`` and the job is tagged at its enqueue. An unkeyed job
therefore never passes a keyed job enqueued before it; a keyed job may pass unkeyed
ones, each of its key's jobs by one step at most: in a tenant that mixes both, its
unkeyed jobs are served as one more key whose tags are their arrival numbers. Weights
below 1 are allowed (a key may be made to yield); their tags may then run ahead of the
FIFO numbers. A job tagged later (rule 3) enters at the present or behind its key's
backlog, like any arrival then, not with its old FIFO number, which would put it ahead
of everything enqueued meanwhile, its own key's jobs included (an unkeyed scheduled job
does enter with its FIFO number, as it always did).

Fairness bound. Between the keys of one tenant this is start-time fair queuing with the
head as virtual time, unit work per job. Let keys ``i`` and ``j`` both have jobs in the
queue, at one priority and with no retry re-entering meanwhile, from a dispatch ``a`` to
a dispatch ``b``. While a key has jobs waiting its successive tags differ by exactly
``1 / w``, and its next job's tag lies in ``[H, H + 1 / w]`` at every dispatch (its last
dispatched job was the head; a key entering takes ``max(F_k, H)``), so the jobs ``n_i``,
``n_j`` dispatched to them in ``(a, b]`` satisfy

    |n_i / w_i - n_j / w_j|  <=  1 / w_i + 1 / w_j.

A key that becomes active enters at the head: its first job waits behind at most the
jobs already tagged ``<= H`` (one per active key of weight <= 1), never behind another
key's backlog. Tenants are still shared by weight one level up, so a tenant spreading its
flood over a thousand keys gets exactly what it gets with one.

Bounded state. ``F`` holds an entry only for a key tagged since the queue last drained
whose next tag is above the head: at most one per key with a job waiting, plus keys whose
last job left less than one step before the head. Entries at or below the head are dropped
at each keyed enqueue, and the whole set when the queue has drained.

Precision. Order numbers are doubles, and a score is ``-priority * ORDER_SPAN + tag``:
integer tags are exact; fractional ones (weights other than 1) are exact at priority 0 and
rounded to the score's precision at large priorities, the same rounding on both sides.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Final

import msgspec

from fairlane.policy.deadlineorder import DEADLINE_SPAN

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_KEY_WEIGHT",
    "ORDER_SPAN",
    "KeyTags",
    "TenantOrder",
    "head_order",
    "order_score",
    "present_order",
]

#: A score is ``-priority * ORDER_SPAN + order``: the Lua library's ``PRIO_SPAN``.
ORDER_SPAN: Final = 1 << 40
#: Fairness keys are names: printable, no NUL, at most this long (as tenants).
MAX_KEY_LENGTH: Final = 200
#: Key weights are relative, like tenants' weights; a bound keeps a typo from starving others.
MAX_KEY_WEIGHT: Final = 1_000_000.0


def order_score(priority: int, order: float) -> float:
    """A queued job's score in its tenant's queue (``order_score`` in Lua)."""
    return -priority * ORDER_SPAN + order


def head_order(score: float) -> float:
    """The order number of the job with ``score`` (its priority dropped)."""
    return score % ORDER_SPAN


def present_order(scores: Iterable[float]) -> float | None:
    """``H`` of a queue whose scores are ``scores`` in order: the order number of its
    first job that is not deadline-ordered (None: there is none). A deadline order
    ``e < 0`` reads as ``e + ORDER_SPAN`` mod ``ORDER_SPAN``, at or above
    ``ORDER_SPAN - DEADLINE_SPAN``, which no FIFO number reaches."""
    for score in scores:
        order = head_order(score)
        if order < ORDER_SPAN - DEADLINE_SPAN:
            return order
    return None


class KeyTags(msgspec.Struct):
    """``F_k`` of one tenant queue, and rule 1."""

    next_tag: dict[str, float] = msgspec.field(default_factory=dict)

    def tag(self, key: str, weight: float, head: float | None, seq: int) -> float:
        """The order number of a keyed job entering the queue now (rule 1): ``head`` is
        the queue's head order (None: the queue is empty), ``seq`` the job's FIFO number."""
        if head is None:
            self.next_tag.clear()
            present: float = seq
        else:
            present = head
            self.next_tag = {k: f for k, f in self.next_tag.items() if f > head}
        last = self.next_tag.get(key)
        tag = present if last is None or last <= present else last
        self.next_tag[key] = tag + 1 / weight
        return tag


class TenantOrder(msgspec.Struct):
    """One tenant's queue as dispatch sees it: jobs by ``(score, id)`` -- the order a
    sorted set gives equal scores -- with the keys' tags beside it."""

    weights: Mapping[str, float] = msgspec.field(default_factory=dict)
    tags: KeyTags = msgspec.field(default_factory=KeyTags)
    queue: list[tuple[float, str]] = msgspec.field(default_factory=list)

    def head(self) -> float | None:
        return present_order(score for score, _ in self.queue)

    def order_of(self, key: str, seq: int) -> float:
        """The order number a job of ``key`` ('' for none) with FIFO number ``seq`` (or a
        deadline order, which it keeps) takes."""
        if not key or seq < 0:
            return seq
        return self.tags.tag(key, self.weights.get(key, 1.0), self.head(), seq)

    def push(self, job_id: str, priority: int, order: float) -> None:
        bisect.insort(self.queue, (order_score(priority, order), job_id))

    def enqueue(self, job_id: str, key: str, priority: int, seq: int) -> float:
        """A job entering the queue at once; its order number."""
        order = self.order_of(key, seq)
        self.push(job_id, priority, order)
        return order

    def pop(self) -> str | None:
        """The head job, as dispatch takes it (None: the queue is empty)."""
        return self.queue.pop(0)[1] if self.queue else None
