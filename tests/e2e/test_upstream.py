"""A real upstream on loopback: the model endpoint of ``fairlane.testing.upstream``.

The upstream alone (httpx): its two token buckets (N requests per second, T tokens per
minute), 429 with ``Retry-After`` in whole seconds or as an HTTP-date, its counts per
tenant, and the bound of its own window.
"""

from __future__ import annotations

import math
import time
from email.utils import parsedate_to_datetime

import httpx
import pytest

from fairlane.testing.upstream import Upstream

pytestmark = pytest.mark.anyio


# -- the upstream alone ------------------------------------------------------------------------


async def test_requests_beyond_the_burst_get_429_with_whole_seconds() -> None:
    with Upstream(5) as upstream:
        async with httpx.AsyncClient() as client:
            answers = [
                await client.post(
                    upstream.complete_url, json={"tokens": 10}, headers={"X-Tenant": f"t{i % 2}"}
                )
                for i in range(7)
            ]
        stats = upstream.stats()
    codes = [a.status_code for a in answers]
    # the bucket holds 5 and refills one per 200 ms: the sixth and seventh come sooner
    assert codes[:5] == [200] * 5 and codes[5:] == [429, 429], codes
    assert all(a.headers["Retry-After"] == "1" for a in answers[5:])
    assert answers[0].json() == {"tokens": 10, "tenant": "t0"}
    assert (stats.calls, stats.served, stats.throttled, stats.tokens) == (7, 5, 2, 50)
    assert stats.tenants["t0"].served == 3 and stats.tenants["t0"].throttled == 1
    assert stats.tenants["t1"].served == 2 and stats.tenants["t1"].throttled == 1
    assert len(stats.served_at) == 5 and len(stats.throttled_at) == 2


async def test_tokens_per_minute_and_a_call_that_can_never_fit() -> None:
    with Upstream(100, tokens_per_minute=1200) as upstream:
        async with httpx.AsyncClient() as client:
            first = await client.post(upstream.complete_url, json={"tokens": 800, "tenant": "a"})
            second = await client.post(upstream.complete_url, json={"tokens": 800, "tenant": "a"})
            small = await client.post(upstream.complete_url, json={"tokens": 300, "tenant": "b"})
            huge = await client.post(upstream.complete_url, json={"tokens": 1300})
            bad = await client.post(upstream.complete_url, json={"tokens": -1})
        stats = upstream.stats()
    assert (first.status_code, second.status_code, small.status_code) == (200, 429, 200)
    # 400 tokens left, 400 short, refilled at 20 per second: 20 s (less the time elapsed)
    assert int(second.headers["Retry-After"]) in (20, 21)
    assert huge.status_code == 400 and bad.status_code == 400
    assert (stats.served, stats.throttled, stats.refused, stats.tokens) == (2, 1, 2, 1100)
    assert stats.tenants["a"].tokens == 800 and stats.tenants["b"].tokens == 300


async def test_retry_after_as_an_http_date() -> None:
    with Upstream(1, retry_after="http-date") as upstream:
        async with httpx.AsyncClient() as client:
            await client.post(upstream.complete_url, json={"tokens": 1})
            before = time.time()
            refused = await client.post(upstream.complete_url, json={"tokens": 1})
    assert refused.status_code == 429
    when = parsedate_to_datetime(refused.headers["Retry-After"]).timestamp()
    # the next token is due within a second; the date is that moment rounded up
    assert before < when <= math.ceil(before + 1.0) + 1


async def test_the_upstream_never_serves_more_than_its_window_bound() -> None:
    n = 20
    with Upstream(n) as upstream:
        async with httpx.AsyncClient() as client:
            start = time.monotonic()
            for _ in range(3000):  # bounded: about 1.5 s of calls, whatever the machine
                await client.post(upstream.complete_url, json={"tokens": 1})
                if time.monotonic() - start > 1.5:
                    break
        stats = upstream.stats()
        upstream.reset()
        assert upstream.stats().calls == 0
        async with httpx.AsyncClient() as client:
            again = await client.post(upstream.complete_url, json={"tokens": 1})
    assert stats.throttled > 0 and again.status_code == 200
    span = stats.served_at[-1][0] - stats.served_at[0][0]
    assert stats.served <= n * (1 + span) + 1
    assert stats.most_in_window(1.0) <= 2 * n
