"""The HTTP gateway: tenants submit and follow jobs over HTTP, authenticated by API keys.

``create_app(app)`` builds the FastAPI app (``factory``); ``apikeys`` mints and checks
keys; ``auth`` turns a bearer key into a caller; ``jobs`` and ``runs`` are the
endpoints; ``models`` the bodies; ``responses`` the error shape; ``limits`` the body
size limit; ``frontdoor`` the bounds per tenant every request of the tenants' API
passes first (``buckets`` its submission rates, ``seats`` its fair share of the
store's connections, ``holds`` the answers to refusals ignored); ``state`` the
connection the gateway holds; ``audit`` the audit trail's entries the gateway writes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fairlane.gateway.apikeys import ApiKeys, KeyNotFound, MintedKey

if TYPE_CHECKING:
    from fairlane.gateway.factory import create_app

__all__ = ["ApiKeys", "KeyNotFound", "MintedKey", "create_app"]


def __getattr__(name: str) -> Any:
    # FastAPI comes with the gateway extra: key management (``fairlane tenants``) works
    # without it, and the app factory is imported only when asked for
    if name == "create_app":
        from fairlane.gateway.factory import create_app  # noqa: PLC0415 - optional extra

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
