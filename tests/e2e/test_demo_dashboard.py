"""End-to-end test of ``fairlane demo --dashboard-port --metrics-port``: a running demo
is watchable in the operator dashboard and scrapeable by Prometheus.

The demo runs as a subprocess against the session's server (``--redis-url``) with a
known admin key; while its fair run is under way the test reads the dashboard's JSON
API with the key as a bearer token, and scrapes the gateway's ``/metrics`` and the light
lane worker's. Once the demo exits (0), nothing may still listen on any of its ports.
Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_demo import WIDE, demo_keys

WAIT = 30.0  # upper bound of any single wait in this test
ADMIN_KEY = "demo-dashboard-test-key-0123456789"
BEARER = {"Authorization": f"Bearer {ADMIN_KEY}"}


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports on this machine."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first: int = probe.getsockname()[1]
        if first + count > 65535:
            continue
        socks = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return first
    raise RuntimeError(f"no {count} consecutive free ports found")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def get(url: str, headers: dict[str, str] | None = None) -> bytes:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=10) as answer:
        body: bytes = answer.read()
        return body


def get_json(url: str) -> Any:
    return json.loads(get(url, BEARER))


def wait_for(log: Path, proc: subprocess.Popen[bytes], text: str) -> None:
    deadline = time.monotonic() + WAIT
    while text not in log.read_text():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.mark.embedded_only
def test_demo_serves_the_dashboard_and_metrics_while_it_runs(
    redis_url: str, tmp_path: Path
) -> None:
    dashboard = free_ports(1)
    metrics = free_ports(2)
    log = tmp_path / "demo.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    env.update(WIDE)
    args = [
        *("--duration", "6", "--no-baseline", "--tenants", "2", "--no-live"),
        *("--redis-url", redis_url, "--out", str(tmp_path / "out")),
        *("--dashboard-port", str(dashboard), "--metrics-port", str(metrics)),
        *("--admin-key", ADMIN_KEY),
    ]
    base = f"http://127.0.0.1:{dashboard}"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairlane.cli", "demo", *args],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
        try:
            # the gateway is announced once it listens; a progress line follows when
            # the first arrivals are submitted
            wait_for(log, proc, "gateway: pid")
            text = log.read_text()
            assert f"dashboard: {base}/ui (admin key: the one given)" in text
            assert ADMIN_KEY not in text  # a key the user gave is never echoed
            assert f"http://127.0.0.1:{metrics}/metrics (lane light)" in text
            assert f"http://127.0.0.1:{metrics + 1}/metrics (lane heavy)" in text
            wait_for(log, proc, "[fair ")
            time.sleep(1.5)  # mid-run: jobs submitted, running and done

            with pytest.raises(urllib.error.HTTPError) as refused:
                get(f"{base}/ui/api/overview")
            refused.value.close()  # it holds the answer's socket
            assert refused.value.code == 401

            live = get_json(f"{base}/ui/api/overview")
            assert live["app"].startswith("fldemo-") and live["app"].endswith("-fair")
            assert live["counts"]["workers"] == 2
            lanes = {lane["name"]: lane for lane in live["lanes"]}
            assert lanes["light"]["capacity"] == 16 and lanes["heavy"]["capacity"] == 4
            found = get_json(f"{base}/ui/api/jobs?tenant=flood&limit=20")
            assert found["jobs"], found
            assert {job["tenant"] for job in found["jobs"]} == {"flood"}
            one = get_json(f"{base}/ui/api/jobs/{found['jobs'][0]['id']}")
            assert one["id"] == found["jobs"][0]["id"]

            gateway_metrics = get(f"{base}/metrics").decode()
            assert "fairlane_admission_decisions_total{" in gateway_metrics
            assert 'fairlane_lane_capacity_slots{lane="light"} 16.0' in gateway_metrics
            worker_metrics = get(f"http://127.0.0.1:{metrics}/metrics").decode()
            assert "fairlane_queue_wait_seconds_bucket{" in worker_metrics
            assert 'lane="light"' in worker_metrics

            code = proc.wait(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=WAIT)
    assert code == 0, log.read_text()
    assert "fair run over" in log.read_text()
    for port in (dashboard, metrics, metrics + 1):
        assert not listening(port), port
    assert not demo_keys(redis_url)


@pytest.mark.embedded_only
def test_a_short_admin_key_is_a_usage_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRLANE_")}
    args = ["--dashboard-port", "8080", "--admin-key", "short"]
    result = subprocess.run(
        [sys.executable, "-m", "fairlane.cli", "demo", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert b"at least 16 characters" in result.stderr
