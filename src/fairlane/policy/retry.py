"""What happens to a failed attempt: retry after a backoff, or dead-letter.

Reclaims (a lease that expired because its worker was lost) count as attempts
too, so a poison job that kills its worker ends in the dead-letter set after its
budget instead of looping forever. The Lua library's ``sweep`` applies the same
rule to reclaims (``att >= max`` -> dead).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from fairlane.policy.backoff import Backoff

__all__ = ["RetryDecision", "after_failure"]


class RetryDecision(msgspec.Struct, frozen=True):
    kind: Literal["retry", "dead"]
    delay: float = 0.0


def after_failure(
    attempt: int, max_attempts: int, *, retryable: bool, backoff: Backoff, u: float
) -> RetryDecision:
    """Decide after attempt number ``attempt`` (1-based) failed."""
    if not retryable or attempt >= max_attempts:
        return RetryDecision("dead")
    return RetryDecision("retry", backoff.delay(attempt, u))
