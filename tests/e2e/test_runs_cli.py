"""End-to-end tests of ``fairlane runs show`` against a real server.

A small workflow (three steps over two slices, a durable sleep, a signal wait) runs to
completion on an in-process worker. While it waits for its signal, the command (as a
subprocess: the app object is in use here) must show the wait in progress; once it has
finished, the command (in this process, through Typer's ``CliRunner``) must show each
step, the slices and how they ended, the waits and the pending signals, and ``--json``
the same. The app lives in a temporary module named after the ``namespace`` fixture,
so its keys are deleted afterwards. Every wait is bounded.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner, Result

from fairlane.cli import cli
from tests.e2e.helpers import eventually, running_worker

pytestmark = pytest.mark.anyio

WIDE = {"COLUMNS": "250"}  # Rich tables on one line per row, whatever the terminal

APP_SOURCE = """
from fairlane import App, Context

app = App({name!r}, redis_url={url!r})


async def add(a: int, b: int) -> int:
    return a + b


@app.task
async def plain() -> int:
    return 1


@app.workflow(slice_steps=2)
async def flow(ctx: Context, n: int) -> int:
    total = 0
    for i in range(n):
        total = await ctx.step(f"add-{{i}}", add, total, i)
    await ctx.sleep(0.2)
    bonus = await ctx.wait_for_signal("go", timeout=20)
    return total + bonus
"""


@pytest.fixture
def project(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """A module ``<namespace>_runs`` in a temporary working directory, imported here too."""
    module_name = f"{namespace}_runs"
    (tmp_path / f"{module_name}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    try:
        yield importlib.import_module(module_name)
    finally:
        sys.modules.pop(module_name, None)


async def ainvoke(args: list[str]) -> Result:
    """The CLI in this process, off the event loop (commands run their own loop)."""
    return await anyio.to_thread.run_sync(lambda: CliRunner().invoke(cli, args, env=WIDE))


async def test_runs_show_prints_steps_slices_and_waits(project: ModuleType, redis_url: str) -> None:
    app: Any = project.app
    async with app:
        run = await project.flow.enqueue(3, tenant="acme")
        args = ["runs", "show", f"{project.__name__}:app", run.id, "--redis-url", redis_url]
        async with running_worker(app):

            async def waiting_for_signal() -> bool:
                wait = await app.store.client.hget(app.store.keys.job(run.id), "wf")
                return bool(wait == b"signal:go")

            await eventually(waiting_for_signal)
            # the app object is in use on this loop: the command runs in a process of its own
            midway = await anyio.run_process(
                [sys.executable, "-m", "fairlane.cli", *args, "--json"],
                env={k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")},
                check=False,
            )
            assert midway.returncode == 0, midway.stderr.decode()
            doc = json.loads(midway.stdout)
            assert doc["status"] == "scheduled" and len(doc["steps"]) == 4
            assert doc["slices"][-1]["outcome"] == "suspended"
            assert doc["waits"][-1]["kind"] == "signal" and doc["waits"][-1]["name"] == "go"
            assert doc["waits"][-1]["status"] == "waiting" and doc["waits"][-1]["until_ms"]
            assert await app.signal(run.id, "never-waited-for", 1) == "delivered"
            assert await app.signal(run.id, "go", 10) == "delivered"
            assert await run.result(timeout=15) == 0 + 1 + 2 + 10

    shown = await ainvoke(args)
    assert shown.exit_code == 0, shown.output
    out = shown.output
    for expected in ("flow", "acme", "completed", "add-0", "add-1", "add-2", "sleep:3", "go"):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    assert "steps (5)" in out and "slices (4)" in out and "waits (2)" in out
    assert "yielded its slot" in out
    assert "suspended waiting for sleep until" in out
    assert "suspended waiting for signal:go until" in out
    assert "ended: completed" in out
    pending = next(line for line in out.splitlines() if line.startswith("pending signals"))
    assert pending.split()[-1] == "1"

    as_json = await ainvoke([*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    _check_finished(json.loads(as_json.output), run.id)


def _check_finished(doc: dict[str, Any], run_id: str) -> None:
    """The JSON of the finished run of ``flow(3)``, signalled ``go`` = 10."""
    assert doc["id"] == run_id and doc["status"] == "completed" and doc["tenant"] == "acme"
    assert doc["result"] == 13
    assert [(s["kind"], s["name"]) for s in doc["steps"]] == [
        ("step", "add-0"),
        ("step", "add-1"),
        ("step", "add-2"),
        ("sleep", "sleep:3"),
        ("signal", "go"),
    ]
    assert [s["value"] for s in doc["steps"]][:3] == [0, 1, 3]
    slices = doc["slices"]
    assert [s["outcome"] for s in slices] == ["yielded", "suspended", "suspended", "ended"]
    assert [s["wait"] for s in slices] == [None, "sleep", "signal:go", None]
    assert slices[-1]["status"] == "completed"
    # each checkpoint is counted in the slice that wrote it: two steps, one step, the
    # sleep (checkpointed when the run woke), the signal
    assert [s["checkpoints"] for s in slices] == [2, 1, 1, 1]
    assert all(s["worker"] and s["started_ms"] <= s["ended_ms"] for s in slices)
    assert slices[1]["idle_ms"] >= 150  # the sleep of 0.2 s, less clock rounding
    waits = {w["kind"]: w for w in doc["waits"]}
    assert set(waits) == {"sleep", "signal"}
    assert waits["sleep"]["waited_ms"] >= 150 and waits["signal"]["status"] == "ok"
    assert doc["pending_signals"] == 1


async def test_runs_show_refuses_unknown_ids_and_plain_jobs(
    project: ModuleType, redis_url: str
) -> None:
    app: Any = project.app
    async with app:
        plain = await project.plain.enqueue()
    base = ["runs", "show", f"{project.__name__}:app"]

    missing = await ainvoke([*base, "nope", "--redis-url", redis_url])
    assert missing.exit_code == 1
    assert "no run nope" in missing.output

    not_a_run = await ainvoke([*base, plain.id, "--redis-url", redis_url, "--json"])
    assert not_a_run.exit_code == 1
    assert "not a workflow run" in not_a_run.output
