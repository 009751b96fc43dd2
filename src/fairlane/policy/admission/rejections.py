"""Retry-After: how long a rejected client is told to wait before it submits again.

The section Retry-After of the admission contract (``docs/contracts/admission.md``).
The store counts a
tenant's rejections in the last minute (``note_rejection`` in ``lua/admission.lua``);
the client turns the count into seconds here, with a draw passed in, so that clients
rejected together do not come back together.
"""

from __future__ import annotations

import msgspec

from fairlane.policy.admission.units import check_count, check_number

__all__ = ["RetryAfterPolicy", "retry_after"]

# 2**16 already exceeds any sane cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 16


class RetryAfterPolicy(msgspec.Struct, frozen=True):
    """Retry-After for rejected submissions: ``base_seconds`` doubling per recent rejection."""

    base_seconds: float = 2.0
    max_seconds: float = 120.0

    def __post_init__(self) -> None:
        check_number("base_seconds", self.base_seconds)
        check_number("max_seconds", self.max_seconds, low=1.0)


def retry_after(rejections: int, u: float, policy: RetryAfterPolicy) -> float:
    """Seconds a client should wait after ``rejections`` rejections in the last 60 s."""
    n = check_count("rejections", rejections)
    if not 0.0 <= check_number("u", u) < 1.0:
        raise ValueError(f"u must be within [0, 1), got {u!r}")
    raw = min(policy.max_seconds, policy.base_seconds * float(2 ** min(n, _MAX_EXPONENT)))
    return min(policy.max_seconds, max(1.0, raw * (0.7 + 0.6 * u)))
