"""The Redis round trips of one ``POST /v1/jobs``: a count, not a time.

The gateway's submits go through the real app (httpx's ASGI transport) to the session's
server. Every command this process sends is counted as redis-py packs it (the suite's
own counter, ``benchmarks.common.counting``: each command is packed exactly once, and
nothing on the submit path is pipelined, so each is one round trip), and the server's
``INFO commandstats`` confirms the script calls. A submit with a key the gateway has
read before is one round trip: the enqueue script, which checks the key's record in
the same step (``enqueue_as``). The first submit of a key reads its record first.
"""

from __future__ import annotations

from collections import Counter

import pytest
import redis.asyncio as aioredis
from benchmarks.common import counting

from tests.gateway.helpers import gateway

pytestmark = [pytest.mark.anyio, pytest.mark.embedded_only]

SUBMITS = 40
#: commands sent per accepted submit, by name
BUDGET = {"fcall": 1}


async def _fcalls(client: aioredis.Redis) -> int:
    stats = await client.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


async def test_a_submit_is_one_script_call(redis_url: str, namespace: str) -> None:
    meter = aioredis.Redis.from_url(redis_url)
    try:
        async with gateway(namespace, redis_url) as gw:
            auth = await gw.key("acme")
            job = {"task": "add", "args": [1, 2]}
            # the first submit connects, declares, loads the library and reads the key
            assert (await gw.client.post("/v1/jobs", json=job, headers=auth)).status_code == 202
            before = await _fcalls(meter)
            with counting(Counter()) as sent:
                for _ in range(SUBMITS):
                    r = await gw.client.post("/v1/jobs", json=job, headers=auth)
                    assert r.status_code == 202, r.text
            scripts = await _fcalls(meter) - before
    finally:
        await meter.aclose()
    per_submit = {name: n / SUBMITS for name, n in sent.items()}
    assert per_submit == BUDGET, dict(sent)
    assert scripts == SUBMITS  # the server ran one script call per submit
