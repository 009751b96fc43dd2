"""The front door over HTTP, against the session's server (``fairlane.gateway.frontdoor``).

A tenant past its rate is answered 429 ``tenant_rate`` with the wait for its next token
as Retry-After, and the store is not asked; past its requests in flight, 429
``tenant_in_flight``; a long poll holds no seat while it waits. A tenant that floods a
gateway with more requests than the app has connections gets 429 ``gateway_busy`` for
its excess while another tenant's requests, one at a time, all succeed: no 503 anywhere,
since the store was up throughout. A store whose connections all stay busy is 429
``store_busy`` too.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest
from benchmarks.common import counting

from fairlane.gateway.frontdoor import FrontDoor
from tests.faults.worker_proc import eventually
from tests.gateway.helpers import Gateway, gateway, stored_keys

pytestmark = pytest.mark.anyio

JOB = {"task": "echo", "args": ["x"]}


def _door(gw: Gateway) -> FrontDoor:
    door: FrontDoor = gw.api.state.front_door
    return door


async def _known(gw: Gateway, tenant: str) -> dict[str, str]:
    """A key of ``tenant`` the gateway has read (a key's first request is its lookup)."""
    auth = await gw.key(tenant)
    assert (await gw.client.get("/v1/jobs/nothing-here", headers=auth)).status_code == 404
    return auth


async def test_a_submit_over_its_tenants_rate_is_429_and_the_store_is_not_asked(
    redis_url: str, namespace: str
) -> None:
    one_in_five_seconds = {"tenants": {"acme": {"rate": 0.2, "burst": 1}}, "refusal_hold": 0.3}
    async with gateway(namespace, redis_url, front_door=one_in_five_seconds) as gw:
        acme, globex = await _known(gw, "acme"), await _known(gw, "globex")
        assert (await gw.client.post("/v1/jobs", json=JOB, headers=acme)).status_code == 202
        before = await stored_keys(redis_url, namespace)
        with counting(Counter()) as sent:
            refused = await gw.client.post("/v1/jobs", json=JOB, headers=acme)
        assert refused.status_code == 429, refused.text
        body = refused.json()
        assert body["reason"] == "tenant_rate"
        # the bucket's next token is five seconds after the first submit took the last
        assert 4.0 < body["retry_after_seconds"] <= 5.0
        assert refused.headers["Retry-After"] == "5"
        assert refused.headers["Cache-Control"] == "no-store"
        assert not sent, sent  # not one command
        # again before its Retry-After: refused too, but only once the hold runs out
        again = asyncio.create_task(gw.client.post("/v1/jobs", json=JOB, headers=acme))

        async def held() -> bool:
            return _door(gw).holds.held == 1

        await eventually(held, "the answer held", timeout=10)
        assert (await again).json()["reason"] == "tenant_rate"
        assert _door(gw).holds.held == 0
        assert await stored_keys(redis_url, namespace) == before
        # acme's reads are not submits, and globex has a bucket of its own
        assert (await gw.client.get("/v1/jobs/x", headers=acme)).status_code == 404
        assert (await gw.client.post("/v1/jobs", json=JOB, headers=globex)).status_code == 202


async def test_requests_in_flight_are_bounded_and_a_long_poll_holds_no_seat(
    redis_url: str, namespace: str
) -> None:
    door = {"seats": 1, "tenants": {"acme": {"max_in_flight": 1}}}
    async with gateway(namespace, redis_url, front_door=door) as gw:
        acme, globex = await _known(gw, "acme"), await _known(gw, "globex")
        job = (await gw.client.post("/v1/jobs", json=JOB, headers=acme)).json()
        # no worker runs: the poll waits its 20 s unless cancelled
        url = f"/v1/jobs/{job['id']}/result?wait=20"
        poll = asyncio.create_task(gw.client.get(url, headers=acme))

        async def polling() -> bool:
            return _door(gw).in_flight.get("acme") == 1

        await eventually(polling, "the poll in flight", timeout=10)
        refused = await gw.client.post("/v1/jobs", json=JOB, headers=acme)
        assert (refused.status_code, refused.json()["reason"]) == (429, "tenant_in_flight")
        assert refused.headers["Retry-After"] == "1"
        # the only seat is free while acme's poll waits: globex is served at once
        other = await gw.client.post("/v1/jobs", json=JOB, headers=globex)
        assert other.status_code == 202 and not poll.done()
        poll.cancel()
        with pytest.raises(asyncio.CancelledError):
            await poll
        assert _door(gw).in_flight == {}
        assert (await gw.client.post("/v1/jobs", json=JOB, headers=acme)).status_code == 202


async def _flood(
    client: httpx.AsyncClient, auth: dict[str, str], seen: Counter[str], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        r = await client.post("/v1/jobs", json=JOB, headers=auth)
        said = r.json()
        seen[f"{r.status_code} {said.get('reason') or said.get('state')}"] += 1
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
        await asyncio.sleep(0)  # a refusal takes no I/O: let the others run


async def test_a_flood_beyond_the_connections_is_429_for_the_flooder_only(
    redis_url: str, namespace: str
) -> None:
    # four connections, so four seats, and a waiting room of four; A keeps 16 requests
    # going, B sends one at a time; only the seats bound A (no rate, in flight 100)
    door = {"tenant_rate": "none", "waiting": 4}
    settings = {"connection": {"max_connections": 4}, "front_door": door}
    async with gateway(namespace, redis_url, **settings) as gw:
        a, b = await _known(gw, "a"), await _known(gw, "b")
        a_seen: Counter[str] = Counter()
        stop = asyncio.Event()
        flood = [asyncio.create_task(_flood(gw.client, a, a_seen, stop)) for _ in range(16)]
        try:

            async def flooding() -> bool:
                return sum(a_seen.values()) >= 50

            await eventually(flooding, "the flood", timeout=10)
            b_seen: Counter[int] = Counter()
            for _ in range(20):
                r = await gw.client.post("/v1/jobs", json=JOB, headers=b)
                b_seen[r.status_code] += 1
        finally:
            stop.set()
            await asyncio.gather(*flood)
    assert b_seen == {202: 20}
    assert a_seen["202 accepted"] > 0 and a_seen["429 gateway_busy"] > 0, a_seen
    assert set(a_seen) <= {"202 accepted", "429 gateway_busy"}, a_seen


async def test_a_store_whose_connections_stay_busy_is_429_not_503(
    redis_url: str, namespace: str
) -> None:
    # the one connection held outside the gateway's seats: the store's own gate runs out
    settings = {"connection": {"max_connections": 1, "timeout": 0.5}}
    async with gateway(namespace, redis_url, **settings) as gw:
        acme = await _known(gw, "acme")
        async with gw.app.store.gates[0].slot():
            submit = await gw.client.post("/v1/jobs", json=JOB, headers=acme)
            read = await gw.client.get("/v1/jobs/x", headers=acme)
    for answer in (submit, read):
        assert (answer.status_code, answer.json()["reason"]) == (429, "store_busy"), answer.text
        assert answer.headers["Retry-After"] == "1"
