"""Refusals ignored: the answer to a tenant that comes back before its Retry-After.

A 429 says when to try again. A client that ignores it and sends again at once (a
closed-loop load generator, a retry loop without a pause) is refused again, and an
answer costs the gateway's one event loop about as much as a submit: a flood of
immediate refusals leaves every other tenant's requests waiting behind them. So a flow
refused again before the Retry-After it was last given has run out gets its 429 only
after ``longest`` seconds (``front_door.refusal_hold``). Meanwhile it costs a sleeping
coroutine and nothing else, and each of its connections sends about one request per
hold. A client that waits as told is never held, and a held request has already been
refused: nothing it could be given is lost.

The hold is ``longest``, not what is left of the Retry-After: a tenant past its rate is
told to come back when its next token is due, a few milliseconds away under a flood,
and a hold that short would let its connections come back hundreds of times a second.
The flow's Retry-After runs out when the latest one given to any of its requests does:
a tenant whose clients together keep coming back early is held as one.

Each hold is drawn between half and all of ``longest`` (``SPREAD``). Held to one
moment, a flood's connections would all be answered, come back and be refused
together: a burst of a hundred requests that every other tenant's request arriving
with it waits behind. Spread, they come back one by one.

At most ``MAX_HELD`` answers are held at once in a process; past that, refusals are
answered at once, so held answers cannot grow without bound. A flow's last Retry-After
is forgotten once it has run out (those run out are dropped as the map grows).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable
from typing import Final

__all__ = ["MAX_HELD", "SPREAD", "Holds"]

#: answers held at once, at most, in one gateway process
MAX_HELD: Final = 4096
#: flows whose Retry-After is kept before those run out are dropped
_PRUNE_AT: Final = 10_000
#: the least share of ``longest`` a hold lasts (drawn up to all of it)
SPREAD: Final = 0.5


class Holds:
    """When each flow may try again, and the answers held until then."""

    def __init__(
        self,
        longest: float,
        clock: Callable[[], float],
        draw: Callable[[], float] = random.random,
    ) -> None:
        self.longest = longest
        self.clock = clock
        self.draw = draw  # in [0, 1): where a hold falls between half and all of longest
        self.held = 0
        self._until: dict[Hashable, float] = {}

    def hold_for(self, flow: Hashable, retry_after: float) -> float:
        """Note a refusal of ``flow`` with ``retry_after``; the seconds to hold its answer
        (0: at once)."""
        now = self.clock()
        until = self._until.get(flow, 0.0)
        if len(self._until) >= _PRUNE_AT and flow not in self._until:
            self._until = {f: t for f, t in self._until.items() if t > now}
        self._until[flow] = max(until, now + retry_after)
        if now >= until or self.held >= MAX_HELD:
            return 0.0
        return self.longest * (SPREAD + (1.0 - SPREAD) * self.draw())

    async def hold(self, flow: Hashable, retry_after: float) -> None:
        """Wait as long as ``hold_for`` says before a refusal is answered."""
        seconds = self.hold_for(flow, retry_after)
        if seconds <= 0:
            return
        self.held += 1
        try:
            await asyncio.sleep(seconds)
        finally:
            self.held -= 1
