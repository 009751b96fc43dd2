"""The small reference a large payload travels as, in place of its JSON.

A reference is itself JSON, ``{"$fl_ref":"<name>","size":<n>,"sha256":"<hex>"}``,
so every reader of a job record still sees valid JSON. It cannot be confused with
arguments: those are an object of parameter names, and ``$fl_ref`` is no Python
identifier. A result can be any value, so a result whose JSON happens to begin like
a reference is always stored by reference (see ``must_travel_by_reference``): what
begins with the marker in a record is then a reference, without exception.

Names are chosen by Fairlane, never by a caller, and are checked on the way back
in: a record is data from the server, and a name such as ``../x`` must not reach a
file system or a bucket.
"""

from __future__ import annotations

import re
import secrets
from typing import Final

import msgspec

__all__ = [
    "MARKER",
    "MalformedReference",
    "PayloadRef",
    "check_name",
    "decode_ref",
    "encode_ref",
    "is_ref",
    "new_name",
]

MARKER: Final = b'{"$fl_ref":'
_MARKER_TEXT: Final = MARKER.decode()
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]")
_DOTS: Final = re.compile(r"\.{2,}")
_HEX64: Final = re.compile(r"[0-9a-f]{64}")


class MalformedReference(ValueError):
    """A value that begins like a payload reference is not a valid one."""

    # the type name jobs record and users match on (codec.encode_error): as before the move
    __module__ = "fairlane.payloads.refs"


class PayloadRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where a payload is stored, how long it is, and its SHA-256 (checked when read)."""

    name: str = msgspec.field(name="$fl_ref")
    size: int = 0
    sha256: str = ""


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(PayloadRef)


def check_name(name: str) -> str:
    """``name`` if it is a safe payload name (no path parts, bounded), else raise."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise MalformedReference(f"not a valid payload name: {name[:80]!r}")
    return name


def new_name(job_id: str, kind: str) -> str:
    """A fresh name for one of a job's payloads: the job's id (made safe), the kind
    (``args`` or ``result``) and random bits, so two attempts never share a name."""
    # a name starts with a letter or a digit, and a trailing dot would make '..' with
    # the kind's: an id's own trailing '-' or '_' stays, so the name keeps the whole id
    safe = _DOTS.sub(".", _UNSAFE.sub("_", job_id)[:120]).lstrip("._-").rstrip(".") or "job"
    return check_name(f"{safe}.{kind}.{secrets.token_hex(8)}")


def is_ref(blob: bytes | str) -> bool:
    """Whether a stored value is a reference (it begins with the marker)."""
    if isinstance(blob, str):
        return blob.startswith(_MARKER_TEXT)
    return blob.startswith(MARKER)


def encode_ref(ref: PayloadRef) -> bytes:
    check_name(ref.name)
    return _ENCODER.encode(ref)


def decode_ref(blob: bytes | str) -> PayloadRef:
    """The reference a stored value holds; ``MalformedReference`` if it is not one."""
    try:
        ref = _DECODER.decode(blob)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedReference(f"a malformed payload reference: {exc}") from None
    check_name(ref.name)
    if ref.size < 0 or not _HEX64.fullmatch(ref.sha256):
        raise MalformedReference(f"a malformed payload reference to {ref.name!r}")
    return ref
