"""Retry delays: exponential backoff with a cap and jitter.

For attempt ``n`` (1 = the first attempt has just failed) the raw delay is
``min(cap, base * 2 ** (n - 1))``. Jitter spreads retries so that many jobs that
failed together do not come back together:

* ``full``  -- uniform in ``[0, raw]`` (the widest spread; the default),
* ``equal`` -- ``raw / 2`` plus uniform in ``[0, raw / 2]`` (never sooner than half),
* ``none``  -- exactly ``raw``.

The random draw ``u`` in ``[0, 1)`` is passed in so the function is pure; the Lua
library computes the same formula (``backoff_ms`` in ``lua/records.lua``, held to it by
``tests/store/test_records_lua.py``) for reclaims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Backoff", "Jitter"]

Jitter = Literal["full", "equal", "none"]
_JITTERS: tuple[str, ...] = ("full", "equal", "none")
# 2**62 already exceeds any cap; bounding the exponent keeps the float finite.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff: ``base`` seconds doubling per attempt, at most ``cap``."""

    base: float = 1.0
    cap: float = 60.0
    jitter: Jitter = "full"

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError(f"backoff base and cap must be >= 0, got {self.base}, {self.cap}")
        if self.jitter not in _JITTERS:
            raise ValueError(f"jitter must be one of {_JITTERS}, got {self.jitter!r}")

    def raw(self, attempt: int) -> float:
        """The delay before jitter after ``attempt`` failed attempts (``attempt >= 1``)."""
        exponent = min(max(attempt, 1) - 1, _MAX_EXPONENT)
        return min(self.cap, self.base * float(2**exponent))

    def delay(self, attempt: int, u: float) -> float:
        """The delay in seconds after ``attempt`` failed attempts, for a draw ``u`` in [0, 1)."""
        raw = self.raw(attempt)
        if self.jitter == "full":
            return raw * u
        if self.jitter == "equal":
            return raw / 2 + raw / 2 * u
        return raw

    def encode(self) -> str:
        """The compact form stored with each job, read by the Lua library."""
        return f"{self.base!r},{self.cap!r},{self.jitter}"

    @classmethod
    def decode(cls, text: str) -> Backoff:
        base, cap, jitter = text.split(",")
        if jitter not in _JITTERS:
            raise ValueError(f"bad jitter in stored backoff {text!r}")
        return cls(float(base), float(cap), jitter)  # type: ignore[arg-type]
