"""``fairlane doctor`` on the session's 3-master Redis Cluster: every primary is checked and
named, the slot coverage is a finding of its own, and one unsafe primary or one slot that
no primary serves fails the run. Each test puts the cluster back as it found it."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from typer.testing import CliRunner, Result

from fairlane.cli import cli
from fairlane.store.connection import create_sync_client, is_cluster, parse_address

pytestmark = [
    pytest.mark.contract,
    pytest.mark.parametrize("redis_url", ["cluster"], indirect=True),
]


def _command(client: redis.Redis, *args: str | int) -> Any:
    run: Any = client.execute_command  # unannotated in redis-py
    return run(*args)


CHECKS = ("ping", "version", "maxmemory-policy", "persistence", "maxmemory", "functions")


def _doctor(url: str) -> Result:
    # wide enough for one line per row whatever the terminal
    return CliRunner().invoke(cli, ["doctor", "--redis-url", url], env={"COLUMNS": "250"})


def _primaries(url: str) -> list[str]:
    return [f"{host}:{port}" for host, port in parse_address(url).nodes]


def _lines(output: str, needle: str) -> list[str]:
    return [line for line in output.splitlines() if needle in line]


def test_doctor_reports_every_primary_and_the_slot_coverage(redis_url: str) -> None:
    result = _doctor(redis_url)
    assert result.exit_code == 0, result.output
    (slots,) = _lines(result.output, "slots")
    assert slots.split()[:3] == ["OK", "slots", "cluster"], slots
    assert "all 16384 slots assigned, cluster_state ok (3 primaries)" in slots
    primaries = _primaries(redis_url)
    assert len(primaries) == 3
    for node in primaries:
        rows = _lines(result.output, f" {node} ")
        assert len(rows) == len(CHECKS), (node, result.output)
        assert all(row.split()[0] in ("OK", "WARN") for row in rows), rows
        assert any("noeviction" in row for row in rows), rows
    for check in CHECKS:  # each check named once, on the first of its nodes' rows
        (row,) = [line for line in result.output.splitlines() if line.split()[1:2] == [check]]
        assert any(node in row for node in primaries), row
    assert "ready" in result.output


def test_doctor_fails_naming_the_primary_that_may_evict(redis_url: str) -> None:
    unsafe, *others = _primaries(redis_url)
    host, port = unsafe.rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port), socket_timeout=5.0)
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
        result = _doctor(redis_url)
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        client.close()
    assert result.exit_code == 1, result.output
    (bad,) = [row for row in _lines(result.output, f" {unsafe} ") if "allkeys-lru" in row]
    assert bad.split()[0] == "ERROR", bad
    for node in others:
        (policy,) = [row for row in _lines(result.output, f" {node} ") if "noeviction" in row]
        assert policy.split()[0] == "OK", policy
    assert f"1 problem(s) make this cluster unsafe for Fairlane (on {unsafe})" in result.output
    assert "ready" not in result.output


def _cluster_ok(client: redis.Redis) -> bool:
    raw = _command(client, "CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return "cluster_state:ok" in text and "cluster_slots_assigned:16384" in text


def test_doctor_fails_on_a_slot_no_primary_serves(redis_url: str) -> None:
    clients = [
        redis.Redis(host=host, port=port, socket_timeout=5.0)
        for host, port in parse_address(redis_url).nodes
    ]
    cluster: Any = create_sync_client(redis_url)
    assert is_cluster(cluster)
    try:
        node = cluster.get_node_from_key("doctor-test")
        slot = cluster.keyslot("doctor-test")
    finally:
        cluster.close()
    (owner,) = [c for c in clients if c.connection_pool.connection_kwargs["port"] == node.port]
    try:
        # its owner forgets the slot, and no other node claims it: one slot is uncovered
        _command(owner, "CLUSTER", "DELSLOTS", slot)
        result = _doctor(redis_url)
    finally:
        _command(owner, "CLUSTER", "ADDSLOTS", slot)
        deadline = time.monotonic() + 5.0
        while not all(_cluster_ok(c) for c in clients):
            assert time.monotonic() < deadline, "the cluster did not take its slot back"
            time.sleep(0.02)
        for client in clients:
            client.close()
    assert result.exit_code == 1, result.output
    (slots,) = _lines(result.output, "slots")
    assert slots.split()[0] == "ERROR" and "16383 slots assigned" in slots, slots
    assert "(on cluster)" in result.output
