"""What one gateway holds: the Fairlane app, its connection, its API keys, the admin key
and its scopes.

The gateway starts even while the store is down: it connects on first use, and each
request that finds the store unreachable is answered 503 (and retries the connection).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fairlane.app import App
from fairlane.gateway.apikeys import ApiKeys, admin_key_id

__all__ = ["GatewayState"]


@dataclass
class GatewayState:
    app: App
    admin_key: str | None = None
    owns_connection: bool = False
    _keys: ApiKeys | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: what the admin key may do (``fairlane.gateway.apikeys.ADMIN_SCOPES``): it reads;
    #: ``operate`` pauses, resumes and quarantines
    admin_scopes: tuple[str, ...] = ("read",)
    _admin_id: str | None = None

    def admin_key_id(self) -> str:
        """The admin key's public name in the audit trail (derived once, on first use)."""
        if self._admin_id is None:
            self._admin_id = admin_key_id(self.admin_key or "")
        return self._admin_id

    async def connected(self) -> App:
        """The app, connected (``StoreUnavailable`` if the store cannot be reached)."""
        if not _is_connected(self.app):
            async with self._lock:
                if not _is_connected(self.app):
                    await self.app.connect()
                    self.owns_connection = True
        return self.app

    @property
    def key_cache(self) -> ApiKeys | None:
        """The key checks of the current connection, if made yet."""
        return self._keys

    def enqueue_checks_keys(self, tenant: str) -> bool:
        """Whether a submit of ``tenant`` can have its key checked by the enqueue
        itself: the tenant's shard holds the key records, and no durability wait."""
        app = self.app
        return app.sharded.shard_of(tenant) == 0 and not app.registry.durability.requested

    async def keys(self) -> ApiKeys:
        app = await self.connected()
        # a reconnected app has new stores, whose connection the key records must use
        if self._keys is None or self._keys.records is not app.store.key_records:
            self._keys = ApiKeys(app.store.key_records)
        return self._keys

    async def close(self) -> None:
        if self.owns_connection:
            await self.app.aclose()
            self.owns_connection = False


def _is_connected(app: App) -> bool:
    try:
        app.store  # noqa: B018 - raises RuntimeError until the app is connected
    except RuntimeError:
        return False
    return True
