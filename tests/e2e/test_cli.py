"""End-to-end tests of the ``fairlane`` command line, against a real server.

Most commands run in this process through Typer's ``CliRunner``; workers (burst, SIGTERM,
``--check``, ``--reload``) and ``example`` run as real subprocesses
(``python -m fairlane.cli``). Each test writes its app into a temporary module whose app
is named after the ``namespace`` fixture, so its keys are deleted afterwards. Every wait is
bounded.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest
import redis
import redis.asyncio as aioredis
from typer.testing import CliRunner, Result

from fairlane.cli import cli
from fairlane.devserver import stop_dev_server
from fairlane.store.connection import create_client
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

WAIT = 30.0  # upper bound of any single wait in these tests
WIDE = {"COLUMNS": "250"}  # Rich tables on one line per row, whatever the terminal

APP_SOURCE = """
import asyncio

from fairlane import App

app = App({name!r}, redis_url={url!r})


@app.task
async def add(a: int, b: int) -> int:
    return a + b


@app.task(timeout=120)
async def nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "rested"


@app.task(attempts=1)
async def boom(message: str) -> None:
    raise ValueError(message)


@app.task(lane="heavy", attempts=5, timeout=2.5, executor="thread")
def crunch(n: int) -> int:
    return n * n


@app.cron("*/10 * * * *")
async def tick() -> None:
    return None
"""


# -- fixtures and helpers ---------------------------------------------------------------


@pytest.fixture
def project(
    tmp_path: Path, namespace: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """A module ``<namespace>_app`` in a temporary working directory, imported here too."""
    module_name = f"{namespace}_app"
    (tmp_path / f"{module_name}.py").write_text(APP_SOURCE.format(name=namespace, url=redis_url))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    try:
        yield importlib.import_module(module_name)
    finally:
        sys.modules.pop(module_name, None)


def spec(project: ModuleType) -> str:
    return f"{project.__name__}:app"


def invoke(args: list[str], *, env: dict[str, str] | None = None, **kwargs: Any) -> Result:
    """Run the CLI in this process (call from a worker thread in async tests)."""
    return CliRunner().invoke(cli, args, env={**WIDE, **(env or {})}, **kwargs)


async def ainvoke(args: list[str], **kwargs: Any) -> Result:
    """``invoke`` from async tests: commands run their own event loop, so not on this one."""
    return await anyio.to_thread.run_sync(lambda: invoke(args, **kwargs))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any FAIRLANE_ setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    env.update(WIDE)
    env.update(extra)
    return env


# Python leaves SIGINT ignored in a child whose parent ignored it (a background job of a
# non-interactive shell does): a test that interrupts the CLI runs it through this
INTERRUPTIBLE = (
    "import runpy, signal\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "runpy.run_module('fairlane.cli', run_name='__main__', alter_sys=True)\n"
)


@contextlib.contextmanager
def fairlane_process(
    args: list[str],
    cwd: Path,
    log: Path,
    env: dict[str, str] | None = None,
    *,
    interruptible: bool = False,
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m fairlane.cli ARGS`` in ``cwd``, output to ``log``; killed if left running.
    ``interruptible``: SIGINT interrupts it whatever started the tests."""
    runner = ["-c", INTERRUPTIBLE] if interruptible else ["-m", "fairlane.cli"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *runner, *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env or clean_env(FAIRLANE_WORKER__IDLE_BLOCK="0.5"),
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=WAIT)


def run_fairlane(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = WAIT
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairlane.cli", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=timeout,
        check=False,
    )


async def wait_exit(proc: subprocess.Popen[bytes], timeout: float = WAIT) -> int:
    """The exit code of ``proc``; raises ``TimeoutExpired`` if it runs ``timeout`` s more."""
    return await anyio.to_thread.run_sync(functools.partial(proc.wait, timeout))


