"""What the simulator shows: determinism, weighted shares, noisy neighbours, overload.

Each test runs a small scenario (inline, or a shipped one) and checks a property the
policy core promises -- against numbers computed from the scenario, not from a
previous run: shares equal to ``w_i / sum(w)`` for backlogged tenants, a quiet tenant
unaffected by a flood under ``fair`` but not under ``fifo``, and seed 002's overload
experiment: bounded queue and flat guaranteed latency with admission, growth without.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from fairlane.sim import find_scenario, parse_scenario, run
from fairlane.sim.metrics import Row, VariantResult, jain
from fairlane.sim.report import to_json


def _strip_wall(data: dict[str, Any]) -> dict[str, Any]:
    for v in data["variants"]:
        v["summary"].pop("wall")
    return data


def _by_name(rows: tuple[Row, ...], name: str) -> Row:
    return next(r for r in rows if r.name == name)


def _variant(results: tuple[VariantResult, ...], label: str) -> VariantResult:
    return next(r for r in results if r.label == label)


def shares_scenario(weights: tuple[float, ...], charge: str = "time") -> dict[str, Any]:
    return {
        "seed": 11,
        "sim": {"window": [0, 60], "charge": charge},
        "lanes": {"x": {"slots": 6}},
        "tenants": [
            {"name": f"w{w:g}", "weight": w, "bursts": [[0, 4000, 0]],
             "size": {"dist": "exponential", "mean": 0.1}}
            for w in weights
        ],
    }  # fmt: skip


def test_same_seed_same_results_and_another_seed_differs() -> None:
    scenario = find_scenario("noisy-neighbor")
    first = _strip_wall(to_json(run(scenario, ["fair", "fifo"], scale=0.3)))
    again = _strip_wall(to_json(run(scenario, ["fair", "fifo"], scale=0.3)))
    other = _strip_wall(to_json(run(scenario, ["fair", "fifo"], scale=0.3, seed=99)))
    assert first == again
    assert first != other


def test_parallel_workers_give_the_same_results() -> None:
    scenario = find_scenario("long-jobs")
    one = _strip_wall(to_json(run(scenario, scale=0.2, workers=1)))
    two = _strip_wall(to_json(run(scenario, scale=0.2, workers=2)))
    assert one == two


@pytest.mark.parametrize("charge", ["time", "jobs"])
def test_backlogged_shares_follow_weights_5_3_2(charge: str) -> None:
    weights = (5.0, 3.0, 2.0)
    result = run(parse_scenario(shares_scenario(weights, charge)), ["fair"]).results[0]
    total = sum(weights)
    for w in weights:
        row = _by_name(result.groups, f"w{w:g}")
        assert row.backlogged == 1
        assert row.fair_share == pytest.approx(w / total)
        # time charge: exact up to one job per tenant; jobs charge: shares of dispatches,
        # so the shares of work differ only by the sampling of exponential sizes
        tolerance = 0.005 if charge == "time" else 0.03
        assert row.share == pytest.approx(w / total, abs=tolerance)
    assert result.jain is not None
    assert result.jain > (0.9999 if charge == "time" else 0.99)


def test_fifo_shares_ignore_weights() -> None:
    result = run(parse_scenario(shares_scenario((5.0, 3.0, 2.0))), ["fifo"]).results[0]
    assert _by_name(result.groups, "w5").share == pytest.approx(1.0)  # it arrived first
    assert result.jain == pytest.approx(1 / 3)


def test_jain_index() -> None:
    assert jain([1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([3.0]) is None


def test_noisy_neighbour_quiet_tenants_barely_wait_under_fair() -> None:
    results = run(find_scenario("noisy-neighbor")).results
    fair = _by_name(_variant(results, "fair").groups, "quiet").waits
    fifo = _by_name(_variant(results, "fifo").groups, "quiet").waits
    assert fair.jobs == fifo.jobs > 1000  # the same arrivals
    assert fair.p99 < 0.5  # about one job of the flood ahead, at most
    assert fifo.p99 > 30  # behind the flood
    assert fifo.p99 > 100 * fair.p99


def test_overload_admission_bounds_queue_and_keeps_guaranteed_flat() -> None:
    results = run(find_scenario("overload")).results
    fair = _variant(results, "fair")
    normal, overload, recovery = fair.phases.index("normal"), 1, 2
    assert fair.phases == ("normal", "overload", "recovery")
    gold = _by_name(fair.classes, "guaranteed")
    # with admission: the queue never exceeds the pool's units, guaranteed is never
    # refused, and its p99 in the overload is what it was before
    assert fair.max_queue + fair.max_deferred <= 16
    assert _by_name(fair.groups, "guaranteed").rejected == 0
    assert gold.phase_p99[overload] < 2 * gold.phase_p99[normal] + 0.1
    assert gold.phase_p99[recovery] < 2 * gold.phase_p99[normal] + 0.1
    assert fair.rejections.get("class_full", 0) > 0  # standard work was shed instead
    # without admission (fifo): the queue and guaranteed latency grow with the overload
    fifo = _variant(results, "fifo")
    fifo_gold = _by_name(fifo.classes, "guaranteed")
    assert fifo.max_queue > 10 * (fair.max_queue + fair.max_deferred)
    assert fifo_gold.phase_p99[overload] > 10 * max(fifo_gold.phase_p99[normal], 1.0)
    assert fifo.rejected == 0
    queued = {t: q for t, q, _, _ in fifo.series}
    early = max(q for t, q in queued.items() if t < 60)
    late = max(q for t, q in queued.items() if 150 <= t < 180)
    assert late > 10 * max(early, 1)  # grows through the overload phase
    # fair classes without admission: guaranteed stays flat, the standard queue grows
    no_gate = _variant(results, "fair+admission=off")
    assert _by_name(no_gate.classes, "guaranteed").phase_p99[overload] < 1.0
    assert no_gate.max_queue > 10 * (fair.max_queue + fair.max_deferred)


def test_slicing_keeps_short_jobs_within_a_slice_of_long_ones() -> None:
    results = run(find_scenario("long-jobs"), ["slice=0.5", "slice=inf"], scale=0.5).results
    sliced = _by_name(_variant(results, "slice=0.5").groups, "short").waits
    whole = _by_name(_variant(results, "slice=inf").groups, "short").waits
    assert _variant(results, "slice=0.5").yields > 0
    assert _variant(results, "slice=inf").yields == 0
    assert sliced.p99 < 1.0
    assert whole.p99 > 5 * sliced.p99


def test_batch_runs_on_spare_and_interactive_stays_fast() -> None:
    results = run(find_scenario("batch-idle"), ["fair", "fifo"], scale=0.25).results
    fair, fifo = _variant(results, "fair"), _variant(results, "fifo")
    assert next(iter(fair.utilisation.values())) > 0.95  # idle capacity went to batch
    interactive = _by_name(fair.groups, "interactive").waits
    assert interactive.p99 < 5
    assert _by_name(fifo.groups, "interactive").waits.p99 > 20 * interactive.p99


def test_caps_and_ceilings_bound_concurrency() -> None:
    data = shares_scenario((1.0, 1.5))
    data["tenants"][0]["max_concurrency"] = 2
    data["tenants"][1]["limits"] = {"floor": 1, "max_concurrency": 3}
    result = run(parse_scenario(data), ["fair"]).results[0]
    assert _by_name(result.groups, "w1").peak == 2
    ceiling = _by_name(result.groups, "w1.5")
    # under a backlog of thousands the pressure factor is F_MIN: the limit in force is
    # max(floor, floor(ceiling * F_MIN)) = 2, within [floor, max_concurrency]
    assert ceiling.limit is not None and 1 <= ceiling.limit[0] <= ceiling.limit[1] <= 3
    assert ceiling.peak is not None and ceiling.peak <= ceiling.limit[1]
    off = run(parse_scenario(data), ["fair+throttles=off"]).results[0]
    assert all(g.peak is None for g in off.tenants)


def test_scale_shrinks_jobs_not_load() -> None:
    scenario = find_scenario("changing-demand")
    small = scenario.scaled(0.1)
    assert small.expected_jobs() == pytest.approx(0.1 * scenario.expected_jobs(), rel=1e-6)
    assert [lane.slots for lane in small.lanes] == [lane.slots for lane in scenario.lanes]
    assert small.horizon == pytest.approx(0.1 * scenario.horizon)
    with pytest.raises(ValueError, match="scale"):
        scenario.scaled(0)


def test_results_are_plain_data() -> None:
    result = run(find_scenario("weighted-shares"), ["fair"], scale=0.05).results[0]
    assert dataclasses.asdict(result)["settings"]["policy"] == "fair"


def test_until_stops_the_clock_and_reports_what_is_left() -> None:
    data = shares_scenario((1.0,))
    data["sim"] = {"until": 20}
    result = run(parse_scenario(data), ["fair"]).results[0]
    assert result.makespan <= 20
    assert result.unfinished > 0
    assert result.completed + result.unfinished == result.submitted


def test_lanes_are_separate_capacity() -> None:
    data = {
        "lanes": {"cpu": {"slots": 2}, "gpu": {"slots": 1}},
        "tenants": [
            {"name": "c", "lane": "cpu", "bursts": [[0, 100, 0]], "size": 0.5},
            {"name": "g", "lane": "gpu", "class": "guaranteed", "bursts": [[0, 10, 0]],
             "size": 0.5},
        ],
    }  # fmt: skip
    result = run(parse_scenario(data), ["fair", "fifo"]).results
    for r in result:
        assert [c.name for c in r.classes] == ["cpu/standard", "gpu/guaranteed"]
        assert r.completed == 110
        assert r.makespan == pytest.approx(25.0)  # cpu: 100 jobs of 0.5 s on 2 slots
        assert r.utilisation == {"cpu": pytest.approx(1.0), "gpu": pytest.approx(0.2)}
