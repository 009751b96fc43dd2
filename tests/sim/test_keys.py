"""What the simulator shows about throttle keys: fair waiters on a shared key, and
grants only for work that can run.

``shared-key``: a flood and quiet tenants on one key of limit L, the lane larger than
L. With fair waiters (issue 16's rule) the quiet tenants start within about 3 of the
key's hand-offs of their arrival and at least 10x sooner than with FIFO waiters (the
rule before, ``waiters=fifo``), on the same arrivals. ``pressure``: with a key taken
only together with a lane slot, a steady tenant whose floor is above its need waits no
more than 1.5x what it waits with throttles off; with grants held while their jobs
wait for a slot (``waiters=fifo``) it waits far longer. Bounds come from the
scenarios' parameters, not from earlier runs.
"""

from __future__ import annotations

import pytest

from fairlane.sim import find_scenario, parse_scenario, run
from fairlane.sim.metrics import Row, VariantResult


def _group(result: VariantResult, name: str) -> Row:
    return next(g for g in result.groups if g.name == name)


def _variant(results: tuple[VariantResult, ...], label: str) -> VariantResult:
    return next(r for r in results if r.label == label)


def test_quiet_tenants_start_within_a_few_hand_offs_of_a_shared_key() -> None:
    scenario = find_scenario("shared-key")
    (key,) = scenario.keys
    mean = next(t.size.mean for t in scenario.tenants if t.name == "flood")
    slots = scenario.lanes[0].slots
    assert slots > key.limit  # the key, not the lane, is the bottleneck
    hand_off = mean / key.limit  # the mean time between the key's hand-offs
    results = run(scenario, ["fair", "fair+waiters=fifo", "fair+throttles=off"]).results
    fair = _group(_variant(results, "fair"), "quiet")
    fifo = _group(_variant(results, "fair+waiters=fifo"), "quiet")
    assert fair.waits.jobs == fifo.waits.jobs > 200  # the same arrivals
    # counted in hand-offs: the quiet jobs get one of the key's next 3 slots
    assert fair.handoffs is not None and fair.handoffs.p99 <= 3
    # in time: 3 hand-offs, plus one for the spread of when the holders happen to end
    assert fair.waits.p99 < 4 * hand_off
    assert fifo.waits.p99 > 10 * fair.waits.p99
    assert fifo.handoffs is not None and fifo.handoffs.p50 > 100  # behind the flood
    flood = _group(_variant(results, "fair"), "flood")
    assert flood.completed == flood.submitted  # the flood is served too, as the key allows


def test_the_flood_keeps_the_key_busy_while_quiet_tenants_wait_little() -> None:
    """Work conservation on the key: with fair waiters it runs L jobs at a time as long
    as the flood lasts, so the flood finishes when it would under FIFO waiters."""
    results = run(find_scenario("shared-key"), ["fair", "fair+waiters=fifo"]).results
    spans = [r.makespan for r in results]
    assert spans[0] == pytest.approx(spans[1], rel=0.01)


def test_pressure_steady_tenant_waits_about_as_long_as_with_throttles_off() -> None:
    scenario = find_scenario("pressure")
    results = run(scenario, ["fair", "fair+waiters=fifo", "fair+throttles=off"]).results
    on = _group(_variant(results, "fair"), "steady").waits
    held = _group(_variant(results, "fair+waiters=fifo"), "steady").waits
    off = _group(_variant(results, "fair+throttles=off"), "steady").waits
    assert on.jobs == off.jobs == held.jobs > 5000  # the same arrivals
    assert on.p99 <= 1.5 * off.p99
    assert held.p99 > 5 * off.p99  # grants held while their jobs wait for a slot


def test_weights_share_a_backlogged_key() -> None:
    """Two tenants backlogged on one shared key (limit 2, lane of 8) get its slots 3:1."""
    data = {
        "seed": 5,
        "sim": {"window": [0, 100], "charge": "jobs"},
        "lanes": {"x": {"slots": 8}},
        "keys": [{"name": "model:x", "limit": 2}],
        "tenants": [
            {"name": "heavy", "weight": 3, "bursts": [[0, 2000, 0]], "size": 0.2,
             "keys": ["model:x"]},
            {"name": "light", "weight": 1, "bursts": [[0, 2000, 0]], "size": 0.2,
             "keys": ["model:x"]},
        ],
    }  # fmt: skip
    scenario = parse_scenario(data)
    fair, fifo = run(scenario, ["fair", "fair+waiters=fifo"]).results
    heavy, light = _group(fair, "heavy"), _group(fair, "light")
    assert heavy.share == pytest.approx(0.75, abs=0.01)
    assert light.share == pytest.approx(0.25, abs=0.01)
    # FIFO waiters: the heavy tenant's whole burst came first
    assert _group(fifo, "heavy").share == pytest.approx(1.0, abs=0.01)


def test_a_job_takes_its_tenant_key_and_a_shared_key_all_or_nothing() -> None:
    """A tenant capped at 1 on a shared key of limit 2 never holds more than 1, and the
    other tenant gets the key's other slot; nothing runs over either limit."""
    data = {
        "seed": 3,
        "lanes": {"x": {"slots": 6}},
        "keys": [{"name": "model:x", "limit": 2}],
        "tenants": [
            {"name": "capped", "max_concurrency": 1, "bursts": [[0, 200, 0]], "size": 0.1,
             "keys": ["model:x"]},
            {"name": "other", "bursts": [[0, 200, 0]], "size": 0.1, "keys": ["model:x"]},
        ],
    }  # fmt: skip
    for r in run(parse_scenario(data), ["fair", "fair+waiters=fifo"]).results:
        capped, other = _group(r, "capped"), _group(r, "other")
        assert capped.peak == 1
        assert capped.completed == other.completed == 200
        # the key runs two at a time, so 400 jobs of 0.1 s take 20 s
        assert r.makespan == pytest.approx(20.0, rel=0.02)
