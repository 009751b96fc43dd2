"""HTTP gateway submit throughput and latency, side by side with a bare ASGI app.

``POST /v1/jobs`` on loopback, driven by a real HTTP load generator (``hey``, the
default, or ``wrk``, from the system's packages; ``--generator python`` keeps the
suite's own httpx clients), against two targets in the same run, interleaved:

* the gateway, ``python -m fairlane.cli.gateway gw_bench_app:app --workers N`` (uvicorn,
  as a user runs it: dashboard and metrics on), serving an app with one task on a
  default lane without a pool; no worker runs, so each request is authentication,
  argument checks and the enqueue script;
* the bare app, ``python -m benchmarks.bare_asgi --workers N``: Starlette on the same
  uvicorn settings, parsing the JSON body and making one Redis call (a ``SET``); no
  authentication, no checks: what the server stack itself allows.

Each target runs with ``--workers`` 1 and 2 (``--workers`` here: the counts to run) on
a private Redis/Valkey server (or ``--redis-url``). Every (target, workers) pair runs
once per round, in an order that rotates each round; the figures are each pair's
median over the rounds. Reported: submits/s, p50/p99 latency, status codes, the CPU
the load generator, the target and the Redis server used (in % of one core), and per
worker count the gateway's ratios to the bare app (submits/s and p99). The load
generator's exact command line is printed (the key shown as ``$KEY``). Everything
shares one machine: server, target and load generator compete for its cores.

The load is one tenant's, so the gateway runs with its per-tenant rate lifted
(``SPEED_DOOR``): the front door's default, 1,000 submits/s a tenant and process, would
otherwise be what is measured (429s past it), not the path a submit takes. ``--door
NAME=VALUE`` sets front-door settings on top (``--door TENANT_RATE=1000`` measures with
the default back).

Run: ``python -m benchmarks.gateway [--generator hey|wrk|python] [--connections 16]
[--seconds 10] [--rounds 2] [--workers 1 --workers 2] [--door NAME=VALUE]
[--redis-url URL]``.

``--flood`` runs the front door's phases instead (``benchmarks.gateway_flood``): tenant
B's paced submits alone and beside tenant A's flood of the same gateway process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

import httpx
import psutil
import redis.asyncio as aioredis

from benchmarks.common import REPO_ROOT, delete_matching, percentile
from fairlane.gateway import ApiKeys
from fairlane.store.apikeys import KeyRecords
from fairlane.store.keys import AppKeys
from fairlane.testing import RedisServer

APP_MODULE = """
from fairlane import App

app = App({name!r})


@app.task(gateway=True, name="noop", attempts=1)
async def noop(i: int, text: str = "") -> int:
    return i
