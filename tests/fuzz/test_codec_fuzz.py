"""Fuzzing the serializer (``fairlane.codec``) and the store's event decoding.

Whatever bytes a record holds, decoding raises only the documented errors (msgspec's
``DecodeError``, which ``ValidationError`` extends; ``ValueError`` for events), never
anything else; ``decode_error`` never raises at all. Whatever values a caller passes,
encoding either refuses them with ``TypeError`` at the call site or stores something
that decodes back to exactly what was passed: a value is never silently changed (a
NaN must not come back as ``None``).
"""

from __future__ import annotations

import contextlib
import math
from datetime import datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fairlane.codec import ArgsCodec, decode_error, encode_error
from fairlane.store.records import decode_event

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Point(msgspec.Struct):
    x: float
    y: float
    label: str = ""


def untyped(a: Any, *rest: Any, k: Any = None, **extra: Any) -> Any: ...


def typed(n: int, xs: list[float], p: Point, when: datetime, note: str | None = None) -> Point:
    raise NotImplementedError  # only its signature is used


def optional_float(x: float | None) -> float | None: ...


CODECS = [ArgsCodec(fn) for fn in (untyped, typed, optional_float)]

# JSON-ish values at their edges: non-finite floats, lone surrogates, huge integers
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(max_size=8)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON gives them back: tuples as lists, bytes as base64 text is not equal."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_stored_arguments_decode_or_raise_decode_error(blob: bytes) -> None:
    for codec in CODECS:
        with contextlib.suppress(msgspec.DecodeError):
            codec.decode(blob)


@FUZZ
@given(st.binary(max_size=200))
def test_stored_results_decode_or_raise_decode_error(blob: bytes) -> None:
    for codec in CODECS:
        with contextlib.suppress(msgspec.DecodeError):
            codec.decode_result(blob)


@FUZZ
@given(values, st.lists(values, max_size=3), values)
def test_untyped_arguments_round_trip_or_are_refused(a: Any, rest: list[Any], k: Any) -> None:
    codec = CODECS[0]
    try:
        blob = codec.encode((a, *rest), {"k": k})
    except TypeError:
        return
    args, kwargs = codec.decode(blob)
    # bytes travel as base64 text in an untyped slot: that is JSON's, and documented
    if not _has_bytes((a, rest, k)):
        assert _same([a, *rest], args), (a, rest, args)
        assert _same(k, kwargs["k"]), (k, kwargs)


def _has_bytes(value: Any) -> bool:
    if isinstance(value, bytes):
        return True
    if isinstance(value, list | tuple):
        return any(_has_bytes(v) for v in value)
    if isinstance(value, dict):
        return any(_has_bytes(v) for v in value.values())
    return False


@FUZZ
@given(
    st.integers(),
    st.lists(st.floats(), max_size=4),
    st.builds(Point, st.floats(), st.floats(), st.text(max_size=6)),
    # RFC 3339 offsets are whole minutes: the local mean times some zones kept before
    # ~1920 (e.g. +00:52:44) shift by their seconds, a limit of the format
    st.datetimes(timezones=st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m)))),
    st.none() | st.text(max_size=8),
)
def test_typed_arguments_round_trip_or_are_refused(
    n: int, xs: list[float], p: Point, when: datetime, note: str | None
) -> None:
    codec = CODECS[1]
    try:
        blob = codec.encode((n, xs, p, when, note), {})
    except TypeError:
        return
    args, _ = codec.decode(blob)
    assert args[0] == n and _same(xs, args[1]) and args[4] == note
    assert _same([p.x, p.y], [args[2].x, args[2].y]) and args[2].label == p.label
    assert args[3] == when


@FUZZ
@given(st.floats())
def test_a_float_never_comes_back_as_none(x: float) -> None:
    codec = CODECS[2]
    try:
        blob = codec.encode((x,), {})
    except TypeError:
        assert not math.isfinite(x)
        return
    assert codec.decode(blob)[0] == [x]


@FUZZ
@given(values)
def test_results_encode_exactly_or_raise(value: Any) -> None:
    codec = CODECS[0]
    try:
        blob = codec.encode_result(value)
    except (TypeError, ValueError, msgspec.EncodeError):
        return  # the runner turns these into ResultNotSerializable
    if not _has_bytes(value):
        assert _same(value, codec.decode_result(blob)), (value, blob)


@FUZZ
@given(st.binary(max_size=300))
def test_any_stored_error_decodes(blob: bytes) -> None:
    info = decode_error(blob)
    assert isinstance(info.type, str) and isinstance(info.message, str)


@FUZZ
@given(st.text(), st.text(max_size=40))
def test_errors_round_trip_whatever_their_text(message: str, name: str) -> None:
    info = decode_error(encode_error(RuntimeError(message), type_name=name or None))
    escaped = message.encode("utf-8", "backslashreplace").decode()
    assert info.message == escaped
    assert info.type == (name.encode("utf-8", "backslashreplace").decode() or "RuntimeError")


# what msgpack can hold: 64-bit integers
packable = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=12,
)


@FUZZ
@given(st.binary(max_size=100) | packable.map(msgspec.msgpack.encode))
def test_stored_events_decode_or_raise_value_error(blob: bytes) -> None:
    try:
        event = decode_event(blob)
    except ValueError:  # msgspec.DecodeError is one
        return
    assert isinstance(event.ms, int) and isinstance(event.kind, str)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_floats_are_refused_at_the_call_site(bad: float) -> None:
    for codec, call in ((CODECS[0], (bad,)), (CODECS[2], (bad,))):
        with pytest.raises(TypeError, match="finite"):
            codec.encode(call, {})
    with pytest.raises(TypeError, match="finite"):
        CODECS[0].encode(([1, {"deep": bad}],), {})
    with pytest.raises(TypeError, match="finite"):
        CODECS[1].encode((1, [], Point(bad, 0.0), datetime(2026, 1, 1)), {})
