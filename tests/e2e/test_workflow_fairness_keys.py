"""A workflow's children take its fairness key, end to end with a real worker.

A run enqueued with ``fairness_key`` gets it back in its fetched job (the reply's last
field), and each child it starts is enqueued with it unless the call names its own
(``ctx.call(...).with_fairness_key(key)``); a run without a key starts children without
one. The keys are read back from the children's records (field ``fk``). A fetch reply of
the shape before the field still decodes, with no key.
"""

from __future__ import annotations

import msgspec
import pytest

from fairlane import App, Context
from fairlane.store.wire import FetchedJob
from tests.e2e.helpers import WAIT, make_app, running_worker

pytestmark = pytest.mark.anyio


async def _key(app: App, job_id: str) -> str | None:
    (value,) = await app.store.job_fields(job_id, "fk")
    return value.decode() if value is not None else None


@pytest.mark.contract
async def test_children_inherit_the_runs_fairness_key(redis_url: str, namespace: str) -> None:
    app = make_app(namespace, redis_url)
    seen: list[str] = []

    @app.task
    async def child(n: int) -> int:
        return n + 1

    @app.workflow(max_children=4)
    async def flow(ctx: Context) -> list[int]:
        seen.append(ctx.fairness_key)
        own = ctx.call(child, 2).with_fairness_key("report-bot")
        return await ctx.gather(ctx.call(child, 0), ctx.call(child, 1), own)

    async with app, running_worker(app, concurrency=4):
        keyed = await flow.enqueue(tenant="acme", fairness_key="user-42")
        plain = await flow.enqueue(tenant="acme")
        assert await keyed.result(timeout=WAIT) == [1, 2, 3]
        assert await plain.result(timeout=WAIT) == [1, 2, 3]
        keyed_children = [await _key(app, f"{keyed.id}.0.{i}") for i in range(3)]
        plain_children = [await _key(app, f"{plain.id}.0.{i}") for i in range(3)]

    assert set(seen) == {"user-42", ""}, "each slice's context carries the run's key"
    assert keyed_children == ["user-42", "user-42", "report-bot"]
    assert plain_children == [None, None, "report-bot"]


def test_a_reply_without_the_key_still_decodes() -> None:
    """The key is the row's last field: a row of the shape before it decodes, key ''."""
    row = ["j1", "7", 1, "t", "[]", 0, 0, "acme", 3, "1,60,full", 5, 1, "standard", "", ""]
    job = msgspec.msgpack.decode(msgspec.msgpack.encode(row), type=FetchedJob)
    assert (job.parent, job.fairness_key) == ("", "")
    keyed = msgspec.msgpack.decode(msgspec.msgpack.encode([*row, "u1"]), type=FetchedJob)
    assert keyed.fairness_key == "u1"
