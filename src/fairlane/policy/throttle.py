"""Per-key concurrency throttles: fair waiter queues, direct hand-off, multi-key admission.

A job names a set of keys, each with a limit (``tenant:acme`` <= 10, ``sub:acme/u42``
<= 2, ``doc:884`` <= 4). It runs only while it holds one slot on *every* key it names.
:class:`Throttles` is the pure model of that primitive: no Redis, no clock. The store
runs the same steps as one atomic script each.

Rules
-----
* **Key order.** A job's keys are taken in sorted (code point) order. "The first full
  key" always means the first in that order, here and in the scripts.
* **Limits in force (dynamic limits).** Every ``try_acquire`` carries a limit for each
  of its keys, and that limit becomes the key's limit in force at once, replacing the
  previous one: the most recent limit given for a key applies -- to the arriving job,
  to the waiters and to every later hand-off. A waiter's own limits are not re-applied
  when it is retried. A key is forgotten (limit included) once no job holds it or
  waits naming it; the next job to name it brings the limit again.
* **Admission.** A job is admitted only if ``in_use(k) < limit(k)`` for every key it
  names; it then takes one slot on each, in one step. Otherwise it takes nothing and
  parks in the waiter queue of its first full key.
* **Waiter order.** Highest ``priority`` first, then lowest ``seq`` (FIFO), then job id.
* **Hand-off.** When a key gains room (a holder released, or its limit was raised) and
  has waiters, it is *drained*: its head waiter is retried on all its keys; if every
  key has room it is admitted (a :class:`Handoff`, holding its slots), otherwise it
  moves, holding nothing, to the queue of its first full key. The next head is then
  tried, until the key is full or its queue is empty. An arriving job's raised limits
  are drained before the arriving job is tried (the waiters came first).
* **Fencing.** Each admission draws a new ``token`` from one counter. ``release(job,
  token)`` frees slots only for the job's current grant, so a late duplicate release
  (from a run that was reclaimed and re-admitted) is a no-op; a release of a job that
  holds nothing is a no-op too. ``forget`` (crash/reclaim) releases or un-parks a job,
  whichever it is, and is idempotent.

Invariants (between operations)
-------------------------------
I1. *Hold-or-wait, never both.* A known job either holds a slot on each of its keys
    and is in no queue, or holds nothing and is in exactly one queue.
I2. *Never over-admission.* Every admission on ``k`` happens with ``in_use(k) <
    limit(k)`` for the limit in force, so ``in_use <= limit`` at all times. Lowering a
    limit below ``in_use`` preempts nobody: the excess drains as holders release, and
    nobody is admitted on ``k`` until ``in_use < limit`` again.
I3. *Work conservation.* A key with waiters is full: ``waiters(k) != [] => in_use(k)
    >= limit(k)``.

Proofs
------
* **No lost wake-ups.** Suppose a waiter ``w`` could take all its keys now. Then its own
  queue's key ``q`` has room, yet holds ``w`` in its queue -- contradicting I3. So no
  slot ever sits free while a waiter that could use it waits. I3 holds after each
  operation: (a) an arrival parks only at a full key; (b) in_use falls only in
  ``release``, and limits rise only in ``try_acquire``; every key that so gains room
  and has waiters is drained, and a drain ends with the key full or its queue empty;
  (c) within an operation, once slots are freed and limits set, in_use only grows and
  waiters are added only to full keys, so a key that satisfies I3 keeps satisfying it;
  (d) cancelling a waiter only shortens a queue.
* **No barging.** Because of I3, an arriving job that finds room on a key finds no one
  waiting there, so an arrival never overtakes a waiter on any key it takes.
* **No deadlock.** A parked job holds nothing (I1), so the wait-for graph only has
  edges from waiters to holders and none out of a holder: it has no cycle. Every
  holder's release is independent of the waiters, and with limits >= 1, releasing
  every holder until none is left admits every waiter (a key with waiters is full,
  hence held, by I3).
* **No livelock -- bounded work.** Each drain iteration removes the head of the
  drained key ``k``'s queue and either admits it or puts it in the queue of a key
  ``j != k`` (``j`` is full, ``k`` has room), so a drain of ``k`` pops at most
  ``|waiters(k)|`` jobs and ends. Within one operation, once its slots are freed and
  its limits set, ``in_use`` only grows and limits stay put, so a key that is full
  stays full to the end of the operation; a waiter moved to ``j`` was moved *because*
  ``j`` was full, so no later drain in the same operation pops it again. Hence **each
  waiter is tried at most once per operation**, and an operation tries at most
  ``a + m`` waiters: ``a`` admissions and ``m <= n`` moves. A release admits at most
  one waiter per key of the releasing job (by I3 a key with waiters had no room
  before, so it gains at most one), so ``a <= K``; an arrival admits at most the sum of
  its limit raises. Each try costs ``O(K_w + log n)`` (``K_w`` the waiter's keys), so an
  operation on a job with ``K`` keys costs ``O(K log n)`` when nobody moves, and
  ``O((K + m) (K_max + log n))`` in all.

Redis twin
----------
All under the app's hash tag, ``T = {app}:thr``:

* ``T:limit``, ``T:used``, ``T:refs`` -- hashes ``key -> limit / in_use / jobs naming
  it`` (``HINCRBY``; a key whose refs reach 0 is ``HDEL``-ed from all three);
* ``T:wait:<key>`` -- a zset per key, score ``-priority``, member ``<seq, 20 digits>|
  <job>``: equal scores sort by member, so FIFO within a priority; the head is
  ``ZRANGE .. 0 0`` (``O(log n)``), a move is ``ZREM`` + ``ZADD``. A waiter may move to
  a key its caller did not name, so a store that must declare every key in ``KEYS``
  folds these into one zset ``T:wait`` at score 0 with members ``<key>\\0<inverted
  priority><seq>|<job>``, read by ``ZRANGEBYLEX`` at the same cost;
* ``T:held`` -- hash ``job -> "<token> <key> <key> .."``;
  ``T:parked`` -- hash ``job -> "<key> <priority> <seq> <key> <key> .."``;
* ``T:token`` -- the grant counter (``INCR``).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Acquired",
    "Handoff",
    "KeyStatistics",
    "Parked",
    "ThrottleStatistics",
    "Throttles",
]


@dataclass(frozen=True, slots=True)
class Handoff:
    """A waiter admitted by a drain: it now holds a slot on each of ``keys``."""

    job_id: str
    token: int
    keys: tuple[str, ...]
    key: str
    """The key whose freed (or newly allowed) slot was handed to it."""


@dataclass(frozen=True, slots=True)
class Acquired:
    """The arriving job was admitted and holds a slot on each of ``keys``."""

    job_id: str
    token: int
    keys: tuple[str, ...]
    handoffs: tuple[Handoff, ...] = ()
    """Waiters admitted first because this arrival raised a limit."""


@dataclass(frozen=True, slots=True)
class Parked:
    """The arriving job holds nothing and waits in the queue of ``key``."""

    job_id: str
    key: str
    handoffs: tuple[Handoff, ...] = ()
    """Waiters admitted first because this arrival raised a limit."""


@dataclass(frozen=True, slots=True)
class KeyStatistics:
    key: str
    in_use: int
    limit: int
    waiters: int


@dataclass(frozen=True, slots=True)
class ThrottleStatistics:
    """A snapshot of :class:`Throttles`: counters since creation and the live keys."""

    acquired: int
    """Arrivals admitted at once."""
    parked: int
    """Arrivals that had to wait."""
    handoffs: int
    """Waiters admitted by a drain."""
    moves: int
    """Waiters moved by a drain to the queue of another full key."""
    released: int
    """Releases (and reclaims) that freed a grant."""
    cancelled: int
    """Waiters removed by ``cancel_waiter`` or ``forget``."""
    keys: tuple[KeyStatistics, ...]
    """Every live key, sorted."""


_QueueEntry = tuple[int, int, str]  # (-priority, seq, job_id)


@dataclass(slots=True)
class _Key:
    limit: int
    in_use: int = 0
    refs: int = 0  # jobs holding it or waiting while naming it
    queue: list[_QueueEntry] = field(default_factory=list)  # sorted

    def has_room(self) -> bool:
        return self.in_use < self.limit


@dataclass(slots=True)
class _Waiter:
    keys: tuple[str, ...]
    entry: _QueueEntry
    at: str


class Throttles:
    """Per-key concurrency limits with fair waiter queues and direct hand-off."""

    def __init__(self) -> None:
        self._keys: dict[str, _Key] = {}
        self._held: dict[str, tuple[int, tuple[str, ...]]] = {}  # job -> (token, keys)
        self._parked: dict[str, _Waiter] = {}
        self._token = 0
        self._counts: Counter[str] = Counter()

    # -- operations -------------------------------------------------------------------

    def try_acquire(
        self, job_id: str, keys: Mapping[str, int], priority: int, seq: int
    ) -> Acquired | Parked:
        """Admit ``job_id`` on all of ``keys`` (key -> limit) at once, or park it."""
        if job_id in self._held or job_id in self._parked:
            raise ValueError(f"job {job_id!r} already holds or waits for slots")
        if seq < 0:
            raise ValueError(f"seq must be >= 0, got {seq}")
        for key, limit in keys.items():
            if limit < 0:
                raise ValueError(f"limit for {key!r} must be >= 0, got {limit}")
        order = tuple(sorted(keys))
        raised: list[str] = []
        for key in order:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = _Key(limit=keys[key])
            elif keys[key] > state.limit and state.queue:
                raised.append(key)
            state.limit = keys[key]
            state.refs += 1
        handoffs: list[Handoff] = []
        for key in raised:
            self._drain(key, handoffs)
        blocker = self._first_full(order)
        if blocker is None:
            self._counts["acquired"] += 1
            return Acquired(job_id, self._grant(job_id, order), order, tuple(handoffs))
        self._counts["parked"] += 1
        self._park(job_id, _Waiter(order, (-priority, seq, job_id), blocker))
        return Parked(job_id, blocker, tuple(handoffs))

    def release(self, job_id: str, token: int | None = None) -> list[Handoff]:
        """Free the job's slots and hand each freed slot to its key's waiters.

        With ``token``, only the grant with that token is released. Releasing a job
        that holds nothing (or under another token) changes nothing and returns ``[]``.
        """
        held = self._held.get(job_id)
        if held is None or (token is not None and held[0] != token):
            return []
        del self._held[job_id]
        self._counts["released"] += 1
        _, keys = held
        freed: list[str] = []
        for key in keys:
            state = self._keys[key]
            state.in_use -= 1
            if state.queue and state.has_room():
                freed.append(key)
        handoffs: list[Handoff] = []
        for key in freed:
            self._drain(key, handoffs)
        self._unref(keys)
        return handoffs

    def cancel_waiter(self, job_id: str) -> bool:
        """Remove a parked job from its queue; ``False`` if it was not waiting."""
        waiter = self._parked.pop(job_id, None)
        if waiter is None:
            return False
        queue = self._keys[waiter.at].queue
        del queue[bisect.bisect_left(queue, waiter.entry)]
        self._unref(waiter.keys)
        self._counts["cancelled"] += 1
        return True

    def forget(self, job_id: str) -> list[Handoff]:
        """Crash or reclaim: release the job's slots or cancel its wait. Idempotent."""
        if self.cancel_waiter(job_id):
            return []
        return self.release(job_id)

    # -- reads ------------------------------------------------------------------------

    def in_use(self, key: str) -> int:
        state = self._keys.get(key)
        return 0 if state is None else state.in_use

    def limit(self, key: str) -> int | None:
        """The limit in force for ``key``, or ``None`` if no job names it."""
        state = self._keys.get(key)
        return None if state is None else state.limit

    def waiters(self, key: str) -> tuple[str, ...]:
        """The jobs parked on ``key``, in hand-off order."""
        state = self._keys.get(key)
        return () if state is None else tuple(entry[2] for entry in state.queue)

    def holds(self, job_id: str) -> tuple[str, ...] | None:
        """The keys ``job_id`` holds a slot on, or ``None`` if it holds nothing."""
        held = self._held.get(job_id)
        return None if held is None else held[1]

    def token(self, job_id: str) -> int | None:
        held = self._held.get(job_id)
        return None if held is None else held[0]

    def parked_on(self, job_id: str) -> str | None:
        """The key whose queue holds ``job_id``, or ``None`` if it is not waiting."""
        waiter = self._parked.get(job_id)
        return None if waiter is None else waiter.at

    def wants(self, job_id: str) -> tuple[str, ...] | None:
        """All the keys a parked job waits to take, or ``None`` if it is not waiting."""
        waiter = self._parked.get(job_id)
        return None if waiter is None else waiter.keys

    def statistics(self) -> ThrottleStatistics:
        keys = tuple(
            KeyStatistics(key, state.in_use, state.limit, len(state.queue))
            for key, state in sorted(self._keys.items())
        )
        c = self._counts
        return ThrottleStatistics(
            acquired=c["acquired"],
            parked=c["parked"],
            handoffs=c["handoffs"],
            moves=c["moves"],
            released=c["released"],
            cancelled=c["cancelled"],
            keys=keys,
        )

    # -- steps ------------------------------------------------------------------------

    def _first_full(self, keys: tuple[str, ...]) -> str | None:
        for key in keys:
            if not self._keys[key].has_room():
                return key
        return None

    def _grant(self, job_id: str, keys: tuple[str, ...]) -> int:
        self._token += 1
        for key in keys:
            self._keys[key].in_use += 1
        self._held[job_id] = (self._token, keys)
        return self._token

    def _park(self, job_id: str, waiter: _Waiter) -> None:
        bisect.insort(self._keys[waiter.at].queue, waiter.entry)
        self._parked[job_id] = waiter

    def _drain(self, key: str, out: list[Handoff]) -> None:
        """Hand ``key``'s room to its waiters until it is full or nobody waits."""
        state = self._keys[key]
        while state.queue and state.has_room():
            entry = state.queue.pop(0)
            job_id = entry[2]
            waiter = self._parked.pop(job_id)
            blocker = self._first_full(waiter.keys)
            if blocker is None:
                token = self._grant(job_id, waiter.keys)
                out.append(Handoff(job_id, token, waiter.keys, key))
                self._counts["handoffs"] += 1
            else:  # blocker != key: key has room
                waiter.at = blocker
                self._park(job_id, waiter)
                self._counts["moves"] += 1

    def _unref(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            state = self._keys[key]
            state.refs -= 1
            if state.refs == 0:
                del self._keys[key]
