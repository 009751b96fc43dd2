"""What every payload store is: the ``PayloadStore`` protocol and the errors it raises.

The stores (``fairlane.payloads.directory``, ``fairlane.payloads.s3``) and the code
that moves payloads (``fairlane.payloads.offload``) all build on this module alone,
so that the package's entry point can choose a store without the stores importing it
back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["PayloadError", "PayloadMissing", "PayloadStore"]


class PayloadError(Exception):
    """A payload store failed to keep or hand back a payload."""

    # the type name jobs record and users match on (codec.encode_error), of every error
    # here: as before the move
    __module__ = "fairlane.payloads"


class PayloadMissing(PayloadError, LookupError):
    """A referenced payload is not in the store (removed, never written, or damaged)."""

    __module__ = "fairlane.payloads"


@runtime_checkable
class PayloadStore(Protocol):
    """Where large payloads are kept, by name. Every method may be called concurrently."""

    async def put(self, name: str, data: bytes) -> None:
        """Store ``data`` under ``name``; a reader sees all of it or nothing."""
        ...

    async def get(self, name: str) -> bytes:
        """The payload stored under ``name``; ``PayloadMissing`` if there is none."""
        ...

    async def delete(self, names: Sequence[str]) -> None:
        """Remove payloads; a name that is not stored is no error."""
        ...