async def eventually(check: Callable[[], Any], timeout: float = WAIT) -> None:
    """Wait until the (async) ``check()`` is true, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await anyio.sleep(0.05)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture
async def client(redis_url: str) -> Any:
    conn = create_client(redis_url)
    try:
        yield conn
    finally:
        await conn.aclose()


async def status_of(client: aioredis.Redis, namespace: str, job_id: str) -> str | None:
    raw = await client.hget(AppKeys.for_app(namespace).job(job_id), "st")
    return raw.decode() if raw else None


async def key_count(client: aioredis.Redis, namespace: str) -> int:
    match = AppKeys.for_app(namespace).match_all()
    return len([key async for key in client.scan_iter(match=match, count=500)])


# -- worker ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.contract
async def test_worker_burst_drains_jobs_and_exits(
    project: ModuleType, redis_url: str, namespace: str, tmp_path: Path, client: aioredis.Redis
) -> None:
    async with project.app:
        adds = [await project.add.enqueue(i, i, tenant=f"t{i % 3}") for i in range(20)]
        crunches = [await project.crunch.enqueue(i) for i in range(3)]
    args = [
        "worker",
        spec(project),
        "--lanes",
        "default,heavy",
        "--burst",
        "--redis-url",
        redis_url,
    ]
    with fairlane_process(args, tmp_path, tmp_path / "worker.log") as proc:
        assert await wait_exit(proc) == 0, (tmp_path / "worker.log").read_text()
    log = (tmp_path / "worker.log").read_text()
    assert "using server" in log and "no work left" in log
    async with project.app:
        assert [await job.result(timeout=5) for job in adds] == [2 * i for i in range(20)]
        assert [await job.result(timeout=5) for job in crunches] == [0, 1, 4]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("grace", "seconds", "final", "logged"),
    [("30", 2.0, "completed", "waiting up to"), ("0.2", 60.0, "queued", "handing back")],
    ids=["finishes-in-flight", "hands-back-after-grace"],
)
async def test_worker_stops_gracefully_on_sigterm(
    *,
    project: ModuleType,
    redis_url: str,
    namespace: str,
    tmp_path: Path,
    client: aioredis.Redis,
    grace: str,
    seconds: float,
    final: str,
    logged: str,
) -> None:
    async with project.app:
        job = await project.nap.enqueue(seconds)
    env = clean_env(FAIRLANE_WORKER__GRACE_PERIOD=grace)
    log = tmp_path / "worker.log"
    with fairlane_process(
        ["worker", spec(project), "--redis-url", redis_url], tmp_path, log, env
    ) as proc:

        async def running() -> bool:
            assert proc.poll() is None, log.read_text()
            return await status_of(client, namespace, job.id) == "running"

        await eventually(running)
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc) == 0, log.read_text()
    assert "stopped" in log.read_text()
    assert logged in log.read_text()
    assert await status_of(client, namespace, job.id) == final


@pytest.mark.anyio
async def test_worker_check_needs_a_live_worker_and_health(
    project: ModuleType, redis_url: str, tmp_path: Path
) -> None:
    base = ["worker", spec(project), "--redis-url", redis_url]
    without = await anyio.to_thread.run_sync(lambda: run_fairlane([*base, "--check"], tmp_path))
    assert without.returncode == 1
    assert "no worker" in without.stderr

    port = free_port()
    with fairlane_process(
        [*base, "--health-port", str(port)], tmp_path, tmp_path / "worker.log"
    ) as proc:

        async def healthy() -> bool:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            checked = await anyio.to_thread.run_sync(
                lambda: run_fairlane([*base, "--check", "--health-port", str(port)], tmp_path)
            )
            return checked.returncode == 0

        await eventually(healthy)
        wrong_port = await anyio.to_thread.run_sync(
            lambda: run_fairlane([*base, "--check", "--health-port", str(free_port())], tmp_path)
        )
        assert wrong_port.returncode == 1
        assert "nothing answers" in wrong_port.stderr
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc) == 0


@pytest.mark.anyio
async def test_worker_reload_restarts_on_change(
    project: ModuleType, redis_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    module_file = tmp_path / f"{project.__name__}.py"
    args = ["worker", spec(project), "--reload", "--redis-url", redis_url]
    with fairlane_process(args, tmp_path, log) as proc:

        async def serving(times: int) -> bool:
            assert proc.poll() is None, log.read_text()
            return log.read_text().count("serving lanes") >= times

        await eventually(lambda: serving(1))
        module_file.write_text(module_file.read_text() + "\n# edited\n")
        await eventually(lambda: serving(2))
        assert "restarting the worker" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert await wait_exit(proc) == 0, log.read_text()


# -- purge ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_purge_asks_first_and_removes_keys(
    project: ModuleType, redis_url: str, namespace: str, tmp_path: Path, client: aioredis.Redis
) -> None:
    async with project.app:
        await project.add.enqueue(1, 2)
    before = await key_count(client, namespace)
    assert before > 0

    refused = await ainvoke(["purge", spec(project), "--redis-url", redis_url])
    assert refused.exit_code != 0
    assert "Aborted" in refused.output
    declined = await ainvoke(["purge", spec(project), "--redis-url", redis_url], input="n\n")
    assert declined.exit_code != 0
    no_stdin = await anyio.to_thread.run_sync(
        lambda: run_fairlane(["purge", spec(project), "--redis-url", redis_url], tmp_path)
    )
    assert no_stdin.returncode != 0
    assert await key_count(client, namespace) == before

    done = await ainvoke(["purge", spec(project), "--yes", "--redis-url", redis_url])
    assert done.exit_code == 0, done.output
    assert f"removed {before} key(s)" in done.output
    assert await key_count(client, namespace) == 0


@pytest.mark.anyio
async def test_purge_with_confirmation(
    project: ModuleType, redis_url: str, namespace: str, client: aioredis.Redis
) -> None:
    async with project.app:
        await project.add.enqueue(1, 2)
    result = await ainvoke(["purge", spec(project), "--redis-url", redis_url], input="y\n")
    assert result.exit_code == 0, result.output
    assert await key_count(client, namespace) == 0


# -- inspect --------------------------------------------------------------------------------


def _row(output: str, needle: str) -> str:
    (line,) = [line for line in output.splitlines() if needle in line]
    return line


def test_inspect_tasks_marks_defaults(project: ModuleType) -> None:
    result = invoke(["inspect", "tasks", spec(project)])
    assert result.exit_code == 0, result.output
    add = _row(result.output, f"{project.__name__}.add ")
    for default in (
        "default (default)",
        "async (default)",
        "3 (default)",
        "5m (default)",
        "Exception (default)",
        "1s..1m full (default)",
        "50 per worker (default)",
    ):
        assert default in add, (default, add)
    crunch = _row(result.output, f"{project.__name__}.crunch ")
    assert "heavy " in crunch and "heavy (default)" not in crunch
    assert "thread " in crunch and "thread (default)" not in crunch
    assert " 5 " in crunch and "5 (default)" not in crunch
    assert "2.5s " in crunch
    assert "1s..1m full (default)" in crunch
    cron = _row(result.output, "*/10 * * * *")
    assert f"cron:{project.__name__}.tick" in cron


def test_inspect_concurrency_from_settings_is_not_a_default(
    project: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "other_app.py").write_text(
        "from fairlane import App\nfrom fairlane.config.settings import load_settings\n"
        "app = App('other', settings=load_settings(worker={'concurrency': 7}))\n"
        "@app.task(attempts=2)\nasync def hello() -> None: ...\n"
    )
    try:
        result = invoke(["inspect", "tasks", "other_app:app"])
    finally:
        sys.modules.pop("other_app", None)
    assert result.exit_code == 0, result.output
    row = _row(result.output, "other_app.hello")
    assert "7 per worker" in row and "7 per worker (default)" not in row
    assert " 2 " in row


# -- doctor ---------------------------------------------------------------------------------


@pytest.mark.contract
def test_doctor_accepts_a_noeviction_server(project: ModuleType, redis_url: str) -> None:
    result = invoke(["doctor", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    policy = _row(result.output, "maxmemory-policy")
    assert "OK" in policy and "noeviction" in policy
    for check in ("version", "persistence", "maxmemory ", "functions"):
        assert check in result.output
    with_app = invoke(["doctor", spec(project), "--redis-url", redis_url])
    assert with_app.exit_code == 0, with_app.output
    assert "no live worker" in _row(with_app.output, "workers")


def test_doctor_fails_on_an_evicting_server() -> None:
    with RedisServer(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        result = invoke(["doctor", "--redis-url", server.url])
    assert result.exit_code == 1
    policy = _row(result.output, "maxmemory-policy")
    assert "ERROR" in policy and "allkeys-lru" in policy


# -- config ---------------------------------------------------------------------------------


def test_config_view_shows_where_values_come_from(tmp_path: Path) -> None:
    (tmp_path / "fairlane.toml").write_text("[worker]\nconcurrency = 7\n")
    result = invoke(
        ["config", "view", "--project-dir", str(tmp_path)],
        env={"FAIRLANE_LEASE__DURATION": "45"},
    )
    assert result.exit_code == 0, result.output
    duration = _row(result.output, "lease.duration")
    assert "45.0" in duration and "env FAIRLANE_LEASE__DURATION" in duration
    concurrency = _row(result.output, "worker.concurrency")
    assert "7" in concurrency and "fairlane.toml" in concurrency
    assert "default" in _row(result.output, "lease.renew_interval")


def test_config_view_reports_a_bad_setting(tmp_path: Path) -> None:
    result = invoke(
        ["config", "view", "--project-dir", str(tmp_path)],
        env={"FAIRLANE_LEASE__DURATION": "soon"},
    )
    assert result.exit_code == 2
    assert "FAIRLANE_LEASE__DURATION" in result.output


# -- dead letters and jobs ------------------------------------------------------------------


@pytest.mark.anyio
async def test_inspect_load_shows_capacity_and_class_use(
    project: ModuleType, redis_url: str
) -> None:
    async with project.app:
        await project.add.enqueue_many([(n, n) for n in range(5)], tenant="acme")
        # a worker that leased 3 jobs and holds them: 4 slots, 3 in flight, 2 waiting
        fetched = await project.app.store.exchange("inspector", ["default"], 3, 60_000, slots=4)
        assert len(fetched.jobs) == 3
    result = await ainvoke(["inspect", "load", spec(project), "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    assert "lane 'default': capacity 4 slots, 1 free, 2 waiting" in result.output
    default, heavy = result.output.split("lane 'heavy'")
    row = _row(default, "standard")
    cells = [cell.strip() for cell in row.strip("│ ").split("│")]
    assert cells[:3] == ["standard", "3", "2"], row
    assert cells[-1] == "borrow", row  # beyond its assured 1, on guaranteed's idle share
    assert heavy.startswith(": capacity 0 slots"), heavy


@pytest.mark.anyio
async def test_dead_list_and_redrive_round_trip(
    project: ModuleType, redis_url: str, namespace: str, tmp_path: Path, client: aioredis.Redis
) -> None:
    async with project.app:
        first = await project.boom.enqueue("kaboom one", tenant="acme")
        second = await project.boom.enqueue("kaboom two", tenant="globex")
    burst = ["worker", spec(project), "--burst", "--redis-url", redis_url]
    with fairlane_process(burst, tmp_path, tmp_path / "worker.log") as proc:
        assert await wait_exit(proc) == 0, (tmp_path / "worker.log").read_text()

    listed = await ainvoke(["dead", "list", spec(project), "--redis-url", redis_url])
    assert listed.exit_code == 0, listed.output
    row = _row(listed.output, first.id)
    assert f"{project.__name__}.boom" in row and "acme" in row and "1/1" in row
    assert "ValueError: kaboom one" in row
    assert "globex" in _row(listed.output, second.id)

    one = await ainvoke(["dead", "redrive", spec(project), first.id, "--redis-url", redis_url])
    assert one.exit_code == 0, one.output
    assert "redrove 1 job(s)" in one.output
    assert await status_of(client, namespace, first.id) == "queued"
    again = await ainvoke(["dead", "redrive", spec(project), first.id, "--redis-url", redis_url])
    assert again.exit_code == 1
    assert first.id in again.output

    every = await ainvoke(["dead", "redrive", spec(project), "--all", "--redis-url", redis_url])
    assert every.exit_code == 0, every.output
    assert "redrove 1 job(s)" in every.output
    assert await status_of(client, namespace, second.id) == "queued"
    empty = await ainvoke(["dead", "list", spec(project), "--redis-url", redis_url])
    assert "no dead-lettered jobs" in empty.output

    neither = await ainvoke(["dead", "redrive", spec(project), "--redis-url", redis_url])
    assert neither.exit_code == 2


@pytest.mark.anyio
async def test_job_status_and_cancel(
    project: ModuleType, redis_url: str, namespace: str, client: aioredis.Redis
) -> None:
    async with project.app:
        job = await project.add.enqueue(2, 3, tenant="acme", delay=3600)
    status = await ainvoke(["job", "status", spec(project), job.id, "--redis-url", redis_url])
    assert status.exit_code == 0, status.output
    assert "scheduled" in _row(status.output, "status")
    assert "acme" in _row(status.output, "tenant")

    cancel = await ainvoke(["job", "cancel", spec(project), job.id, "--redis-url", redis_url])
    assert cancel.exit_code == 0, cancel.output
    assert "cancelled" in cancel.output
    assert await status_of(client, namespace, job.id) == "cancelled"

    missing = await ainvoke(["job", "status", spec(project), "nope", "--redis-url", redis_url])
    assert missing.exit_code == 1
    assert "no record" in missing.output


# -- errors ---------------------------------------------------------------------------------


def test_an_app_that_cannot_be_loaded_exits_2(project: ModuleType, tmp_path: Path) -> None:
    missing_module = invoke(["purge", "no_such_module_here:app", "--yes"])
    assert missing_module.exit_code == 2
    assert "no such module" in missing_module.output
    missing_attribute = invoke(["purge", f"{project.__name__}:nope", "--yes"])
    assert missing_attribute.exit_code == 2
    assert "no attribute 'nope'" in missing_attribute.output
    not_an_app = invoke(["inspect", "tasks", f"{project.__name__}:add"])
    assert not_an_app.exit_code == 2
    assert "not a fairlane.App" in not_an_app.output
    (tmp_path / "broken_mod.py").write_text("import a_dependency_that_is_not_there\n")
    try:
        broken = invoke(["inspect", "tasks", "broken_mod:app"])
    finally:
        sys.modules.pop("broken_mod", None)
    assert broken.exit_code == 2
    assert "a_dependency_that_is_not_there" in broken.output


def test_an_unreachable_server_exits_1(project: ModuleType) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (
        ["purge", spec(project), "--yes"],
        ["dead", "list", spec(project)],
        ["worker", spec(project), "--check"],
        ["doctor"],
    ):
        result = invoke([*args, "--redis-url", url])
        assert result.exit_code == 1, (args, result.output)
        assert "unreachable" in result.output, (args, result.output)


def test_the_installed_script_runs(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "fairlane"
    if not script.exists():
        pytest.skip("the fairlane script is not installed next to this interpreter")
    result = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, timeout=WAIT, check=False
    )
    assert result.returncode == 0
    for command in (
        "worker",
        "purge",
        "inspect",
        "doctor",
        "config",
        "server",
        "dead",
        "example",
        "demo",
        "runs",
    ):
        assert command in result.stdout


# -- example and the dev server -------------------------------------------------------------


def _delete_app_keys(url: str, name: str) -> None:
    conn = redis.Redis.from_url(url)
    try:
        keys = list(conn.scan_iter(match=AppKeys.for_app(name).match_all(), count=500))
        if keys:
            conn.delete(*keys)
    finally:
        conn.close()


def test_example_runs_with_redis_url(redis_url: str, tmp_path: Path) -> None:
    try:
        result = run_fairlane(
            ["example", "--jobs", "9", "--redis-url", redis_url], tmp_path, timeout=60
        )
    finally:
        _delete_app_keys(redis_url, "example")
    assert result.returncode == 0, result.stdout + result.stderr
    for tenant in ("acme", "globex", "initech"):
        row = _row(result.stdout, f" {tenant} ")
        assert " 3 " in row  # 3 jobs, all done
    assert "all 9 jobs done" in result.stdout


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A short private dev-server state dir; whatever server runs in it is stopped after."""
    path = Path(tempfile.mkdtemp(prefix="fl-cli-"))
    try:
        yield path
    finally:
        try:
            stop_dev_server(path, timeout=10)
        finally:
            shutil.rmtree(path, ignore_errors=True)


def test_example_and_server_commands_use_the_dev_server(state_dir: Path, tmp_path: Path) -> None:
    env = clean_env(FAIRLANE_SERVER__STATE_DIR=str(state_dir))
    before = run_fairlane(["server", "status"], tmp_path, env)
    assert before.returncode == 1
    assert "not running" in before.stdout

    example = run_fairlane(["example", "--jobs", "6"], tmp_path, env, timeout=90)
    assert example.returncode == 0, example.stdout + example.stderr
    assert str(state_dir) in example.stdout  # the dev server's unix socket
    assert "all 6 jobs done" in example.stdout

    running = run_fairlane(["server", "status"], tmp_path, env)
    assert running.returncode == 0, running.stdout + running.stderr
    assert "running at unix://" in running.stdout
    doctor = run_fairlane(["doctor"], tmp_path, env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "local dev server" in doctor.stdout

    stopped = run_fairlane(["server", "stop"], tmp_path, env)
    assert stopped.returncode == 0
    assert "dev server stopped" in stopped.stdout
    started = run_fairlane(["server", "start"], tmp_path, env)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "running at unix://" in started.stdout
