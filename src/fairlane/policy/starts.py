"""A class's starts, counted by the second, and what they say of a job's wait.

Dispatch keeps, for each lane and class, a ring of the jobs it started in each second of
the server's clock and how many of those were retries -- attempts after a job's first
(``records.lua``, ``write_starts``: one ``HINCRBY`` per lane and class per call, none
per job). A bucket holds ``starts + RETRY_START * retries`` in one integer so that one
command counts both; :func:`unpack` splits it. The newest ``BUCKETS`` seconds are kept,
ten minutes.

``fairlane explain`` reads the ring of a job's class to tell how much of its wait was
taken by other jobs' retries (a retry storm in its class): over the seconds its waits
for a slot touched, the retry starts of other jobs and their share of all the starts
there (:func:`starts_while`). A retry holds a slot that work waiting behind it could
have taken, so that share is about how much longer its wait was for them. The figures
are whole seconds: a wait shorter than a second is told the starts of the one or two
seconds around it. Jobs an enqueue hands straight to an idle worker are counted too (the
same dispatch picks them); nothing else starts a job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BUCKETS",
    "RETRY_START",
    "TELL_SHARE",
    "WIDTH_MS",
    "StartsWhile",
    "bucket_of",
    "kept",
    "pack",
    "starts_while",
    "unpack",
]

#: a bucket's width: one second of the server's clock
WIDTH_MS: Final = 1000
#: buckets kept: ten minutes
BUCKETS: Final = 600
#: a bucket is ``starts + RETRY_START * retries``: 2**26 starts in one class in one second
#: is out of reach, and the sum stays exact in the scripts' doubles (below 2**53)
RETRY_START: Final = 1 << 26
#: the least share of a wait's starts that other jobs' retries must have to be told
TELL_SHARE: Final = 0.1


def bucket_of(ms: int) -> int:
    """The bucket (index: seconds since the epoch) that server time ``ms`` counts in."""
    return ms // WIDTH_MS


def pack(starts: int, retries: int) -> int:
    """One bucket's value for ``starts`` starts, ``retries`` of them retries."""
    return starts + RETRY_START * retries


def unpack(value: int) -> tuple[int, int]:
    """A bucket's (starts, retries)."""
    retries, starts = divmod(max(0, value), RETRY_START)
    return starts, retries


def kept(index: int, now_ms: int) -> bool:
    """Whether bucket ``index`` is still in the ring at server time ``now_ms`` (the
    scripts drop a bucket once the second ``BUCKETS`` later has started)."""
    return index > bucket_of(now_ms) - BUCKETS


@dataclass(frozen=True, slots=True)
class StartsWhile:
    """The starts of a class over the seconds a job's waits touched: ``seconds`` of
    them, ``starts`` in all, ``others_retries`` of them retries of other jobs."""

    seconds: int
    starts: int
    others_retries: int

    @property
    def share(self) -> float:
        return self.others_retries / self.starts if self.starts else 0.0

    @property
    def worth_telling(self) -> bool:
        """Other jobs' retries were a part of the starts worth a sentence."""
        return self.others_retries > 0 and self.share >= TELL_SHARE


def starts_while(
    buckets: Mapping[int, int],
    waits: Iterable[tuple[int, int]],
    own_retries: Iterable[int],
    now_ms: int,
) -> StartsWhile | None:
    """The class's starts over the seconds the ``waits`` (``(from_ms, to_ms)``) touched,
    the job's own retry starts (their times, ``own_retries``) taken out of the retries.
    None when there is no wait, or the ring no longer holds all of its seconds."""
    seconds: set[int] = set()
    for from_ms, to_ms in waits:
        seconds.update(range(bucket_of(from_ms), bucket_of(max(from_ms, to_ms)) + 1))
    if not seconds or not all(kept(s, now_ms) for s in seconds):
        return None
    starts = retries = 0
    for s in seconds:
        n, r = unpack(buckets.get(s, 0))
        starts, retries = starts + n, retries + r
    own = sum(1 for ms in own_retries if bucket_of(ms) in seconds)
    return StartsWhile(len(seconds), starts, max(0, retries - own))
