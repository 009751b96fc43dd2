"""Fairness keys where people look: ``fairlane explain`` and ``fairlane inspect load``.

A tenant's flood on one key and a few jobs on others wait in a lane with no worker; the
explain command names a job's key, and inspect load shows the tenant's keys sharing its
part, the flooding key furthest ahead of the queue's head.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fairlane.cli import cli
from tests.e2e.helpers import make_app

APP_SOURCE = """
from fairlane import App
from tests.e2e.helpers import fast_settings

app = App({name!r}, redis_url={url!r}, settings=fast_settings())


@app.task
async def hello(n: int) -> int:
    return n
"""


def test_explain_and_inspect_load_show_the_fairness_key(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"keyed_{namespace}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

    async def enqueue() -> str:
        app = make_app(namespace, redis_url)

        @app.task
        async def hello(n: int) -> int:
            return n

        async with app:
            await hello.enqueue_many([(n,) for n in range(40)], tenant="acme", fairness_key="big")
            for name in ("u1", "u2"):
                await hello.enqueue(1, tenant="acme", fairness_key=name)
            await hello.enqueue(2, tenant="other")
            job = await hello.enqueue(3, tenant="acme", fairness_key="user-42")
        return job.id

    job_id = asyncio.run(enqueue())
    spec = f"{module}:app"
    env = {"COLUMNS": "200"}
    shown = CliRunner().invoke(cli, ["explain", spec, job_id], env=env)
    assert shown.exit_code == 0, shown.output
    assert shown.output.splitlines()[0].endswith("(queued), fairness key user-42")
    as_json = CliRunner().invoke(cli, ["explain", spec, job_id, "--json"])
    assert json.loads(as_json.output)["fairness_key"] == "user-42"

    load = CliRunner().invoke(cli, ["inspect", "load", spec], env=env)
    assert load.exit_code == 0, load.output
    print(load.output)
    assert "lane 'default': fairness keys" in load.output
    row = next(line for line in load.output.splitlines() if "acme" in line)
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    # 'big' was tagged 0..39 from the head; the three newcomers entered at the head
    assert cells[:3] == ["standard", "acme", "4"], row
    assert cells[3].startswith("big +40"), row
    assert not any("other" in line for line in load.output.splitlines()), load.output