"""

BODY = {"task": "noop", "args": [1], "kwargs": {}}
TARGETS = ("bare", "gateway")
#: the gateway's settings for the speed runs: no per-tenant rate (see the module's doc)
SPEED_DOOR: dict[str, str] = {"FAIRLANE_FRONT_DOOR__TENANT_RATE": "none"}
GENERATORS = ("hey", "wrk", "python")
#: requests each target serves before it is measured (connections, imports, caches)
WARM_UP = 200


@dataclass
class Target:
    """One server under test, started: its kind, worker count, URL and process."""

    kind: str
    workers: int
    base: str
    proc: subprocess.Popen[bytes]


@dataclass
class Measured:
    """One load generator run against one target."""

    kind: str
    workers: int
    seconds: float
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]
    cpu_pct: dict[str, float] = field(default_factory=dict)

    def row(self) -> str:
        cpu = ", ".join(f"{k} {v:.0f}%" for k, v in self.cpu_pct.items())
        return (
            f"{self.kind:8} workers={self.workers}: {self.rps:8.1f} submits/s, "
            f"p50 {self.p50_ms:6.2f} ms, p99 {self.p99_ms:6.2f} ms, "
            f"statuses {self.statuses}, CPU of one core: {cpu}"
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _python_env(*paths: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


@contextmanager
def serving(
    kind: str,
    workers: int,
    redis_url: str,
    name: str,
    workdir: str,
    *,
    settings: Mapping[str, str] | None = None,
) -> Iterator[Target]:
    """A target in a subprocess: the gateway of app ``name`` or the bare app
    (``settings``: ``FAIRLANE_...`` variables for the gateway)."""
    port = _free_port()
    common = ["--port", str(port), "--redis-url", redis_url]
    if workers > 1:  # a gateway from before ``--workers`` is measured with one
        common += ["--workers", str(workers)]
    if kind == "gateway":
        command = [sys.executable, "-m", "fairlane.cli.gateway", "gw_bench_app:app", *common]
        command += ["--log-level", "warning"]
    else:
        command = [sys.executable, "-m", "benchmarks.bare_asgi", *common, "--prefix", name]
    env = {**_python_env(workdir, str(REPO_ROOT)), **(settings or {})}
    proc = subprocess.Popen(command, cwd=workdir, env=env)
    try:
        yield Target(kind, workers, f"http://127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def _warm(target: Target, key: str, timeout: float = 30) -> None:
    """Wait until the target answers submits, then send it ``WARM_UP`` of them."""
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(base_url=target.base, headers=headers, timeout=10) as client:
        while True:
            if target.proc.poll() is not None:
                raise RuntimeError(f"{target.kind} exited with code {target.proc.returncode}")
            try:
                r = await client.post("/v1/jobs", json=BODY)
                if r.status_code == 202:
                    break
                raise RuntimeError(f"{target.kind} answered {r.status_code}: {r.text}")
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.kind} did not start")
            await asyncio.sleep(0.1)

    async def some(n: int) -> None:
        # fresh connections, so that every worker process of the target gets some
        async with httpx.AsyncClient(base_url=target.base, headers=headers) as client:
            for _ in range(n):
                await client.post("/v1/jobs", json=BODY)

    await asyncio.gather(*(some(WARM_UP // 8) for _ in range(8)))


# -- load generators --------------------------------------------------------------------


def generator_command(
    generator: str, url: str, key: str, *, connections: int, seconds: float, script: Path
) -> list[str]:
    """The load generator's command line (``script``: wrk's request, written here)."""
    body = json.dumps(BODY)
    if generator == "hey":
        return [
            "hey",
            "-z", f"{seconds:g}s",
            "-c", str(connections),
            "-m", "POST",
            "-T", "application/json",
            "-H", f"Authorization: Bearer {key}",
            "-d", body,
            url,
        ]  # fmt: skip
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {key}"\n'
    )
    # one thread: the machine's cores are the server's and the target's to share
    return [
        "wrk", "-t", "1", "-c", str(connections), "-d", f"{seconds:g}s", "--latency",
        "-s", str(script), url,
    ]  # fmt: skip


_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _hey_ms(out: str, percent: int) -> float:
    # hey leaves out a percentile its few answers do not reach: then the slowest is it
    at = re.search(rf"{percent}%+ in ([\d.]+) secs", out)
    found = at or re.search(r"Slowest:\s+([\d.]+)", out)
    if found is None:
        raise ValueError(f"not a hey summary: {out!r}")
    return float(found[1]) * 1000


def parse_hey(out: str) -> tuple[float, float, float, float, dict[str, int]]:
    """(elapsed s, requests/s, p50 ms, p99 ms, statuses) from hey's summary."""
    total = float(re.search(r"Total:\s+([\d.]+) secs", out)[1])  # type: ignore[index]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    p50, p99 = _hey_ms(out, 50), _hey_ms(out, 99)
    statuses = {m[1]: int(m[2]) for m in re.finditer(r"\[(\d+)\]\s+(\d+) responses", out)}
    errors = sum(int(m[1]) for m in re.finditer(r"^\s+\[(\d+)\]\s+(?!\d+ responses)", out, re.M))
    if errors:
        statuses["errors"] = errors
    return total, rps, p50, p99, statuses


