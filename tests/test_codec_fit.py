"""Stored arguments that do not fit the worker's signature: ``Unbound``, or dropped on request.

``Unbound`` (a ``msgspec.ValidationError``) is what a producer on another version of the
task leaves: a name the function does not take, one it needs and the job lacks, a type
it does not accept. It is told apart from what no version stores (not JSON; JSON but not
an object), which the worker dead-letters at once. A codec with ``drop_unknown`` calls
the function without the names it does not take, says which it dropped, and gives the
arguments without them for a process child to decode; what it cannot drop stays
``Unbound``.
"""

from __future__ import annotations

import msgspec
import pytest

from fairlane.codec import ArgsCodec, Unbound


async def greet(name: str, times: int = 1) -> str:
    return name * times


async def keyed(name: str, *, loud: bool = False) -> str:
    return name


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (b'{"name":"ann","shout":true}', "unknown field `shout`"),
        (b'{"times":2}', "missing required field `name`"),
        (b'{"name":"ann","times":"two"}', "Expected `int`, got `str`"),
    ],
    ids=["unknown", "missing", "type"],
)
def test_arguments_of_another_version_are_unbound(blob: bytes, says: str) -> None:
    with pytest.raises(Unbound, match=says):
        ArgsCodec(greet).decode(blob)
    with pytest.raises(Unbound, match=says):
        ArgsCodec(greet).call(blob)


@pytest.mark.parametrize("blob", [b"[1, 2]", b'"ann"', b"not json"])
def test_what_no_version_stores_is_not_unbound(blob: bytes) -> None:
    for codec in (ArgsCodec(greet), ArgsCodec(greet, drop_unknown=True)):
        with pytest.raises(msgspec.DecodeError) as raised:
            codec.decode(blob)
        assert not isinstance(raised.value, Unbound)


def test_a_dropping_codec_calls_without_the_names_it_does_not_take() -> None:
    codec = ArgsCodec(greet, drop_unknown=True)
    call = codec.call(b'{"name":"ann","shout":true,"lang":"fr","times":2}')
    assert (call.args, call.kwargs) == (["ann", 2], {})
    assert call.dropped == ("lang", "shout")
    assert call.trimmed is not None
    # what a process child decodes with a strict codec of the same function
    assert ArgsCodec(greet).decode(call.trimmed) == (["ann", 2], {})
    assert codec.decode(b'{"name":"ann","shout":true}') == (["ann", 1], {})
    fitting = codec.call(b'{"name":"bob"}')
    assert (fitting.dropped, fitting.trimmed) == ((), None)


def test_a_dropping_codec_keeps_keyword_only_parameters() -> None:
    codec = ArgsCodec(keyed, drop_unknown=True)
    assert codec.decode(b'{"name":"ann","loud":true,"extra":1}') == (["ann"], {"loud": True})


@pytest.mark.parametrize(
    ("blob", "says"),
    [
        (b'{"times":2,"shout":true}', "missing required field `name`"),
        (b'{"name":"ann","times":"two"}', "Expected `int`, got `str`"),
        (b'{"name":"ann","times":"two","shout":1}', "Expected `int`, got `str`"),
    ],
    ids=["missing", "type", "type-after-drop"],
)
def test_what_dropping_cannot_fix_stays_unbound(blob: bytes, says: str) -> None:
    with pytest.raises(Unbound, match=says):
        ArgsCodec(greet, drop_unknown=True).call(blob)
