"""The retry delay of a reclaimed attempt (``backoff_ms`` in ``lua/records.lua``) against
``fairlane.policy.backoff.Backoff``.

A worker computes a failed attempt's delay itself and settles it with the delay; the
reclaim sweep has no worker, so the script computes it from the job's stored backoff
spec. Run alone as a script on the real server, over random bases, caps, jitters,
attempts and draws, it must give ``floor(Backoff.delay(attempt, u) * 1000)``
milliseconds of the spec ``Backoff.encode`` stored; a spec that does not parse (a
record damaged while it ran) retries at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.backoff import Backoff
from tests.store.harness import lua_parts

_DRIVER = "return backoff_ms(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))\n"

seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)
caps = st.floats(min_value=0.0, max_value=1e9, allow_nan=False, allow_infinity=False)
draws = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@pytest.fixture(scope="module")
def backoff_ms(redis_url: str) -> Iterator[redis.commands.core.Script]:
    client = redis.Redis.from_url(redis_url)
    try:
        yield client.register_script(lua_parts("records.lua", "backoff_ms") + _DRIVER)
    finally:
        client.close()


@settings(max_examples=400, deadline=None)
@given(
    policy=st.builds(Backoff, seconds, caps, st.sampled_from(["full", "equal", "none"])),
    attempt=st.integers(0, 200),
    u=draws,
)
def test_lua_delays_a_reclaim_as_the_policy_does(
    backoff_ms: redis.commands.core.Script, policy: Backoff, attempt: int, u: float
) -> None:
    got = int(backoff_ms(args=[policy.encode(), attempt, repr(u)]))
    assert got == math.floor(policy.delay(attempt, u) * 1000)


@pytest.mark.parametrize("spec", ["", "1,2", "a,b,full", "nan,1,full", "1,nan,none", "1,2,3"])
def test_a_spec_that_does_not_parse_retries_at_once(
    backoff_ms: redis.commands.core.Script, spec: str
) -> None:
    assert int(backoff_ms(args=[spec, 3, "0.5"])) == 0
