"""The gateway's front door under a flood: one tenant's paced submits, alone and beside
another tenant flooding the same gateway process.

One gateway process (``python -m fairlane.cli.gateway``, as ``benchmarks.gateway``
starts it, the app's default settings unless ``--door`` gives ``FAIRLANE_FRONT_DOOR__``
variables) on a private Redis/Valkey server (or ``--redis-url``); no worker runs. Tenant
B submits at ``--rate`` per second from one connection (``hey -c 1 -q RATE``) for
``--seconds``: first alone, then, for each ``--flood-connections`` N (128 and 256 by
default), while tenant A floods ``POST /v1/jobs`` with ``hey -c N`` (started a second
before B, ending a second after). Reported per phase:

* B's submits/s, p50/p99 and statuses (hey's), and its p99 against B alone;
* A's statuses and answers/s (hey's);
* the answers the gateway counted in the phase, by status and reason (its ``/metrics``:
  every 429 and 503 of either tenant, by reason);
* a sample of A's answers taken by the benchmark's own client every 0.1 s during the
  flood (status, reason, and whether a 429 carried ``Retry-After``);
* whether any 5xx was answered to anyone.

Everything shares one machine: Redis, the gateway, both load generators and this script.

Run: ``python -m benchmarks.gateway --flood [--seconds 10] [--rate 50]
[--flood-connections 128 --flood-connections 256] [--door TENANT_RATE=none]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.gateway import (
    APP_MODULE,
    BODY,
    Target,
    _quoted,
    _warm,
    mint,
    parse_hey,
    purge,
    serving,
)

#: seconds A floods before B starts, and after B ends
RAMP = 1.0
#: the benchmark's own look at A's answers, one request every this many seconds
SAMPLE_EVERY = 0.1
_COUNTED = ("fairlane_gateway_requests", "fairlane_gateway_admissions")


def hey(url: str, key: str, *, connections: int, seconds: float, rate: float | None) -> list[str]:
    """hey's command line for ``POST /v1/jobs`` (``rate``: per connection, hey's ``-q``)."""
    paced = ["-q", f"{rate:g}"] if rate is not None else []
    return [
        "hey", "-z", f"{seconds:g}s", "-c", str(connections), *paced,
        "-m", "POST", "-T", "application/json", "-H", f"Authorization: Bearer {key}",
        "-d", json.dumps(BODY), url,
    ]  # fmt: skip


def shown(command: list[str], keys: dict[str, str], base: str) -> str:
    text = " ".join(_quoted(c) for c in command)
    for tenant, key in keys.items():
        text = text.replace(key, f"$KEY_{tenant}")
    return text.replace(base, "http://127.0.0.1:$PORT")


async def counted(base: str) -> Counter[str]:
    """The gateway's answers to submits so far, by status (and reason, for a refusal)."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        text = (await client.get("/metrics")).text
    out: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name not in _COUNTED:
            continue
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "fairlane_gateway_requests_total":
                if labels.get("route") == "/v1/jobs" and labels.get("method") == "POST":
                    out[f"status {labels['status']}"] += int(sample.value)
            elif sample.name == "fairlane_gateway_admissions_total":
                out[f"{labels['verdict']} {labels['reason']}"] += int(sample.value)
    return out


