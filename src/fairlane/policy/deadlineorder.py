"""Deadline order: earliest deadline first among one tenant's own jobs, as an option.

A tenant's jobs of one lane and class wait in one queue, ordered by ``(-priority,
order number)`` (``fairlane.policy.fairkeys``: a score ``-priority * ORDER_SPAN +
order``). The order number is the job's FIFO number (the app's ``seq`` counter), or
its fairness key's tag. With deadline order on -- on the job's task
(``@app.task(deadline_order=True)``) or on its service class (``deadline_order =
true``) -- a job enqueued with a ``deadline=`` takes an order number from its deadline
instead, so that among its tenant's jobs of its priority it runs before every job with
a later deadline or with none. Off by default: nothing changes for a job without it.

Rule
----
1. **Order number** (a job is stored, with FIFO number ``s`` and deadline ``d`` in
   server ms, or none): if deadline order is on for it and it has a deadline, its order
   number is ``deadline_order(d) = -DEADLINE_SPAN + clamp(floor((d - DEADLINE_EPOCH_MS)
   / DEADLINE_TICK_MS), 0, DEADLINE_SPAN - 1)``, a negative whole number; otherwise it
   is ``s`` (or its key's tag, which is ``>= 0``). The job keeps it for life: retries,
   releases, reclaims, throttle wakes, a pause lifted and a readmission put it back
   with it, as they put back any job's; a workflow run that waits keeps it too (a FIFO
   one takes a new FIFO number, as before).
2. **Order within the queue**: ``(-priority, order number, job id)`` -- the sorted
   set's order. So, at one priority: deadline-ordered jobs first, earliest deadline
   first (one tick, ``DEADLINE_TICK_MS``, is the resolution: deadlines in one tick
   tie, and ties go by job id, which begins with the job's creation time in ms); then
   the others, FIFO among themselves (or by their keys' tags). A higher priority still
   comes first whatever the deadlines.
3. A deadline-ordered job is not tagged by a fairness key (its deadline places it), and
   a key's present is the first job of the queue that is not deadline-ordered
   (``fairlane.policy.fairkeys.present_order``).

Layout. Priority ``p``'s FIFO numbers use ``-p * ORDER_SPAN + [0, ORDER_SPAN -
DEADLINE_SPAN)``; its deadline orders ``-p * ORDER_SPAN + [-DEADLINE_SPAN, 0)``, which
is the top of priority ``p + 1``'s range, left free as long as FIFO numbers stay below
``ORDER_SPAN - DEADLINE_SPAN = 3 * 2**38`` (about 8.2e11 jobs over the app's life; it
was ``ORDER_SPAN`` before). Every score is a whole number of magnitude below
``1001 * 2**40 < 2**53``, so exact in a double on both sides. A tick of 8 ms over a band
of ``2**38`` ticks from 2024 reaches the year 2093; a later deadline takes the band's
last place (still before every FIFO job, ties by id).

Why it cannot change another tenant's share
-------------------------------------------
The fair choice between the tenants of a class (``fairlane.policy.fairqueue``: the
start-time fair queuing of ``fairqueue.lua`` and ``dispatch.lua``) reads, for each
tenant ``t``, only its tag, whether its queue is empty, and -- at the moment it is
chosen -- what its head job asks: its width (for the class rules), its cost (the
charge ``c / w_t``), its throttle keys and its paused scope (whether it starts or
parks). Let two runs receive the same operations (the same submissions, fetches and
ways of settling each dispatched attempt), one with deadline order on and one with it
off. Rule 1 changes order numbers only, and an order number is only ever compared
inside one tenant's queue (and one tenant's waiter group of a throttle key), never
across tenants: the class's fair set is ordered by tags and names, not by scores.

* **Identical jobs, identical service.** Suppose every job of a tenant asks the same of
  dispatch: one width, one cost, no throttle key, no pause that parks some of its jobs
  and not others. By induction over the operations, both runs are in the same state up to a
  permutation of each tenant's queue: a queue's length changes by the same pushes and
  pops in both, so a tenant activates and goes idle at the same steps with the same
  tags (an activation reads ``V``, ``run`` and the active count, never a score); the
  same class and tenant are chosen (their inputs are equal); the chosen tenant is
  charged the same ``c / w_t`` and ``V`` moves the same; and the popped head -- a
  different job, perhaps -- leaves a queue one shorter in both. The sequence of
  tenants served is therefore *identical*: every other tenant's share is exactly what
  it was, dispatch by dispatch (``tests/policy/test_deadline_order.py`` checks it on
  random runs of the reference model, ``tests/store/test_deadline_order_lua.py`` on
  the store, and ``tests/store/test_model_vs_lua.py`` holds the store to the model).
* **Any jobs, the same bound.** When a tenant's jobs differ (widths, costs), deadline
  order changes which of *its own* jobs is charged when, and so perhaps when it is
  chosen. SFQ's bound holds for every order in which a flow's jobs are served:
  ``|W_i / w_i - W_j / w_j| <= c_i^max / w_i + c_j^max / w_j`` over any stretch both
  are backlogged, whatever job each head is. No tenant can take more than its weighted
  share by ordering its own queue; it only chooses which of its jobs spends it.

Three things fall outside the identity, though not outside the bound. *Throttle keys*:
a job a key parked or woke carries state (a place in a waiter group, offers), so it is
no longer like its tenant's others; deadline order can put a fresh job ahead of a woken
one, which then tries the key first and parks, and a tenant's queue may empty (it goes
idle) a dispatch sooner or later than without it, which moves the activation credit
``run / active`` others get -- a reordering of turns, never a larger share (a tenant is
charged only for jobs that start). *Expiry*: a job whose deadline passes while it waits
is expired uncharged when dispatch comes to it; deadline order changes *which* of a
tenant's jobs expire (fewer: that is its point). *Aging*: the class rules' ``max_wait``
reads the head's age, and a younger head may age later, which shapes the classes'
turns, not the tenants' within a class.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEADLINE_EPOCH_MS",
    "DEADLINE_SPAN",
    "DEADLINE_TICK_MS",
    "deadline_order",
    "entry_order",
    "is_deadline_ordered",
]

#: 2024-01-01T00:00:00Z in ms: where the deadline ticks start.
DEADLINE_EPOCH_MS: Final = 1_704_067_200_000
#: A deadline order's resolution: deadlines within one tick tie (then go by job id).
DEADLINE_TICK_MS: Final = 8
#: The width of the band of deadline orders below a priority's FIFO numbers.
DEADLINE_SPAN: Final = 1 << 38


def deadline_order(deadline_ms: int | float) -> int:
    """The order number of a deadline-ordered job due by ``deadline_ms`` (rule 1): in
    ``[-DEADLINE_SPAN, 0)``, earlier deadlines lower (``deadline_order`` in Lua)."""
    ticks = int((deadline_ms - DEADLINE_EPOCH_MS) // DEADLINE_TICK_MS)
    return min(max(ticks, 0), DEADLINE_SPAN - 1) - DEADLINE_SPAN


def entry_order(seq: int, deadline_ms: int | None, ordered: bool) -> int:
    """The order number a job takes when stored: by its deadline when deadline order is
    on for it (``ordered``: its task's or its class's option) and it has one, else its
    FIFO number ``seq``."""
    if ordered and deadline_ms is not None:
        return deadline_order(deadline_ms)
    return seq


def is_deadline_ordered(order: float) -> bool:
    """Whether an order number is a deadline order (every other one is ``>= 0``)."""
    return order < 0
