"""A connection the server closed while the client wrote on it: some redis-py versions in
Fairlane's range let the torn-down stream's own error out (``'NoneType' object has no
attribute 'writelines'``: its writer already gone) instead of a ``ConnectionError``. The
store takes such an error, raised inside redis-py's connection or asyncio's stream, for
the outage it is; the same error raised anywhere else is a bug, and stays one."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fairlane.store.base import unavailable
from fairlane.store.wire import StoreUnavailable


def _raiser(filename: str) -> Callable[[], None]:
    """A function whose code lives at ``filename`` and fails as a torn stream does."""
    source = "def write():\n    writer = None\n    writer.writelines([b'x'])\n"
    scope: dict[str, Callable[[], None]] = {}
    exec(compile(source, filename, "exec"), scope)
    return scope["write"]


@pytest.mark.parametrize(
    "where",
    [
        "/venv/site-packages/redis/asyncio/connection.py",
        "/usr/lib/python3.11/asyncio/streams.py",
        "/usr/lib/python3.11/asyncio/selector_events.py",
    ],
)
def test_a_torn_streams_error_is_an_outage(where: str) -> None:
    with pytest.raises(StoreUnavailable, match="closed the connection"), unavailable():
        _raiser(where)()


def test_the_same_error_anywhere_else_is_a_bug() -> None:
    with pytest.raises(AttributeError), unavailable():
        _raiser("/work/app/fairlane/store/exchange.py")()
