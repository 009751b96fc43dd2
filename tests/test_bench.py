"""Smoke test of the benchmark suite: a small Fairlane-only run gives sane figures."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from fairlane.bench import run_bench


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.mark.timeout(240)
def test_small_run_reports_positive_figures(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(
        redis_url,
        300,
        20,
        False,
        out,
        console=Console(file=io.StringIO(), width=120),
        latency_samples=30,
        idle_settle=0.5,
        idle_seconds=6.0,
    )

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert "taskiq" not in result
    fl = result["fairlane"]
    throughput = fl["throughput"]
    assert _positive(throughput["jobs_per_s"])
    assert _positive(throughput["drain_seconds"])
    calls = throughput["calls"]["total"]
    assert _positive(calls["server_commands_per_job"])
    assert _positive(calls["client_calls_per_job"])
    assert _positive(calls["client_calls_counted_per_job"])
    # a client call is also a server command
    assert calls["client_calls_per_job"] <= calls["server_commands_per_job"]
    assert fl["latency"]["samples"] == 30
    assert 0 < fl["latency"]["p50_ms"] <= fl["latency"]["p99_ms"]
    for variant in ("many", "loop"):
        assert _positive(fl["enqueue"][variant]["jobs_per_s"])
        assert _positive(fl["enqueue"][variant]["calls"]["server_commands_per_job"])
    assert fl["idle"]["commands_per_s"] >= 0
    recovery = fl["recovery"]
    assert recovery["held_by_killed"] > 0
    assert _positive(recovery["recovery_seconds"])
    assert {row["phase"] for row in result["summary"]} == {
        "throughput",
        "latency",
        "enqueue",
        "idle",
        "recovery",
    }
