"""Runs the suite: each phase for Fairlane, then for taskiq-redis, on one server; sums it up.

Phases alternate between the systems (Fairlane's throughput, taskiq's throughput,
Fairlane's latency, ...) so that drift in a noisy machine's load affects both alike.
The result is a JSON-ready dict: ``meta``, the raw figures per system and phase, and
``summary`` -- one row per headline figure with Fairlane/peer ratios.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from benchmarks import fairlane_suite
from benchmarks.common import Meter
from benchmarks.config import Config

Progress = Callable[[str], None]

# (phase, label, unit, which way is better, path into the phase's figures)
METRICS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("throughput", "Throughput, 1 worker", "jobs/s", "higher", ("jobs_per_s",)),
    (
        "throughput",
        "Server commands/job",
        "cmd/job",
        "lower",
        ("calls", "total", "server_commands_per_job"),
    ),
    (
        "throughput",
        "Client calls/job (server)",
        "call/job",
        "lower",
        ("calls", "total", "client_calls_per_job"),
    ),
    (
        "throughput",
        "Client calls/job (counted)",
        "call/job",
        "lower",
        ("calls", "total", "client_calls_counted_per_job"),
    ),
    (
        "throughput",
        "  of which the worker",
        "call/job",
        "lower",
        ("calls", "drain", "client_calls_counted_per_job"),
    ),
    ("latency", "Idle latency p50", "ms", "lower", ("p50_ms",)),
    ("latency", "Idle latency p99", "ms", "lower", ("p99_ms",)),
    ("enqueue", "Enqueue, batched", "jobs/s", "higher", ("many", "jobs_per_s")),
    (
        "enqueue",
        "  server commands/job",
        "cmd/job",
        "lower",
        ("many", "calls", "server_commands_per_job"),
    ),
    ("enqueue", "Enqueue, awaited loop", "jobs/s", "higher", ("loop", "jobs_per_s")),
    (
        "enqueue",
        "  server commands/job",
        "cmd/job",
        "lower",
        ("loop", "calls", "server_commands_per_job"),
    ),
    ("idle", "Idle worker, commands", "cmd/s", "lower", ("commands_per_s",)),
    ("idle", "Idle worker, client calls", "call/s", "lower", ("client_calls_counted_per_s",)),
    ("recovery", "Recovery after kill -9", "s", "lower", ("recovery_seconds",)),
    ("recovery", "  jobs the killed one held", "jobs", "-", ("held_by_killed",)),
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _dig(figures: dict[str, Any] | None, path: tuple[str, ...]) -> float | None:
    value: Any = figures
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, int | float) else None


def summary(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for phase, label, unit, better, path in METRICS:
        ours = _dig(result["fairlane"].get(phase), path)
        if ours is None:
            continue
        theirs = _dig((result.get("taskiq") or {}).get(phase), path)
        rows.append(
            {
                "phase": phase,
                "metric": label,
                "unit": unit,
                "better": better,
                "fairlane": ours,
                "taskiq": theirs,
                "ratio": ours / theirs if theirs else None,
            }
        )
    return rows


async def _meta(cfg: Config, meter: Meter) -> dict[str, Any]:
    server = await meter.server_info()
    return {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "server": {
            k: server.get(k)
            for k in ("redis_version", "valkey_version", "server_name", "redis_mode", "os")
            if k in server
        },
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": {d: _version(d) for d in ("fairlane", "taskiq", "taskiq-redis", "redis")},
        "config": cfg.as_dict(),
    }


async def run_suite(cfg: Config, progress: Progress | None = None) -> dict[str, Any]:
    """Run every phase of ``cfg`` and return the figures."""
    say = progress or (lambda _: None)
    peers: dict[str, Any] = {}
    if cfg.peers:
        from benchmarks import taskiq_peer  # noqa: PLC0415 - taskiq is needed only with peers

        peers = dict(taskiq_peer.PHASES)
    meter = Meter(cfg.url)
    try:
        result: dict[str, Any] = {"meta": await _meta(cfg, meter), "fairlane": {}}
        if cfg.peers:
            result["taskiq"] = {}
        for phase in cfg.phases:
            say(f"fairlane: {phase}")
            result["fairlane"][phase] = await fairlane_suite.PHASES[phase](cfg, meter)
            if cfg.peers:
                say(f"taskiq-redis: {phase}")
                result["taskiq"][phase] = await peers[phase](cfg, meter)
        result["meta"]["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    finally:
        await meter.aclose()
    result["summary"] = summary(result)
    result["warnings"] = list(_disagreements(result))
    return result


def _disagreements(node: Any, where: str = "") -> Iterator[str]:
    """Where the server's statistics and the counted calls disagree (another client)."""
    if not isinstance(node, dict):
        return
    if node.get("views_agree") is False:
        diff = ", ".join(f"{k} {v:+d}" for k, v in node["server_minus_counted"].items())
        yield (
            f"{where}: server statistics and counted calls disagree ({diff}); another "
            "client used the server or reset its statistics -- run again"
        )
    for key, child in node.items():
        if key != "meta":
            yield from _disagreements(child, f"{where} {key}".strip())
