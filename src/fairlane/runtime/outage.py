"""Riding out a store outage: one log line per outage, and a capped, jittered backoff.

Each worker loop that talks to the store keeps an :class:`Outage`. The first failed
call of an outage logs a warning; the calls that fail after it log at DEBUG only, so
a server that is down for an hour does not fill the log with one line per attempt;
the first call that succeeds again logs how long the store was unreachable.
:meth:`Outage.delay` is the pause before the next attempt: it doubles from ``base``
up to ``cap`` and is jittered, so that a fleet cut off together does not return in
lockstep and hammer a server that has just come back.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Final

__all__ = ["Outage"]

BASE_DELAY: Final = 0.1
MAX_DELAY: Final = 5.0


class Outage:
    """The state of one loop's connection to the store: up, or down since when."""

    __slots__ = ("_base", "_cap", "_failures", "_log", "_since", "what")

    def __init__(
        self,
        what: str,
        log: logging.Logger,
        *,
        base: float = BASE_DELAY,
        cap: float = MAX_DELAY,
    ) -> None:
        self.what = what
        self._log = log
        self._base = base
        self._cap = cap
        self._failures = 0
        self._since: float | None = None

    @property
    def down(self) -> bool:
        return self._since is not None

    @property
    def failures(self) -> int:
        """Failed calls in the current outage (0 while the store answers)."""
        return self._failures

    def failed(self, exc: BaseException) -> float:
        """Note a failed call; returns how long to wait before the next one."""
        self._failures += 1
        if self._since is None:
            self._since = time.monotonic()
            self._log.warning(
                "%s: the store is unreachable (%s); retrying with backoff", self.what, exc
            )
        else:
            self._log.debug(
                "%s: still unreachable (attempt %d): %s", self.what, self._failures, exc
            )
        return self.delay()

    def recovered(self) -> None:
        """Note a call that succeeded; logs the end of an outage, if there was one."""
        if self._since is not None:
            self._log.warning(
                "%s: the store answers again after %.1fs (%d failed call(s))",
                self.what,
                time.monotonic() - self._since,
                self._failures,
            )
        self._since = None
        self._failures = 0

    def delay(self) -> float:
        """The pause before the next attempt: ``base * 2**(failures-1)`` up to ``cap``,
        of which the upper half is random (never less than half the step)."""
        step = min(self._cap, self._base * 2.0 ** max(0, self._failures - 1))
        return step / 2 + random.uniform(0, step / 2)