async def sample(base: str, key: str, until: float, seen: Counter[str]) -> None:
    """A's answers, one request every ``SAMPLE_EVERY`` seconds until ``until``."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        while time.monotonic() < until:
            r = await client.post("/v1/jobs", json=BODY)
            said = r.json()
            label = f"{r.status_code} {said.get('reason') or said.get('state')}"
            if r.status_code == 429:
                label += " with Retry-After" if "retry-after" in r.headers else " NO Retry-After"
            seen[label] += 1
            await asyncio.sleep(SAMPLE_EVERY)


@dataclass
class Phase:
    name: str
    b: dict[str, Any]
    a: dict[str, Any] | None = None
    gateway_counted: dict[str, int] = field(default_factory=dict)
    a_sample: dict[str, int] = field(default_factory=dict)

    def any_5xx(self) -> bool:
        statuses = [*self.b["statuses"], *((self.a or {}).get("statuses") or {})]
        counted = (k.split()[1] for k in self.gateway_counted if k.startswith("status "))
        return any(s.startswith("5") for s in [*statuses, *counted])


def _hey_figures(out: str) -> dict[str, Any]:
    elapsed, rps, p50, p99, statuses = parse_hey(out)
    return {
        "per_s": round(rps, 1),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "statuses": statuses,
        "seconds": round(elapsed, 2),
    }


@dataclass
class Flood:
    target: Target
    keys: dict[str, str]
    seconds: float
    rate: float
    commands: list[str] = field(default_factory=list)

    def _command(self, tenant: str, **kwargs: Any) -> list[str]:
        command = hey(f"{self.target.base}/v1/jobs", self.keys[tenant], **kwargs)
        text = shown(command, self.keys, self.target.base)
        if text not in self.commands:
            self.commands.append(text)
        return command

    async def _b(self) -> dict[str, Any]:
        command = self._command("B", connections=1, seconds=self.seconds, rate=self.rate)
        done = await asyncio.to_thread(
            subprocess.run, command, capture_output=True, text=True, check=True
        )
        return _hey_figures(done.stdout)

    async def phase(self, connections: int | None) -> Phase:
        before = await counted(self.target.base)
        if connections is None:
            phase = Phase("B alone", await self._b())
        else:
            phase = await self._flooded(connections)
        after = await counted(self.target.base)
        phase.gateway_counted = {k: v - before[k] for k, v in after.items() if v - before[k]}
        return phase

    async def _flooded(self, connections: int) -> Phase:
        seconds = self.seconds + 2 * RAMP
        command = self._command("A", connections=connections, seconds=seconds, rate=None)
        a_proc = await asyncio.create_subprocess_exec(*command, stdout=subprocess.PIPE)
        seen: Counter[str] = Counter()
        try:
            await asyncio.sleep(RAMP)
            until = time.monotonic() + self.seconds
            b, _ = await asyncio.gather(
                self._b(), sample(self.target.base, self.keys["A"], until, seen)
            )
            async with asyncio.timeout(seconds + 30):
                out, _ = await a_proc.communicate()
        finally:
            if a_proc.returncode is None:
                a_proc.kill()
                await a_proc.wait()
        a = _hey_figures(out.decode())
        return Phase(f"B beside A at -c {connections}", b, a, a_sample=dict(seen))


def run(
    redis_url: str,
    *,
    seconds: float,
    rate: float,
    floods: list[int],
    door: dict[str, str],
) -> dict[str, Any]:
    name = "gwflood_" + secrets.token_hex(3)
    keys = {tenant: asyncio.run(mint(redis_url, name, tenant)) for tenant in ("A", "B")}
    settings = {f"FAIRLANE_FRONT_DOOR__{k.upper()}": v for k, v in door.items()}
    phases: list[Phase] = []
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "gw_bench_app.py").write_text(APP_MODULE.format(name=name))
        try:
            with serving("gateway", 1, redis_url, name, workdir, settings=settings) as target:
                for key in keys.values():
                    asyncio.run(_warm(target, key))
                bench = Flood(target, keys, seconds, rate)
                for connections in [None, *floods]:
                    phase = asyncio.run(bench.phase(connections))
                    print(f"{phase.name}: B {phase.b}; A {phase.a}", flush=True)
                    phases.append(phase)
                    asyncio.run(purge(redis_url, name, keys_too=False))
        finally:
            asyncio.run(purge(redis_url, name, keys_too=True))
    alone = phases[0].b["p99_ms"]
    return {
        "commands": bench.commands,
        "settings": settings,
        "seconds": seconds,
        "rate": rate,
        "cpus": os.cpu_count(),
        "phases": [
            {
                "name": p.name,
                "b": p.b,
                "b_p99_to_alone": round(p.b["p99_ms"] / alone, 2) if alone else None,
                "a": p.a,
                "gateway_counted": p.gateway_counted,
                "a_sample": p.a_sample,
                "any_5xx": p.any_5xx(),
            }
            for p in phases
        ],
    }


def report(result: dict[str, Any]) -> None:
    print()
    print("load generators:")
    for command in result["commands"]:
        print(f"  {command}")
    if result["settings"]:
        print(f"gateway settings: {result['settings']}")
    print(f"{result['cpus']} CPUs shared by Redis, the gateway, hey and this script:")
    for p in result["phases"]:
        b = p["b"]
        print(f"  {p['name']}:")
        print(
            f"    B: {b['per_s']:.1f} submits/s, p50 {b['p50_ms']:.2f} ms, p99 "
            f"{b['p99_ms']:.2f} ms ({p['b_p99_to_alone']}x alone), statuses {b['statuses']}"
        )
        if p["a"]:
            a = p["a"]
            print(f"    A: {a['per_s']:.1f} answers/s, statuses {a['statuses']}")
            print(f"    A sampled: {p['a_sample']}")
        print(f"    gateway counted: {p['gateway_counted']}")
        print(f"    any 5xx: {p['any_5xx']}")
    print(json.dumps(result))
