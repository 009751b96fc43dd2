"""Smoke tests of the benchmark suite: a quick Fairlane-only run, and one peer if installed.

The quick run takes seconds. A peer's run needs its own virtual environment, which the
suite makes on first use (a minute of pip); a test must not spend that, so the peer test
runs only when some peer's environment already exists and is skipped otherwise.
"""

from __future__ import annotations

import io
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from benchmarks import core, venvs
from benchmarks.config import SCENARIOS, Config
from rich.console import Console

from fairlane.cli.bench import run_bench


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def _console() -> Console:
    return Console(file=io.StringIO(), width=200)


# -- pure parts --------------------------------------------------------------------------


def test_plan_interleaves_every_system_in_every_scenario_of_every_rep() -> None:
    cfg = Config.make("redis://x", reps=3, peers=("arq", "taskiq"), seed=1)
    steps = list(core.plan(cfg, random.Random(cfg.seed)))
    for rep in range(3):
        for scenario in SCENARIOS:
            ran = [s for r, sc, s in steps if r == rep and sc == scenario]
            expected = {"fairlane", "arq", "taskiq"} if scenario in core.SHARED else {"fairlane"}
            assert sorted(ran) == sorted(expected)
    # the order within a scenario is shuffled, not fixed
    orders = {tuple(s for r, sc, s in steps if r == rep and sc == "throughput") for rep in range(3)}
    orders |= {
        tuple(s for _, sc, s in core.plan(cfg, random.Random(seed)) if sc == "latency")
        for seed in range(10)
    }
    assert len(orders) > 1


def test_medians_and_ratios_against_the_best_peer() -> None:
    cfg = Config.make("redis://x", reps=3, peers=("arq", "saq"), scenarios=("throughput",))
    reps = {
        "fairlane": [{"jobs_per_s": v, "p": {"q": v / 10}} for v in (900, 1000, 5000)],
        "arq": [{"jobs_per_s": v} for v in (100, 200, 300)],
        "saq": [{"jobs_per_s": v} for v in (400, 500, 600)],
    }
    result = {
        "raw": {s: {"throughput": r} for s, r in reps.items()},
        "medians": {s: {"throughput": core.median_tree(r)} for s, r in reps.items()},
    }
    assert result["medians"]["fairlane"]["throughput"] == {"jobs_per_s": 1000, "p": {"q": 100}}
    row = next(r for r in core.summary(result, cfg) if r["metric"] == "Throughput, 1 worker")
    assert row["values"] == {"fairlane": 1000, "arq": 200, "saq": 500}
    assert row["ratios"] == {"arq": 5.0, "saq": 2.0}
    assert (row["best_peer"], row["vs_best"]) == ("saq", 2.0)
    assert row["spread"]["fairlane"] == [900, 5000]


def test_quick_sizes_and_overrides() -> None:
    cfg = Config.make("redis://x", quick=True, jobs=123)
    assert (cfg.reps, cfg.jobs, cfg.tenant_counts) == (1, 123, (1, 100))
    with pytest.raises(ValueError, match="unknown peers"):
        Config.make("redis://x", peers=("celery",))
    with pytest.raises(ValueError, match="unknown phases"):
        Config.make("redis://x", scenarios=("idle",))


# -- runs against the test server ----------------------------------------------------------

QUICK_SMALL: dict[str, Any] = {
    "tenant_counts": (1, 20),
    "submit_seconds": 0.5,
    "overload_seconds": 1.0,
    "latency_samples": 20,
}


