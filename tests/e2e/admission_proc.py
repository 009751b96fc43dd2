"""A submitter process for the admission tests, and the app it shares with them.

Run as ``python -m tests.e2e.admission_proc URL NAMESPACE CONFIG_JSON COUNT TENANT GO_KEY``
from the repository root. It builds the same app as the test (:func:`build_app`, the
pools config given as JSON), connects, waits (bounded) until ``GO_KEY`` exists on the
server (after counting itself in ``GO_KEY:ready``), so that every submitter starts
together, then submits ``COUNT`` one-unit jobs
one at a time and prints one JSON line: ``[[status, reason, job id or null], ...]``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from fairlane import App
from fairlane.app.task import Task
from fairlane.config.pools import parse_config
from tests.e2e.helpers import fast_settings

TASK = "adm_noop"
GO_WAIT = 30.0


def build_app(namespace: str, url: str, config: dict[str, Any]) -> tuple[App, Task[[int], int]]:
    """The app of the multi-process test: one no-op task, named the same everywhere."""
    app = App(namespace, redis_url=url, settings=fast_settings(), config=parse_config(config))

    @app.task(name=TASK)
    async def noop(n: int) -> int:
        return n

    return app, noop


async def submit_all(
    url: str, namespace: str, config: dict[str, Any], *, count: int, tenant: str, go_key: str
) -> list[tuple[str, str | None, str | None]]:
    app, noop = build_app(namespace, url, config)
    async with app:
        await app.store.client.incr(f"{go_key}:ready")
        deadline = time.monotonic() + GO_WAIT
        while not await app.store.client.exists(go_key):
            if time.monotonic() > deadline:
                raise SystemExit(f"no start signal ({go_key}) within {GO_WAIT}s")
            await asyncio.sleep(0.005)
        out: list[tuple[str, str | None, str | None]] = []
        for i in range(count):
            adm = await noop.submit(i, tenant=tenant, estimate=1.0)
            out.append((adm.status, adm.reason, adm.job.id if adm.job else None))
        return out


def main() -> None:
    url, namespace, config, count, tenant, go_key = sys.argv[1:7]
    result = asyncio.run(
        submit_all(
            url, namespace, json.loads(config), count=int(count), tenant=tenant, go_key=go_key
        )
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
