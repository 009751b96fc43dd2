"""HTTP gateway submit latency and throughput: ``POST /v1/jobs`` under concurrent clients.

The gateway runs as ``python -m fairlane.cli.gateway`` (uvicorn, one process) against a
private Redis/Valkey server (or ``--redis-url``), serving an app with one task and a
default lane without admission control (every job is accepted; no worker runs, so each
request is authentication, argument checks and the enqueue script). ``--clients``
concurrent httpx clients, each on its own keep-alive connection, in this process, post
jobs back to back for ``--seconds``. Reported: requests/s, p50/p99/max latency per
submit, and the status codes seen. The load generator shares the machine (and, being one
Python process, may itself be the bottleneck: its CPU time is reported too).

Run: ``python -m benchmarks.gateway [--redis-url URL] [--clients 16] [--seconds 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from benchmarks.common import delete_matching, percentile
from fairlane.gateway import ApiKeys
from fairlane.store.apikeys import KeyRecords
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

APP_MODULE = """
from fairlane import App

app = App({name!r})


@app.task(name="noop", attempts=1)
async def noop(i: int, text: str = "") -> int:
    return i
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient() as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the gateway exited with code {proc.returncode}")
            try:
                if (await client.get(f"{base}/openapi.json")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            await asyncio.sleep(0.1)


async def _client(
    base: str, key: str, stop_at: float, latencies: list[float], statuses: Counter[int]
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        i = 0
        while time.perf_counter() < stop_at:
            i += 1
            started = time.perf_counter()
            r = await client.post("/v1/jobs", json={"task": "noop", "args": [i], "kwargs": {}})
            latencies.append(time.perf_counter() - started)
            statuses[r.status_code] += 1


@contextmanager
def serving(redis_url: str, name: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The gateway of a one-task app ``name``, in a subprocess: (base URL, process)."""
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "gw_bench_app.py").write_text(APP_MODULE.format(name=name))
        path = os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "fairlane.cli.gateway", "gw_bench_app:app"]
        command += ["--port", str(port), "--redis-url", redis_url, "--log-level", "warning"]
        proc = subprocess.Popen(command, cwd=tmp, env={**os.environ, "PYTHONPATH": path})
        try:
            yield f"http://127.0.0.1:{port}", proc
        finally:
            proc.terminate()
            proc.wait(10)


async def mint(redis_url: str, name: str) -> str:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        return (await ApiKeys(KeyRecords(redis, name)).create("bench")).key
    finally:
        await redis.aclose()


async def purge(redis_url: str, name: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await delete_matching(redis, AppKeys.for_app(name).match_all())
    finally:
        await redis.aclose()


async def drive(
    base: str, proc: subprocess.Popen[bytes], key: str, clients: int, seconds: float
) -> dict[str, object]:
    await _wait_ready(base, proc)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    cpu0 = time.process_time()
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(
        *(_client(base, key, stop_at, latencies, statuses) for _ in range(clients))
    )
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    ms = [x * 1000 for x in latencies]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "requests": len(ms),
        "requests_per_s": round(len(ms) / elapsed, 1),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2) if ms else None,
        "statuses": dict(statuses),
        "load_generator_cpu_pct": round(100 * cpu / elapsed, 1),
        "cpus": os.cpu_count(),
    }


def run(redis_url: str, clients: int, seconds: float) -> dict[str, object]:
    name = "gwbench_" + secrets.token_hex(3)
    key = asyncio.run(mint(redis_url, name))
    try:
        with serving(redis_url, name) as (base, proc):
            return asyncio.run(drive(base, proc, key, clients, seconds))
    finally:
        asyncio.run(purge(redis_url, name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="a server to use (default: a private one)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    if args.redis_url:
        result = run(args.redis_url, args.clients, args.seconds)
    else:
        with RedisServer() as server:
            result = run(server.url, args.clients, args.seconds)
    print(
        f"POST /v1/jobs, {result['clients']} clients, {result['seconds']} s: "
        f"{result['requests']} requests, {result['requests_per_s']} req/s, "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, max {result['max_ms']} ms, "
        f"statuses {result['statuses']}, load generator CPU {result['load_generator_cpu_pct']} % "
        f"({result['cpus']} CPUs shared by server, gateway and load generator)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
