"""``explain`` for a job parked on a global key: a key the tenants of an app of many
shards share, held in parts by its shards (``fairlane.policy.globalkeys``).

An app of two shards on one server is enough: its keys are made global and given parts
by hand (the calls the balancer makes), and the worker's own balancer is slowed so that
it leaves them as given. Shard 0 holds a quarter of a key of limit 4: one of its four
jobs runs, three park, and the answer names the part, its use and its waiters.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fairlane import App
from fairlane.app.worker import Worker
from fairlane.cli.explain import explain as explain_command
from fairlane.gateway.ui.jobs import job_detail
from fairlane.insight.globalkeys import global_key_text
from fairlane.policy.globalkeys import Order
from fairlane.store.globalkeys import Refused
from fairlane.store.views.globalkeys import GlobalKeyView, ShardPart, job_global_keys
from tests.e2e.helpers import WAIT, eventually, fast_settings
from tests.shards.test_sharding import tenants_of

APP_SOURCE = """
from fairlane import App

app = App({name!r}, redis_url={url!r}, shards=2)
"""

SENTENCE = (
    "waits for model:big: a global key of limit 4 shared by 2 shards; this shard holds 1 of "
    "it (part 0.25), 1 in use, 3 waiting here; the other shard holds 3, 0 in use, 0 waiting"
)


def test_the_sentence_names_the_part_its_use_and_the_other_shards() -> None:
    view = GlobalKeyView(
        "model:big",
        4,
        (ShardPart(0, 0.25, 1, 1, 3, 3.0), ShardPart(1, 0.75, 3, 0, 0, 0.0)),
    )
    assert global_key_text(view, 0) == SENTENCE
    rates = GlobalKeyView(
        "model:rpm", None, tuple(ShardPart(i, 0.5, None, 0, i, i) for i in (0, 1))
    )
    assert global_key_text(rates, 1) == (
        "waits for model:rpm: a global rate key shared by 2 shards; this shard holds part 0.5 "
        "of its rate, 0 in use, 1 waiting here; the other shard holds part 0.5, 0 in use, "
        "0 waiting"
    )


@asynccontextmanager
async def _worker_without_passes(app: App) -> AsyncIterator[Worker]:
    """A worker of an app of many shards that runs no balancer, so that the parts stay
    as the test gave them (the test marks the keys global itself)."""
    worker = Worker(app, lanes=[app.settings.default_lane], concurrency=8)
    assert worker.balancer is not None
    worker.balancer = None
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, WAIT)


def test_explain_tells_a_parked_job_its_shards_part_of_a_global_key(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"gk_{namespace}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    cli = typer.Typer()
    cli.command("explain")(explain_command)
    cli.command("noop")(lambda: None)  # two commands: the first is a subcommand, not the app
    spec = f"{module}:app"

    async def scenario() -> tuple[str, str, dict[str, object]]:
        app = App(namespace, redis_url=redis_url, settings=fast_settings(), shards=2)
        release = asyncio.Event()

        @app.task(limits={"model:big": 4})
        async def call_model() -> None:
            await release.wait()

        (tenant,) = tenants_of(app, [0])[0]
        async with app:
            home, other = app.stores
            for store in app.stores:
                await store.enable_global_keys()
            epoch = await home.next_epoch()
            assert await home.order_keys(epoch, [Order("model:big", 0.25)]) == {"model:big": 0.25}
            assert not isinstance(
                await other.order_keys(epoch, [Order("model:big", 0.75)]), Refused
            )
            jobs = await call_model.enqueue_many([()] * 4, tenant=tenant)
            async with _worker_without_passes(app):

                async def three_parked() -> bool:
                    shared = await home.view(job_global_keys, 0, ["model:big"])
                    view = shared.keys.get("model:big")
                    return view is not None and view.parts[0].waiting == 3

                await eventually(three_parked)
                parked = [
                    job.id
                    for job in jobs
                    if any(e.kind == "parked" for e in await home.job_events(job.id))
                ]
                assert len(parked) == 3
                run = CliRunner().invoke
                shown = await asyncio.to_thread(
                    run, cli, ["explain", spec, parked[0]], env={"COLUMNS": "250"}
                )
                as_json = await asyncio.to_thread(run, cli, ["explain", spec, parked[0], "--json"])
                detail = await job_detail(app, parked[0])
                release.set()
                await asyncio.gather(*(job.result(timeout=WAIT) for job in jobs))
        assert shown.exit_code == 0, shown.output
        assert as_json.exit_code == 0, as_json.output
        assert detail is not None
        return shown.output, as_json.output, detail

    _check(*asyncio.run(scenario()))


def _check(shown: str, as_json: str, detail: dict[str, object]) -> None:
    print(shown)
    text = " ".join(shown.split())
    assert "parked on throttle key model:big (limit 4) in its tenant's group; " + SENTENCE in text
    data = json.loads(as_json)
    assert data["segments"][-1]["open"] and data["segments"][-1]["cause"] == "throttle"
    (row,) = data["global_keys"]
    assert row["key"] == "model:big" and row["limit"] == 4
    assert [(s["part"], s["held"], s["used"], s["waiting"]) for s in row["shards"]] == [
        (0.25, 1, 1, 3),
        (0.75, 3, 0, 0),
    ]
    assert row["shards"][0]["weight"] == 1.0
    assert detail["global_keys"] == data["global_keys"]
    explanation = detail["explanation"]
    assert isinstance(explanation, dict)
    assert SENTENCE in explanation["segments"][-1]["why"]
