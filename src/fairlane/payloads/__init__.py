"""Large payloads: arguments and results over a threshold, kept outside the server.

This package owns the ``PayloadStore`` protocol and its errors
(``fairlane.payloads.base``), its two stores (a shared directory,
``fairlane.payloads.directory``; S3-compatible object storage, ``fairlane.payloads.s3``,
behind the ``s3`` extra) and ``open_store``, which picks one from a URL; moving payloads
in and out of jobs (``fairlane.payloads.offload``) and the sweep step that removes a
payload after its job's record (``fairlane.payloads.sweep``; the worker's loop that
repeats it is ``fairlane.runtime.payload_sweep``). The index that records every stored
payload with its job is the store's (``fairlane.store.payloadindex``); the reference a
stored payload travels as is the codec's (``fairlane.codec.refs``).

A payload store is shared by every producer and worker of an app: each writes
what it offloads and reads what it is handed by name. Names are unique per job and
attempt, so nothing is ever overwritten in place.
"""

from __future__ import annotations

from urllib.parse import parse_qs, unquote, urlsplit

from fairlane.payloads.base import PayloadError, PayloadMissing, PayloadStore
from fairlane.payloads.directory import DirectoryPayloadStore
from fairlane.payloads.s3 import S3PayloadStore

__all__ = [
    "PayloadError",
    "PayloadMissing",
    "PayloadStore",
    "open_store",
]


def open_store(url: str) -> PayloadStore:
    """A store from a URL: ``file:///shared/dir`` (``?fsync=1`` to fsync each write),
    or ``s3://bucket/prefix`` with optional ``endpoint_url`` and ``region`` query
    parameters (credentials come from the usual AWS sources, never the URL)."""
    parts = urlsplit(url)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"a file:// payload store must be local: {url!r}")
        return DirectoryPayloadStore(
            unquote(parts.path), fsync=query.get("fsync", "0") in ("1", "true", "yes")
        )
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"an s3:// payload store needs a bucket: {url!r}")
        return S3PayloadStore(
            parts.netloc,
            prefix=unquote(parts.path.lstrip("/")),
            endpoint_url=query.get("endpoint_url"),
            region=query.get("region"),
        )
    raise ValueError(f"unknown payload store {url!r}: use file:///path or s3://bucket/prefix")
