"""What the store's state machines share: a private app on the real server, an event
loop to drive ``Store`` calls from hypothesis's synchronous rules, and a teardown that
deletes every key the run wrote."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

from hypothesis.stateful import RuleBasedStateMachine

from fairlane.store.api import Store
from fairlane.store.connection import create_sync_client

T = TypeVar("T")


class StoreMachine(RuleBasedStateMachine):
    """A state machine talking to ``redis_url`` through a fresh app named ``<prefix>_<hex>``."""

    redis_url: ClassVar[str] = ""
    prefix: ClassVar[str] = "s"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.app = f"{self.prefix}_{secrets.token_hex(4)}"
        self.store = Store.from_url(self.redis_url, self.app, max_connections=4)
        self.keys = self.store.keys
        self.client = create_sync_client(self.redis_url)
        self.run(self.store.connect())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        """Delete the run's keys and close every connection."""
        try:
            keys = list(self.client.scan_iter(match=self.keys.match_all(), count=500))
            if keys:
                self.client.delete(*keys)
        finally:
            self.client.close()
            self.run(self.store.aclose())
            self.loop.close()

    def teardown(self) -> None:
        self.close()
