"""The store's memory mark: when the server is too full for new jobs, and for how long.

A server with ``maxmemory`` set and the ``noeviction`` policy (what ``fairlane doctor``
asks for) refuses every write past that limit, those that would drain it as much as
those that fill it, unless a write is let past the limit on purpose. Admission keeps
a margin below it: while the memory the server counts against ``maxmemory`` is at or
above ``mark`` of it (``store_full``), a new job is refused ``store_full`` before
anything is written, and the room left goes to what empties the store (workers
settling, leasing, sweeping). A server without a limit (``maxmemory`` 0) is never full
by this rule, nor is any server while the mark is off (None).

The reading is the client's: the server's ``INFO memory``, which is too heavy to ask
for on every submission. Between two readings the client reckons what it sent: each
job as its arguments plus ``JOB_OVERHEAD_BYTES`` (on the high side): ``sent``, the
calls answered since the reading, and ``pending``, those and the calls still under
way. A submission is refused while the reading plus ``pending`` is at or above the mark
(``store_full``), so that calls sent together cannot pass the mark together.
``reading_due`` says when the client reads again: every ``READ_EVERY`` seconds while
the server has a limit (every ``UNLIMITED_READ_EVERY`` while it has none, so that a
limit set later is seen), and at once when the reading plus ``sent`` reaches the mark:
a refusal is then made on what the server says, not on the reckoning. A client
therefore reads more often as the server nears its mark and never goes past it by
more than its reckoning misses; several clients share the margin above it.

Retry-After (``store_full_retry_after``): ``base_seconds`` at the mark, growing
linearly to four times that at the limit and past it (``depth``), jittered by +-30 %
as admission's rejections are (``rejections``), within ``[1, max_seconds]``. A refusal
costs the store nothing (no server call is made), so the wait is short.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from fairlane.policy.admission.rejections import RetryAfterPolicy
from fairlane.policy.admission.units import check_count, check_number

__all__ = [
    "DEFAULT_MEMORY_MARK",
    "JOB_OVERHEAD_BYTES",
    "READ_EVERY",
    "STORE_FULL",
    "UNLIMITED_READ_EVERY",
    "MemoryReading",
    "StoreFullReason",
    "check_mark",
    "depth",
    "reading_due",
    "store_full",
    "store_full_retry_after",
]

StoreFullReason = Literal["store_full"]
STORE_FULL: Final[StoreFullReason] = "store_full"
#: the share of ``maxmemory`` above which new jobs are refused, unless set otherwise
DEFAULT_MEMORY_MARK: Final = 0.9
#: seconds between two readings while the server has a limit
READ_EVERY: Final = 1.0
#: seconds between two readings while it has none
UNLIMITED_READ_EVERY: Final = 30.0
#: what a stored job is reckoned to cost the server beyond its arguments (its record's
#: fields, its queue entry), on the high side, between two readings
JOB_OVERHEAD_BYTES: Final = 2048
#: the Retry-After at the limit, in multiples of ``base_seconds``
_AT_LIMIT: Final = 4.0


class MemoryReading(msgspec.Struct, frozen=True):
    """The server's memory: ``used`` bytes counted against ``maxmemory`` (0: no limit)."""

    used: int
    maxmemory: int

    def __post_init__(self) -> None:
        check_count("used", self.used)
        check_count("maxmemory", self.maxmemory)


def check_mark(mark: float | None) -> float | None:
    """``mark`` if it is None (off) or a share of ``maxmemory`` in ``(0, 1]``."""
    if mark is None:
        return None
    value = check_number("the memory mark", mark, high=1.0)
    if value <= 0:
        raise ValueError(f"the memory mark must be above 0, got {mark!r}")
    return value


def store_full(reading: MemoryReading, mark: float | None, pending: int = 0) -> bool:
    """Whether a new job is refused ``store_full``: the server has a limit, the mark is
    on, and the memory used plus ``pending`` bytes reckoned on their way is at or above
    ``mark`` of the limit."""
    if mark is None or reading.maxmemory <= 0:
        return False
    return reading.used + pending >= mark * reading.maxmemory


def depth(reading: MemoryReading, mark: float) -> float:
    """How far a full server is from its mark to its limit: 0 at the mark, 1 at the
    limit and past it."""
    limit = reading.maxmemory
    if limit <= 0:
        return 0.0
    margin = (1.0 - mark) * limit
    if margin <= 0:
        return 1.0 if reading.used >= limit else 0.0
    return min(1.0, max(0.0, (reading.used - mark * limit) / margin))


def store_full_retry_after(how_deep: float, u: float, policy: RetryAfterPolicy) -> float:
    """Seconds a client refused ``store_full`` should wait, ``how_deep`` being the
    server's ``depth`` and ``u`` a draw in ``[0, 1)``."""
    deep = check_number("depth", how_deep, high=1.0)
    if not 0.0 <= check_number("u", u) < 1.0:
        raise ValueError(f"u must be within [0, 1), got {u!r}")
    raw = policy.base_seconds * (1.0 + (_AT_LIMIT - 1.0) * deep)
    return min(policy.max_seconds, max(1.0, raw * (0.7 + 0.6 * u)))


def reading_due(
    reading: MemoryReading | None, mark: float | None, elapsed: float, sent: int
) -> bool:
    """Whether a client reads the server's memory before its next submission, having
    last read ``reading`` ``elapsed`` seconds ago and had ``sent`` bytes stored (or
    refused) since. Never with the mark off."""
    if mark is None:
        return False
    if reading is None:
        return True
    if reading.maxmemory <= 0:
        return elapsed >= UNLIMITED_READ_EVERY
    return elapsed >= READ_EVERY or (sent > 0 and store_full(reading, mark, sent))
