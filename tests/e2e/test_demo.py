"""End-to-end tests of ``fairlane demo`` (``fairlane.cli.demo``) against the test server.

The command runs through a one-command Typer app: in this process (``CliRunner``) for the
smoke test, as a subprocess for Ctrl-C. Both pass ``--redis-url``, so the demo uses the
session's server in namespaces of its own (``{fl:fldemo-...}``) and must leave none of
its keys behind. Its workers are real ``fairlane worker`` processes. A few seconds of
workload per run keep the file's runtime to a few tens of seconds; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
import redis
import typer
from typer.testing import CliRunner

from fairlane.cli.demo import demo

WAIT = 30.0  # upper bound of any single wait in these tests
WIDE = {"COLUMNS": "200"}  # Rich tables on one line per row

cli = typer.Typer(add_completion=False)
cli.command()(demo)

# Python leaves SIGINT ignored in a child whose parent ignored it (a background job of a
# non-interactive shell does); the test's Ctrl-C must reach the demo whatever ran pytest
CHILD = (
    "import signal, typer\n"
    "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
    "from fairlane.cli.demo import demo\n"
    "typer.run(demo)\n"
)


def demo_keys(url: str) -> list[bytes]:
    """Every key of any demo app on the server (SCAN, never KEYS)."""
    client = redis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=10)
    try:
        return list(client.scan_iter(match="*{fl:fldemo-*", count=1000))
    finally:
        client.close()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.embedded_only
def test_demo_runs_fair_and_fifo_and_writes_its_report(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = ["--duration", "8", "--no-live", "--redis-url", redis_url, "--out", str(out)]
    result = CliRunner().invoke(cli, args, env=WIDE)
    assert result.exit_code == 0, result.output
    assert "fair run over" in result.output and "fifo run over" in result.output
    assert "Start delay per tenant" in result.output

    report = json.loads((out / "demo-report.json").read_text())
    tenants = report["settings"]["tenants"]
    assert tenants == [
        "flood",
        *(f"steady-{i}" for i in range(1, 6)),
        "interactive",
        "batch",
        "research",
    ]
    assert set(report["runs"]) == {"fair", "fifo"}
    for mode, run in report["runs"].items():
        rows = run["tenants"]
        assert {row["tenant"] for row in rows} == set(tenants), mode
        for row in rows:
            assert row["submitted"] > 0, (mode, row)
            if row["tenant"] != "flood":  # the flood may be told to come back too late
                assert row["done"] > 0, (mode, row)
            assert row["start_delay_ms"]["samples"] > 0, (mode, row)
            assert row["unfinished"] == 0, (mode, row)
        assert {lane["lane"] for lane in run["lanes"]} == {"light", "heavy"}
        assert [w["status"] for w in run["workflows"]] == ["completed", "completed"], mode
    fair, fifo = report["runs"]["fair"], report["runs"]["fifo"]
    batch = next(row for row in fair["tenants"] if row["tenant"] == "batch")
    assert batch["admission"]["reasons"].get("too_wide") == 1  # the pool refuses it
    assert all(row["admission"]["rejected"] == 0 for row in fifo["tenants"])  # no pool
    assert {entry["tenant"] for entry in report["comparison"]} == set(tenants)

    svg = ET.parse(out / "demo-report.svg").getroot()
    assert svg.tag.endswith("svg")
    assert not demo_keys(redis_url)


@pytest.mark.embedded_only
def test_ctrl_c_stops_the_demo_its_workers_and_cleans_up(redis_url: str, tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    env.update(WIDE)
    args = ["--duration", "120", "--no-live", "--redis-url", redis_url, "--out", str(out)]
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            deadline = time.monotonic() + WAIT
            # a progress line: the workers are up and jobs are being submitted
            while "[fair" not in log.read_text():
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            time.sleep(1.0)  # mid-run: jobs running, queued, deferred
            pids = [int(pid) for pid in re.findall(r"pid (\d+) \(lane", log.read_text())]
            assert len(pids) == 2, log.read_text()
            assert all(alive(pid) for pid in pids)
            interrupted = time.monotonic()
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=WAIT)
            took = time.monotonic() - interrupted
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
    text = log.read_text()
    assert code == 130, text
    assert took < 15.0, text  # the workers' grace (2 s) plus the stop, not the run's 60 s
    assert "interrupted" in text
    assert not any(alive(pid) for pid in pids), text
    assert not demo_keys(redis_url)
    assert not (out / "demo-report.json").exists()
