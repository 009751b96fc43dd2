"""Large payloads: arguments and results over a threshold, kept outside the server.

This package owns the ``PayloadStore`` protocol and its two stores (a shared
directory, ``fairlane.payloads.directory``; S3-compatible object storage,
``fairlane.payloads.s3``, behind the ``s3`` extra), the reference a stored payload
travels as (``fairlane.codec.refs``), moving payloads in and out of jobs
(``fairlane.payloads.offload``) and removing them after their job's record
(``fairlane.payloads.sweep``).

A payload store is shared by every producer and worker of an app: each writes
what it offloads and reads what it is handed by name. Names are unique per job and
attempt, so nothing is ever overwritten in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "PayloadError",
    "PayloadMissing",
    "PayloadStore",
    "open_store",
]


class PayloadError(Exception):
    """A payload store failed to keep or hand back a payload."""


class PayloadMissing(PayloadError, LookupError):
    """A referenced payload is not in the store (removed, never written, or damaged)."""


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


def open_store(url: str) -> PayloadStore:
    """A store from a URL: ``file:///shared/dir`` (``?fsync=1`` to fsync each write),
    or ``s3://bucket/prefix`` with optional ``endpoint_url`` and ``region`` query
    parameters (credentials come from the usual AWS sources, never the URL)."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "file":
        # imported here: the store modules import this package's errors
        from fairlane.payloads.directory import DirectoryPayloadStore  # noqa: PLC0415

        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file:// payload store must be local: {url!r}")
        return DirectoryPayloadStore(
            unquote(parts.path), fsync=query.get("fsync", "0") in ("1", "true", "yes")
        )
    if parts.scheme == "s3":
        from fairlane.payloads.s3 import S3PayloadStore  # noqa: PLC0415

        if not parts.netloc:
            raise ValueError(f"an s3:// payload store needs a bucket: {url!r}")
        return S3PayloadStore(
            parts.netloc,
            prefix=unquote(parts.path.lstrip("/")),
            endpoint_url=query.get("endpoint_url"),
            region=query.get("region"),
        )
    raise ValueError(f"unknown payload store {url!r}: use file:///path or s3://bucket/prefix")
