"""What retention removed: the ``gone`` index, read back as why a job has no record.

A trim (``records.lua``) notes every job whose record it removes in ``gone``, scored
``removal ms * 4 + why``: 0 and 1 a completed record removed by its task's count and
age bound, 2 and 3 a failed one (failed, cancelled or expired). The newest 10,000
removals are kept, so a reader asking soon after is told which retention setting
removed the job; an older one is simply not found.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Removal", "decode_removal"]

_WHY: dict[int, tuple[Literal["completed", "failed"], Literal["count", "age"]]] = {
    0: ("completed", "count"),
    1: ("completed", "age"),
    2: ("failed", "count"),
    3: ("failed", "age"),
}


class Removal(msgspec.Struct, frozen=True):
    """A job's record removed by retention: when, which outcome's bound, count or age."""

    ms: int
    outcome: Literal["completed", "failed"]
    bound: Literal["count", "age"]


def decode_removal(score: float) -> Removal:
    whole = int(score)
    outcome, bound = _WHY.get(whole % 4, ("completed", "count"))
    return Removal(whole // 4, outcome, bound)
