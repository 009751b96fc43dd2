"""``fairlane tenants pause|resume|quarantine``, ``fairlane pause|resume|pauses``: the
commands an operator runs, against a real server; bad input exits 2 and changes nothing."""

from __future__ import annotations

import asyncio
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


@app.task(name="ops.hello")
async def hello(n: int) -> int:
    return n
"""


def test_an_operator_pauses_quarantines_lists_and_resumes(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = f"ops_{namespace}"
    (tmp_path / f"{module}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])

    async def enqueue() -> None:
        app = make_app(namespace, redis_url)

        @app.task(name="ops.hello")
        async def hello(n: int) -> int:
            return n

        async with app:
            await hello.enqueue(1, tenant="acme")

    asyncio.run(enqueue())
    spec, env = f"{module}:app", {"COLUMNS": "200"}
    runner = CliRunner()

    def ok(*args: str) -> str:
        result = runner.invoke(cli, list(args), env=env)
        assert result.exit_code == 0, result.output
        return result.output

    def refused(*args: str) -> str:
        result = runner.invoke(cli, list(args), env=env)
        assert result.exit_code == 2, result.output
        return result.output

    said = ok("tenants", "pause", spec, "acme", "--reason", "loop", "--for", "30m",
              "--refuse-submissions")  # fmt: skip
    assert "paused tenant acme until" in said and "submissions of tenant acme" in said
    assert "paused task ops.hello" in ok("pause", spec, "--task", "ops.hello")
    assert "paused lane default" in ok("pause", spec, "--lane", "default", "--class", "batch")
    listed = ok("pauses", spec)
    assert "tenant acme" in listed and "task ops.hello" in listed and "loop" in listed
    assert "default/batch" in listed
    # bad input: exit 2, nothing changed
    assert "unknown tenant" in refused("tenants", "pause", spec, "nobody")
    assert "unknown task" in refused("pause", spec, "--task", "no.such")
    assert "no class" in refused("pause", spec, "--lane", "default", "--class", "gold")
    assert "--for" in refused("tenants", "pause", spec, "acme", "--for", "soon")
    assert "name one scope" in refused("pause", spec)
    assert ok("pauses", spec) == listed
    ok("tenants", "resume", spec, "acme")
    ok("resume", spec, "--task", "ops.hello")
    ok("resume", spec, "--lane", "default", "--class", "batch")
    assert "nothing is paused" in ok("pauses", spec)
    result = runner.invoke(cli, ["tenants", "resume", spec, "acme"], env=env)
    assert result.exit_code == 1 and "not paused" in result.output
