"""Argument and result payloads (fairlane.codec): binding, typing, round trips, errors."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fairlane.codec import ArgsCodec, ErrorInfo, decode_error, encode_error


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(msgspec.Struct, frozen=True):
    x: int
    y: int


@dataclass(frozen=True)
class Shape:
    name: str
    corners: list[Point]
    color: Color


def defaults(a: int, b: str = "bee", c: float | None = None) -> None: ...


def variadic(head: int, *rest: int, flag: bool = False, **extra: str) -> None: ...


def keyword_only(a: int, *, b: str, c: list[int] | None = None) -> None: ...


def positional_only(a: int, b: int, /, c: int = 3) -> None: ...


def rich(  # noqa: PLR0917 - many positional parameters on purpose
    shape: Shape,
    when: datetime,
    day: date,
    ident: uuid.UUID,
    amount: Decimal,
    gap: timedelta,
    blob: bytes,
    tags: set[str],
    pair: tuple[int, str],
) -> Shape: ...


def untyped(a, b=2):  # type: ignore[no-untyped-def]
    ...


def round_trip(fn: Any, *args: Any, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    codec = ArgsCodec(fn)
    return codec.decode(codec.encode(args, kwargs))


def test_defaults_are_filled_in_by_the_decoder() -> None:
    assert round_trip(defaults, 1) == ([1, "bee", None], {})
    assert round_trip(defaults, 1, c=2.5) == ([1, "bee", 2.5], {})
    assert round_trip(defaults, a=4, b="x") == ([4, "x", None], {})


def test_only_given_arguments_are_encoded() -> None:
    blob = ArgsCodec(defaults).encode((1,), {})
    assert msgspec.json.decode(blob) == {"a": 1}


def test_var_positional_and_var_keyword_round_trip() -> None:
    assert round_trip(variadic, 1) == ([1], {"flag": False})
    assert round_trip(variadic, 1, 2, 3, flag=True, x="y", z="w") == (
        [1, 2, 3],
        {"flag": True, "x": "y", "z": "w"},
    )


def test_keyword_only_parameters_come_back_as_keywords() -> None:
    args, kwargs = round_trip(keyword_only, 1, b="two", c=[3])
    assert args == [1]
    assert kwargs == {"b": "two", "c": [3]}
    keyword_only(*args, **kwargs)  # the decoded call is valid for the function


def test_positional_only_parameters_come_back_positionally() -> None:
    args, kwargs = round_trip(positional_only, 1, 2)
    assert (args, kwargs) == ([1, 2, 3], {})
    positional_only(*args, **kwargs)


def test_typed_values_round_trip() -> None:
    shape = Shape("tri", [Point(0, 0), Point(1, 0), Point(0, 1)], Color.BLUE)
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))
    values = (
        shape,
        when,
        date(2024, 1, 31),
        uuid.uuid4(),
        Decimal("12.50"),
        timedelta(seconds=90),
        b"\x00\xffbytes",
        {"a", "b"},
        (7, "seven"),
    )
    args, kwargs = round_trip(rich, *values)
    assert kwargs == {}
    assert args == list(values)
    assert isinstance(args[0], Shape) and isinstance(args[0].corners[0], Point)
    assert args[0].color is Color.BLUE
    assert args[1].utcoffset() == timedelta(hours=2)


def test_results_decode_into_the_return_type() -> None:
    codec = ArgsCodec(rich)
    shape = Shape("sq", [Point(1, 2)], Color.RED)
    assert codec.decode_result(codec.encode_result(shape)) == shape
    assert codec.decode_result(b"") is None


def test_untyped_parameters_decode_as_json_values() -> None:
    assert round_trip(untyped, {"k": [1, 2]}) == ([{"k": [1, 2]}, 2], {})
    assert ArgsCodec(untyped).decode_result(b'{"x":1}') == {"x": 1}


def test_unresolvable_annotations_fall_back_to_untyped() -> None:
    def fn(a: NoSuchType) -> int: ...  # type: ignore[name-defined]  # noqa: F821

    assert round_trip(fn, [1, "x"]) == ([[1, "x"]], {})


def test_skip_first_drops_the_bound_parameter() -> None:
    def method(self: object, n: int) -> int: ...

    codec = ArgsCodec(method, skip_first=True)
    assert codec.decode(codec.encode((5,), {})) == ([5], {})
    with pytest.raises(TypeError):
        codec.encode((object(), 5), {})


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((), {}, "signature"),  # missing a
        ((1, "b", 2.0, 4), {}, "signature"),  # too many positionals
        ((1,), {"d": 1}, "signature"),  # unknown keyword
        ((1,), {"a": 2}, "signature"),  # given twice
        (("1",), {}, "wrong type"),  # str for int
        ((1, 2), {}, "wrong type"),  # int for str
        ((1,), {"c": "x"}, "wrong type"),
        ((object(),), {}, "encoded"),
        ((1, "\ud800"), {}, "encoded"),  # a lone surrogate is not valid UTF-8
    ],
)
def test_bad_calls_raise_type_error(
    args: tuple[Any, ...], kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(TypeError, match=match):
        ArgsCodec(defaults).encode(args, kwargs)


def test_nested_wrong_type_is_caught() -> None:
    bad = Shape("tri", [Point(0, 0), {"x": "zero", "y": 0}], Color.RED)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="wrong type"):
        ArgsCodec(rich).encode(
            (
                bad,
                datetime.now(UTC),
                date.today(),
                uuid.uuid4(),
                Decimal(1),
                timedelta(0),
                b"",
                set(),
                (1, "a"),
            ),
            {},
        )


def test_check_false_skips_validation() -> None:
    blob = ArgsCodec(defaults).encode(("1",), {}, check=False)
    assert msgspec.json.decode(blob) == {"a": "1"}


@pytest.mark.parametrize(
    "blob",
    [
        b'{"a": "one"}',  # wrong type
        b'{"b": "x"}',  # missing a required parameter
        b'{"a": 1, "zzz": 2}',  # a parameter the function does not have
        b"[1, 2]",  # not an object
        b"\xff not json",
        b"",
    ],
)
def test_decoding_malformed_stored_arguments_raises(blob: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        ArgsCodec(defaults).decode(blob)


def test_error_round_trip_keeps_type_message_and_traceback() -> None:
    try:
        raise KeyError("missing thing")
    except KeyError as exc:
        info = decode_error(encode_error(exc))
    assert info.type == "KeyError"
    assert info.message == "'missing thing'"
    assert "raise KeyError" in info.traceback


def test_error_type_names_are_qualified_outside_builtins() -> None:
    info = decode_error(encode_error(msgspec.ValidationError("bad")))
    assert info.type == "msgspec.ValidationError"
    info = decode_error(encode_error(ValueError("x"), type_name="Custom", tb="tb text"))
    assert info == ErrorInfo("Custom", "x", "tb text")


def test_error_traceback_is_bounded() -> None:
    info = decode_error(encode_error(RuntimeError("big"), tb="x" * 100_000))
    assert len(info.traceback) == 8000


def test_errors_that_cannot_describe_themselves_are_still_encoded() -> None:
    class Mute(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no words")

    info = decode_error(encode_error(Mute()))
    assert info.type.endswith("Mute")
    assert "unprintable" in info.message


def test_error_text_with_lone_surrogates_is_encoded() -> None:
    info = decode_error(encode_error(ValueError("bad \ud800 text"), tb="tb \udfff"))
    assert info.type == "ValueError"
    assert info.message.startswith("bad ") and info.message.endswith(" text")
    assert "ud800" in info.message and "udfff" in info.traceback


def test_undecodable_error_payloads_degrade_gracefully() -> None:
    assert decode_error(b"plain text") == ErrorInfo("UnknownError", "plain text", "")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text(st.characters(exclude_categories=("Cs",))),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(exclude_categories=("Cs",)), max_size=5), inner, max_size=4
        )
    ),
    max_leaves=12,
)


def any_call(a: Any, *rest: Any, k: Any = None, **extra: Any) -> None: ...


@given(
    json_values,
    st.lists(json_values, max_size=3),
    json_values,
    st.dictionaries(
        st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=5).filter(
            lambda s: s not in ("a", "rest", "k", "extra")
        ),
        json_values,
        max_size=3,
    ),
)
def test_json_values_round_trip_exactly(
    a: Any, rest: list[Any], k: Any, extra: dict[str, Any]
) -> None:
    args, kwargs = round_trip(any_call, a, *rest, k=k, **extra)
    assert args == [a, *rest]
    assert kwargs == {"k": k, **extra}


def typed_call(n: int, xs: list[float], names: dict[str, int], when: datetime) -> None: ...


@given(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=5),
    st.dictionaries(
        st.text(st.characters(exclude_categories=("Cs",)), max_size=4),
        st.integers(min_value=-(2**31), max_value=2**31),
        max_size=3,
    ),
    st.datetimes(timezones=st.just(UTC)),
)
def test_typed_values_round_trip_exactly(
    n: int, xs: list[float], names: dict[str, int], when: datetime
) -> None:
    assert round_trip(typed_call, n, xs, names, when) == ([n, xs, names, when], {})
