"""The app of the clock-skew test, and the worker process that serves it.

Run it as ``python -m tests.faults.skew_app`` from the repository root, under a shifted
clock (libfaketime); it reads ``FLT_APP`` and ``FLT_URL``. Tasks:

* ``stamp``: returns the worker's own idea of the time (epoch ms), so the test sees
  that the clock really was shifted;
* ``hold(seconds)``: holds its slot (and lease) for ``seconds``;
* ``every-second``: a cron task on a seconds schedule.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from fairlane.app import App
from fairlane.config.settings import load_settings
from fairlane.policy.retention import Retention

HERE = Path(__file__).resolve().parent
LEASE, RENEW, SWEEP = 1.0, 0.2, 0.3


def build_app(name: str, url: str) -> App:
    settings = load_settings(
        project_dir=HERE,
        environ={},
        redis_url=url,
        lease={"duration": LEASE, "renew_interval": RENEW, "sweep_interval": SWEEP},
        worker={"concurrency": 4, "grace_period": 1.0, "idle_block": 0.5},
    )
    app = App(name, redis_url=url, settings=settings)
    keep = Retention(completed=None, failed=None)

    @app.task(name="stamp", attempts=1, retention=keep)
    async def stamp() -> int:
        return time.time_ns() // 1_000_000

    @app.task(name="hold", attempts=2, retention=keep)
    async def hold(seconds: float) -> None:
        await asyncio.sleep(seconds)

    @app.cron("* * * * * *", name="every-second")
    async def every_second() -> None:
        return None

    return app


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    app = build_app(os.environ["FLT_APP"], os.environ["FLT_URL"])
    asyncio.run(app.run_worker(handle_signals=True))


if __name__ == "__main__":
    main()
