"""Decoding what a workflow run's history holds.

A step's checkpointed result is JSON decoded as the step function's return annotation
(by that function's codec, built once per function), a signal's payload as the type
its wait asks for, and a children checkpoint as the list of the children's
``(status, payload)`` pairs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import msgspec

from fairlane.codec import ArgsCodec

__all__ = ["codec_of", "decode_as", "decode_result", "unpack_results"]

# Step functions' codecs, built once per function: every slice replays the run's
# history, asking for each step's codec again, and building one costs ~75 us.
_codecs: weakref.WeakKeyDictionary[Callable[..., Any], ArgsCodec] = weakref.WeakKeyDictionary()


def codec_of(fn: Callable[..., Any]) -> ArgsCodec:
    try:
        codec = _codecs.get(fn)
    except TypeError:  # not weakly referable (a builtin) or not hashable: no cache
        return ArgsCodec(fn)
    if codec is None:
        codec = _codecs[fn] = ArgsCodec(fn)
    return codec


def decode_result(codec: ArgsCodec, value: str | bytes) -> Any:
    blob = value.encode() if isinstance(value, str) else value
    return codec.decode_result(blob)


def decode_as(kind: Any, value: str | bytes) -> Any:
    blob = value.encode() if isinstance(value, str) else value
    return msgspec.json.decode(blob, type=kind, strict=False) if blob else None


def unpack_results(value: str | bytes) -> list[Any]:
    results = msgspec.json.decode(value)
    return list(results) if results else []  # the server writes an empty array as {}
