"""Tasks are private unless exposed: ``gateway=True`` is the only way in over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairlane import App
from fairlane.cli import cli
from fairlane.gateway import create_app
from fairlane.gateway.exposure import NothingExposed
from tests.gateway.helpers import gateway

pytestmark = pytest.mark.anyio

PRIVATE = "purge_customer_data"
UNKNOWN = "purge_customer_dat_"  # as long as the private name: the answers are alike


async def test_a_private_task_answers_as_an_unknown_one(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        auth = await gw.key("acme")
        answers = []
        for name in (PRIVATE, UNKNOWN):
            r = await gw.client.post("/v1/jobs", json={"task": name, "args": ["c"]}, headers=auth)
            answers.append((r.status_code, dict(r.headers), r.text.replace(name, "<name>")))
        assert answers[0][0] == 422 and "unknown_task" in answers[0][2]
        assert answers[0] == answers[1]
        jobs = [k async for k in gw.app.store.client.scan_iter(match=gw.app.store.keys.job("*"))]
        assert jobs == []  # nothing stored
        # the platform's own code still enqueues it
        assert (await gw.app.tasks[PRIVATE].enqueue("c", tenant="acme")).id
        # an exposed task and workflow are callable
        ok = await gw.client.post("/v1/jobs", json={"task": "echo"}, headers=auth)
        run = await gw.client.post(
            "/v1/jobs", json={"task": "approval", "args": ["d"]}, headers=auth
        )
        assert (ok.status_code, run.status_code) == (202, 202)


async def test_the_spec_lists_the_exposed_tasks_only(redis_url: str, namespace: str) -> None:
    async with gateway(namespace, redis_url) as gw:
        spec = (await gw.client.get("/openapi.json")).json()
    task = spec["components"]["schemas"]["SubmitRequest"]["properties"]["task"]
    assert task["enum"] == ["add", "approval", "boom", "echo"]


def test_a_gateway_with_nothing_exposed_refuses_to_start(namespace: str) -> None:
    app = App(namespace)

    @app.task(name="internal")
    async def internal() -> None: ...

    with pytest.raises(NothingExposed, match=r"gateway=True"):
        create_app(app)


def test_inspect_tasks_shows_which_are_exposed(tmp_path: Path) -> None:
    module = tmp_path / "exposure_app.py"
    module.write_text(
        "from fairlane import App\n"
        "app = App('exposure')\n"
        "@app.task(name='public_one', gateway=True)\n"
        "async def public_one() -> None: ...\n"
        "@app.task(name='private_one')\n"
        "async def private_one() -> None: ...\n"
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(tmp_path))
        result = CliRunner().invoke(
            cli, ["inspect", "tasks", "exposure_app:app"], env={"COLUMNS": "200"}
        )
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if "_one" in line}
    assert "exposed" in rows["public_one"] and "private" in rows["private_one"]