def _wrk_time(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    if m is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(m[1]) * _SECONDS[m[2]] * 1000


def parse_wrk(out: str) -> tuple[float, float, float, float, dict[str, int]]:
    """(elapsed s, requests/s, p50 ms, p99 ms, statuses) from wrk's ``--latency`` report."""
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    if m is None:
        raise ValueError(f"not a wrk report: {out!r}")
    requests, elapsed = int(m[1]), float(m[2]) * _SECONDS[m[3]]
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    p50 = _wrk_time(re.search(r"50%\s+(\S+)", out)[1])  # type: ignore[index]
    p99 = _wrk_time(re.search(r"99%\s+(\S+)", out)[1])  # type: ignore[index]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    statuses = {"2xx": requests - (int(bad[1]) if bad else 0)}
    if bad:
        statuses["other"] = int(bad[1])
    if errors:
        statuses["socket errors"] = sum(int(n) for n in re.findall(r"\d+", errors[1]))
    return elapsed, rps, p50, p99, statuses


async def _python_client(
    base: str, key: str, stop_at: float, latencies: list[float], statuses: Counter[str]
) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            r = await client.post("/v1/jobs", json=BODY)
            latencies.append(time.perf_counter() - started)
            statuses[str(r.status_code)] += 1


async def _python_load(
    base: str, key: str, connections: int, seconds: float
) -> tuple[float, float, float, float, dict[str, int]]:
    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(
        *(_python_client(base, key, stop_at, latencies, statuses) for _ in range(connections))
    )
    elapsed = time.perf_counter() - started
    ms = [x * 1000 for x in latencies]
    return elapsed, len(ms) / elapsed, percentile(ms, 50), percentile(ms, 99), dict(statuses)


# -- CPU accounting ---------------------------------------------------------------------


def _process_cpu(pid: int) -> float:
    """CPU seconds of a process and its children (a target's worker processes)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def _server_cpu(redis: aioredis.Redis) -> float:
    info = await redis.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# -- the run ----------------------------------------------------------------------------


@dataclass
class Run:
    redis_url: str
    generator: str
    connections: int
    seconds: float
    name: str
    key: str
    workdir: str
    commands: list[str] = field(default_factory=list)

    async def measure(self, target: Target) -> Measured:
        await _warm(target, self.key)
        url = f"{target.base}/v1/jobs"
        redis = aioredis.Redis.from_url(self.redis_url)
        try:
            server0, target0, load0 = await _server_cpu(redis), _process_cpu(target.proc.pid), 0.0
            if self.generator == "python":
                load0 = time.process_time()
                elapsed, rps, p50, p99, statuses = await _python_load(
                    target.base, self.key, self.connections, self.seconds
                )
                load = time.process_time() - load0
            else:
                script = Path(self.workdir, "post.lua")
                command = generator_command(
                    self.generator,
                    url,
                    self.key,
                    connections=self.connections,
                    seconds=self.seconds,
                    script=script,
                )
                shown = " ".join(
                    _quoted(c)
                    .replace(self.key, "$KEY")
                    .replace(target.base, "http://127.0.0.1:$PORT")
                    for c in command
                )
                if shown not in self.commands:
                    self.commands.append(shown)
                load0 = _children_cpu()
                done = await asyncio.to_thread(
                    subprocess.run, command, capture_output=True, text=True, check=True
                )
                load = _children_cpu() - load0
                parse = parse_hey if self.generator == "hey" else parse_wrk
                elapsed, rps, p50, p99, statuses = parse(done.stdout)
            server = await _server_cpu(redis) - server0
            used = _process_cpu(target.proc.pid) - target0
        finally:
            await redis.aclose()
        return Measured(
            target.kind,
            target.workers,
            round(elapsed, 2),
            round(rps * elapsed),
            round(rps, 1),
            round(p50, 2),
            round(p99, 2),
            statuses,
            {
                "load generator": round(100 * load / elapsed, 1),
                target.kind: round(100 * used / elapsed, 1),
                "redis": round(100 * server / elapsed, 1),
            },
        )


def _quoted(arg: str) -> str:
    return arg if re.fullmatch(r"[\w./:=%+-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


async def mint(redis_url: str, name: str, tenant: str = "bench") -> str:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        return (await ApiKeys(KeyRecords(redis, name)).create(tenant)).key
    finally:
        await redis.aclose()


async def purge(redis_url: str, name: str, *, keys_too: bool) -> None:
    """Delete the jobs of a measurement (and, at the end, everything of the run)."""
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await delete_matching(redis, f"bare:{name}:*")
        if keys_too:
            await delete_matching(redis, AppKeys.for_app(name).match_all())
            return
        app = AppKeys.for_app(name)
        api_keys: dict[Any, Any] = await redis.hgetall(app.gateway_keys)
        await delete_matching(redis, app.match_all())
        if api_keys:
            await redis.hset(app.gateway_keys, mapping=api_keys)
    finally:
        await redis.aclose()


def _schedule(workers: list[int], rounds: int) -> list[list[tuple[str, int]]]:
    pairs = [(kind, n) for n in workers for kind in TARGETS]
    # each round starts one pair later: every pair runs early and late alike
    return [pairs[r % len(pairs) :] + pairs[: r % len(pairs)] for r in range(rounds)]


def run(
    redis_url: str,
    generator: str,
    *,
    connections: int,
    seconds: float,
    rounds: int,
    workers: list[int],
    door: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``door``: front-door settings by name (``TENANT_RATE``), over ``SPEED_DOOR``."""
    settings = {**SPEED_DOOR, **{f"FAIRLANE_FRONT_DOOR__{k}": v for k, v in (door or {}).items()}}
    if generator != "python" and shutil.which(generator) is None:
        raise SystemExit(f"{generator} is not installed (it comes with the system's packages)")
    name = "gwbench_" + secrets.token_hex(3)
    key = asyncio.run(mint(redis_url, name))
    results: dict[tuple[str, int], list[Measured]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "gw_bench_app.py").write_text(APP_MODULE.format(name=name))
        bench = Run(redis_url, generator, connections, seconds, name, key, workdir)
        try:
            for number, order in enumerate(_schedule(workers, rounds), 1):
                for kind, n in order:
                    with serving(kind, n, redis_url, name, workdir, settings=settings) as target:
                        measured = asyncio.run(bench.measure(target))
                    print(f"round {number}: {measured.row()}", flush=True)
                    results.setdefault((kind, n), []).append(measured)
                    asyncio.run(purge(redis_url, name, keys_too=False))
        finally:
            asyncio.run(purge(redis_url, name, keys_too=True))
    return _summary(bench, results, rounds, workers)


def _summary(
    bench: Run, results: dict[tuple[str, int], list[Measured]], rounds: int, workers: list[int]
) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {}
    for (kind, n), runs in results.items():
        figures[f"{kind} x{n}"] = {
            "submits_per_s": round(median(m.rps for m in runs), 1),
            "p50_ms": round(median(m.p50_ms for m in runs), 2),
            "p99_ms": round(median(m.p99_ms for m in runs), 2),
            "statuses": [m.statuses for m in runs],
            "cpu_pct": [m.cpu_pct for m in runs],
        }
    ratios = {}
    for n in workers:
        gw, bare = figures.get(f"gateway x{n}"), figures.get(f"bare x{n}")
        if gw and bare:
            ratios[f"x{n}"] = {
                "submits_per_s": round(gw["submits_per_s"] / bare["submits_per_s"], 3),
                "p99": round(gw["p99_ms"] / bare["p99_ms"], 3),
            }
    return {
        "generator": bench.generator,
        "commands": bench.commands,
        "connections": bench.connections,
        "seconds": bench.seconds,
        "rounds": rounds,
        "cpus": os.cpu_count(),
        "figures": figures,
        "gateway_to_bare": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", help="a server to use (default: a private one)")
    parser.add_argument("--generator", choices=GENERATORS, default="hey")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--workers", type=int, action="append", help="worker counts to run (default 1 and 2)"
    )
    flood = parser.add_argument_group(
        "flood", "--flood: tenant B paced, alone and beside tenant A flooding (gateway_flood)"
    )
    flood.add_argument("--flood", action="store_true", help="run the flood phases instead")
    flood.add_argument("--rate", type=float, default=50.0, help="B's submits per second")
    flood.add_argument(
        "--flood-connections",
        type=int,
        action="append",
        help="A's hey -c, one phase each (default 128 and 256)",
    )
    parser.add_argument(
        "--door",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a front_door setting of the gateway (FAIRLANE_FRONT_DOOR__NAME), e.g. "
        "TENANT_RATE=none; the speed runs start from SPEED_DOOR",
    )
    args = parser.parse_args()
    if args.flood:
        _flood(args)
        return
    workers = args.workers or [1, 2]
    options: dict[str, Any] = {
        "connections": args.connections,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "workers": workers,
        "door": dict(item.split("=", 1) for item in args.door),
    }
    if args.redis_url:
        result = run(args.redis_url, args.generator, **options)
    else:
        with RedisServer() as server:
            result = run(server.url, args.generator, **options)
    print()
    print(f"load generator ({result['generator']}), per run:")
    for command in result["commands"]:
        print(f"  {command}")
    print(
        f"median of {result['rounds']} round(s), {result['cpus']} CPUs shared by the Redis "
        "server, the target and the load generator:"
    )
    for label, fig in result["figures"].items():
        print(
            f"  {label:11} {fig['submits_per_s']:8.1f} submits/s, p50 {fig['p50_ms']:6.2f} ms, "
            f"p99 {fig['p99_ms']:6.2f} ms"
        )
    for label, ratio in result["gateway_to_bare"].items():
        print(
            f"  gateway/bare {label}: {ratio['submits_per_s']:.2f}x submits/s, "
            f"{ratio['p99']:.2f}x p99"
        )
    print(json.dumps(result))


def _flood(args: argparse.Namespace) -> None:
    from benchmarks import gateway_flood  # noqa: PLC0415 - it imports this module

    if shutil.which("hey") is None:
        raise SystemExit("hey is not installed (it comes with the system's packages)")
    door = dict(item.split("=", 1) for item in args.door)
    options: dict[str, Any] = {
        "seconds": args.seconds,
        "rate": args.rate,
        "floods": args.flood_connections or [128, 256],
        "door": door,
    }
    if args.redis_url:
        result = gateway_flood.run(args.redis_url, **options)
    else:
        with RedisServer() as server:
            result = gateway_flood.run(server.url, **options)
    gateway_flood.report(result)


if __name__ == "__main__":
    main()