@pytest.mark.timeout(300)
@pytest.mark.embedded_only
def test_quick_fairlane_only_run(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = run_bench(
        redis_url, peers=False, quick=True, out=out, console=_console(), **QUICK_SMALL
    )

    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert out.with_suffix(".md").read_text() == result["markdown"]
    assert result["warnings"] == []
    assert set(result["raw"]) == {"fairlane"}
    fl = result["medians"]["fairlane"]
    tp = fl["throughput"]
    for key in ("jobs_per_s", "enqueue_jobs_per_s", "worker_rss_peak_mb", "polls"):
        assert _positive(tp[key]), key
    server = tp["server"]
    assert _positive(server["commands_per_job"]) and _positive(server["client_calls_per_job"])
    assert server["client_calls_per_job"] <= server["commands_per_job"]
    assert fl["latency"]["samples"] == 20
    assert 0 < fl["latency"]["p50_ms"] <= fl["latency"]["p99_ms"]
    assert fl["noisy"]["tenants"] is True and fl["noisy"]["samples"] == 5
    assert set(fl["tenants"]["by_tenants"]) == {"1", "20"}
    assert fl["submit"]["statuses"] == {"accepted": fl["submit"]["decisions"]}
    over = fl["overload"]
    assert set(over) == {"admission", "no_admission", "one_class"}
    # admission keeps the lane's queue short and refuses standard work beyond its share
    assert over["admission"]["max_queued"] <= 16
    assert over["admission"]["classes"]["standard"]["rejected"] > 0
    # guaranteed work is refused far less often than standard work; not never: a stalled
    # worker on a loaded machine can fill even the guaranteed class's bounded queue
    classes = over["admission"]["classes"]
    share = {c: v["rejected"] / max(1, v["offered"]) for c, v in classes.items()}
    assert share["guaranteed"] < share["standard"]
    # without it every job is taken and the backlog grows
    assert over["one_class"]["classes"]["standard"]["rejected"] == 0
    assert over["one_class"]["max_queued"] > over["admission"]["max_queued"]
    # the shared key: the three runs and their ratios are there (the targets are timings,
    # printed by the benchmark, not asserted); each quiet job waited for its own hand-off
    shared = fl["shared_key"]
    for mode in ("fair", "fifo", "no_key"):
        assert _positive(shared[mode]["quiet_start_delay_ms"]["p99"]), mode
        assert shared[mode]["quiet_hand_offs"]["p50"] >= 1, mode
    assert shared["fair"]["slots"] > shared["fair"]["limit"] == shared["no_key"]["slots"]
    assert set(shared["ratios"]) == {
        "fifo_over_fair_p99", "fair_p99_over_three_hand_offs", "fair_over_no_key_p99",
    }  # fmt: skip
    metrics = {row["metric"] for row in result["summary"]}
    assert "Throughput, 1 worker" in metrics and "Overload, admission on: max queued" in metrics
    assert all(row["values"]["fairlane"] is not None for row in result["summary"])


def _installed_peer() -> str | None:
    # the cheapest first: taskiq and SAQ answer at once, arq polls every half second
    for name in ("taskiq", "saq", "streaq", "arq"):
        if venvs.ready_python(name) is not None:
            return name
    return None


@pytest.mark.timeout(300)
@pytest.mark.embedded_only
def test_quick_run_with_an_installed_peer(redis_url: str, tmp_path: Path) -> None:
    peer = _installed_peer()
    if peer is None:
        pytest.skip(
            "no peer environment made yet (python -m benchmarks makes them on first use); "
            "CI does not spend minutes of pip on it"
        )
    result = run_bench(
        redis_url,
        peers=[peer],
        quick=True,
        phases=["throughput", "latency"],
        out=tmp_path,
        console=_console(),
        latency_samples=20,
    )
    assert result["warnings"] == []
    theirs = result["medians"][peer]
    assert _positive(theirs["throughput"]["jobs_per_s"])
    assert _positive(theirs["throughput"]["server"]["commands_per_job"])
    assert _positive(theirs["latency"]["p50_ms"])
    row = next(r for r in result["summary"] if r["metric"] == "Throughput, 1 worker")
    assert _positive(row["ratios"][peer]) and row["best_peer"] == peer
    assert venvs.SYSTEMS[peer].label in result["markdown"]
