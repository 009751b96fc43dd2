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
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from benchmarks import (
    core,
    imports,
    instructions,
    keyed,
    luaprofile,
    serverprofile,
    venvs,
    yardstick,
)
from benchmarks.config import LIMIT_MODES, SCENARIOS, Config
from benchmarks.serverprofile import Attribution, parse_entry
from rich.console import Console

from fairlane.cli.bench import run_bench
from fairlane.testing.server import RedisServer


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
            assert sorted(ran) == sorted(LIMIT_MODES if scenario == "limit" else expected)
        # the yardstick's modes run among the systems' throughput runs, not apart
        units = [(sc, s) for r, sc, s in steps if r == rep]
        group = {i for i, (sc, _) in enumerate(units) if sc in ("throughput", "limit")}
        assert len(group) == 5 and max(group) - min(group) == 4
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


def test_the_limit_runs_apart_when_throughput_does_not() -> None:
    cfg = Config.make("redis://x", reps=2, peers=(), scenarios=("limit", "latency"), seed=3)
    steps = list(core.plan(cfg, random.Random(cfg.seed)))
    assert [sc for _, sc, _ in steps] == ["limit", "limit", "latency"] * 2
    assert {s for _, sc, s in steps if sc == "limit"} == set(LIMIT_MODES)


def test_quick_sizes_and_overrides() -> None:
    cfg = Config.make("redis://x", quick=True, jobs=123)
    assert (cfg.reps, cfg.jobs, cfg.tenant_counts) == (1, 123, (1, 100))
    with pytest.raises(ValueError, match="unknown peers"):
        Config.make("redis://x", peers=("celery",))
    with pytest.raises(ValueError, match="unknown phases"):
        Config.make("redis://x", scenarios=("idle",))
    # a smoke run uses this interpreter; a full run gives Fairlane its own environment
    assert cfg.fairlane_env == "suite"
    assert Config.make("redis://x").fairlane_env == "own"
    with pytest.raises(ValueError, match="fairlane_env"):
        Config.make("redis://x", fairlane_env="system")


def test_fairlanes_own_environment_holds_what_a_user_installs() -> None:
    from importlib import metadata  # noqa: PLC0415 - this test's alone

    wanted = venvs.fairlane_requirements()
    assert wanted[-2:] == ("-e", str(venvs.CHECKOUT))
    pins = dict(r.split("==") for r in wanted[:-2])
    # the run-time dependencies, at the versions installed here
    for name in ("redis", "msgspec", "pydantic", "hiredis", "uvloop", "httpx"):
        assert pins[name] == metadata.version(name), name
    # and nothing of the development extra
    for name in ("opentelemetry-sdk", "opentelemetry-api", "pytest", "fastapi", "hypothesis"):
        assert name not in pins, name
    assert venvs.own_system("fairlane").requirements == wanted
    # a driver's extra this interpreter lacks is left to pip, unpinned
    assert venvs._pinned_closure((("no-such-dist-here", frozenset()),)) == {"no-such-dist-here": ""}
    assert venvs.own_system("arq") == venvs.SYSTEMS["arq"]


def _entry(i: int, usec: int, args: list[str], client: str, name: str = "") -> list[Any]:
    # the shape of a raw SLOWLOG GET entry: id, unix time, usec, args, address, name
    return [i, 1796193988, usec, [a.encode() for a in args], client.encode(), name.encode()]


def test_a_script_client_entry_counts_inside_the_next_function_call() -> None:
    """Redis 7.0 logs a function's commands under ``?:0``, just before its FCALL."""
    log = Attribution()
    raw = [
        _entry(10, 3, ["HGET", "k", "f"], "127.0.0.1:5000"),  # sent, before the call
        _entry(11, 2, ["HSET", "k", "f", "v"], "?:0"),
        _entry(12, 1, ["ZADD", "z", "1", "m"], "?:0"),
        _entry(13, 9, ["FCALL", "fl0123abcd_enqueue", "1", "k"], "127.0.0.1:5001"),
        _entry(14, 1, ["HGET", "k", "f"], "127.0.0.1:5002", serverprofile.METER_NAME),
        _entry(16, 2, ["HMGET", "k", "a", "b"], "?:0"),
        _entry(17, 5, ["FCALL", "fl0123abcd_exchange", "1", "k"], "127.0.0.1:5000"),
    ]
    log.add(parse_entry(e) for e in reversed(raw))  # newest first, as the server lists
    assert set(log.functions) == {"enqueue", "exchange"}
    assert dict(log.functions["enqueue"].inner) == {"hset": 1, "zadd": 1}
    assert (log.functions["enqueue"].usec, log.functions["enqueue"].inner_usec) == (9, 3)
    assert dict(log.functions["exchange"].inner) == {"hmget": 1}
    assert {n: c.calls for n, c in log.direct.items()} == {"hget": 1}  # not the meter's
    assert log.commands() == {"fcall": 2, "hset": 1, "zadd": 1, "hmget": 1, "hget": 1}
    assert (log.lost, log.orphans) == (1, 0)  # id 15 is missing
    log.dropped.add(15)  # ... as a drain's own SLOWLOG GET
    assert log.lost == 0


def test_a_callers_entries_just_before_its_call_count_inside_it() -> None:
    """Valkey 8 logs them under the caller: its entries just before the call are inside
    it, unless another connection's entry came between or a script cannot run them."""
    log = Attribution(by_caller=True)
    a, b = "127.0.0.1:5000", "127.0.0.1:5001"
    raw = [
        _entry(1, 1, ["HGET", "k", "f"], a),  # b's entry follows: a's ran before
        _entry(2, 1, ["PING"], b),  # no script runs it: sent
        _entry(3, 1, ["HSET", "k", "f", "v"], b),  # inside b's call
        _entry(4, 1, ["HMGET", "k", "f"], b),  # inside b's call
        _entry(5, 4, ["FCALL", "fl0123abcd_ack", "1", "k"], b),
        _entry(6, 1, ["ZADD", "z", "1", "m"], a),  # inside a's call
        _entry(7, 4, ["FCALL", "fl0123abcd_ack", "1", "k"], a),
        _entry(8, 1, ["HGET", "k", "f"], a),  # the last entry: no call after it
    ]
    log.add(parse_entry(e) for e in raw)
    assert log.functions["ack"].calls == 2
    assert dict(log.functions["ack"].inner) == {"hset": 1, "hmget": 1, "zadd": 1}
    assert {n: c.calls for n, c in log.direct.items()} == {"hget": 2, "ping": 1}
    assert sum(log.commands().values()) == len(raw)


@pytest.mark.anyio
@pytest.mark.embedded_only
async def test_the_profile_run_attributes_every_call_and_puts_the_slowlog_back(
    redis_url: str, namespace: str
) -> None:
    meter = aioredis.Redis.from_url(redis_url, decode_responses=True)
    saved = {k: (await meter.config_get(k))[k] for k in serverprofile.SETTINGS}
    try:
        await meter.config_set("slowlog-log-slower-than", 12345)
        await meter.config_set("slowlog-max-len", 77)
        out = await serverprofile.run(redis_url, namespace, jobs=300, batch=100, concurrency=20)
        assert await meter.config_get("slowlog-*") == {
            "slowlog-log-slower-than": "12345",
            "slowlog-max-len": "77",
        }
    finally:
        for name, value in saved.items():
            await meter.config_set(name, value)
        await meter.aclose()
    # the log's FCALLs are INFO commandstats' FCALLs, one for one, microsecond for microsecond
    assert out["check"] is True, (out["commandstats_fcall"], out["totals"])
    assert (out["lost_entries"], out["orphan_entries"]) == (0, 0)
    functions = out["functions"]
    assert functions["enqueue"]["calls"] == 3  # one per batch of 100
    assert functions["enqueue"]["inner_per_job"] > 0 and functions["exchange"]["inner_per_job"] > 0
    assert functions["exchange"]["calls"] >= 300 / 20 / 10  # a call leases at most 10x its slots
    for f in functions.values():
        assert f["usec_per_job"] == pytest.approx(f["usec"] / 300)
        assert f["usec_per_call"] == pytest.approx(f["usec"] / f["calls"])
    # the profiling connection's own polls and log reads are not the run's commands
    assert not {"hget", "config|set", "config|resetstat", "slowlog|reset"} & set(out["direct"])
    total = out["totals"]["fcall_usec_per_job"]
    assert total == pytest.approx(sum(f["usec_per_job"] for f in functions.values()))
    rows = serverprofile.table_rows(out, core.fmt)
    assert [r[0] for r in rows] == [*functions, "(sent directly)", "all functions"]
    assert all(len(r) == len(serverprofile.HEADER) for r in rows)


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
    console = _console()
    result = run_bench(redis_url, peers=False, quick=True, out=out, console=console, **QUICK_SMALL)

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
    assert _positive(server["fcall_usec_per_job"]) and _positive(server["fcall_calls_per_job"])
    # the profile: its own run of the same shape, every FCALL attributed to its function
    profile = fl["profile"]
    assert profile["check"] is True and profile["lost_entries"] == 0
    assert profile["functions"]["enqueue"]["calls"] == 5  # 500 jobs in batches of 100
    for name in ("enqueue", "exchange"):
        assert _positive(profile["functions"][name]["usec_per_job"]), name
        assert _positive(profile["functions"][name]["inner_per_job"]), name
    shown = console.file.getvalue()  # type: ignore[attr-defined]
    for text in (result["markdown"], shown):
        assert "Server time per entry point" in text and "FCALL us/job" in text
        assert "exchange" in text and "commands/job" in text
    assert fl["latency"]["samples"] == 20
    assert 0 < fl["latency"]["p50_ms"] <= fl["latency"]["p99_ms"]
    assert fl["noisy"]["tenants"] is True and fl["noisy"]["samples"] == 5
    # a fresh process a sample: the job waited for it, so it starts after the spawn
    assert fl["startup"]["samples"] == 2 and 0 < fl["startup"]["p50_ms"] <= fl["startup"]["max_ms"]
    assert set(fl["tenants"]["by_tenants"]) == {"1", "20"}
    backlog = fl["backlog"]["by_size"]
    assert set(backlog) == {"500", "2000"}
    assert backlog["2000"]["jobs"] == 2000 and _positive(backlog["2000"]["jobs_per_s"])
    assert backlog["500"]["ratio_to_first"] == 1.0
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
    _check_memory(result, redis_url)
    assert all(row["values"]["fairlane"] is not None for row in result["summary"])


@pytest.mark.anyio
@pytest.mark.embedded_only
async def test_the_yardsticks_fair_script_visits_each_tenant_once_per_pop(
    redis_url: str, namespace: str
) -> None:
    client = aioredis.Redis.from_url(redis_url)
    queue = yardstick.Queue(client, namespace, "fair")
    try:
        await queue.load()
        for tenant, ids in (("a", range(5)), ("b", [10]), ("c", [20, 21])):
            await client.rpush(
                queue.tenant_prefix + tenant, *(yardstick.pack(i, "noop", i, 1) for i in ids)
            )
            await client.zadd(queue.vt, {tenant: 0})
        now = (await client.time())[0]
        first = await client.evalsha(*queue.dispatch_args(3))
        assert sorted(yardstick.job_id(p) for p in first) == [0, 10, 20]
        leases = await client.zrange(queue.lease, 0, -1, withscores=True)
        assert sorted(int(m) for m, _ in leases) == [0, 10, 20]
        assert all(now + 29 <= score <= now + 32 for _, score in leases)
        # b is gone, its list empty; then a and c tie at 1 (a first, by name), c empties,
        # and a alone is left
        second = await client.evalsha(*queue.dispatch_args(4))
        assert [yardstick.job_id(p) for p in second] == [1, 21, 2, 3]
        assert await client.zrange(queue.vt, 0, -1, withscores=True) == [(b"a", 4.0)]
        ids = [yardstick.pack(i, "noop", 0, 0)[: yardstick.ID_WIDTH] for i in (0, 10)]
        settled = await client.evalsha(*queue.ack_args([ids[0], b"r0", ids[1], b"r10"]))
        assert settled == 2
        assert await client.get(queue.results.encode() + ids[1]) == b"r10"
        assert 290 <= await client.ttl(queue.results.encode() + ids[0]) <= 300
        assert sorted(int(m) for m in await client.zrange(queue.lease, 0, -1)) == [1, 2, 3, 20, 21]
    finally:
        await queue.clean()
        await client.aclose()


@pytest.mark.timeout(300)
@pytest.mark.embedded_only
def test_the_limit_phase_measures_the_yardstick_beside_fairlane(
    redis_url: str, tmp_path: Path
) -> None:
    common = {"peers": False, "quick": True, "out": tmp_path, "console": _console()}
    alone = run_bench(redis_url, phases=["limit"], **common)
    assert alone["warnings"] == [] and set(alone["raw"]["fairlane"]) == {"limit"}
    shown = {row["metric"] for row in alone["summary"]}
    assert shown == {"Limit, FIFO (yardstick)", "Limit, fair over 250 tenants (yardstick)"}
    both = run_bench(redis_url, phases=["throughput", "limit"], reps=2, **common)
    assert both["warnings"] == []
    for result in (alone, both):
        for entry in result["raw"]["fairlane"]["limit"]:
            for mode in LIMIT_MODES:
                figures = entry[mode]
                assert _positive(figures["jobs_per_s"]), mode
                assert figures["results_stored"] == figures["jobs"] == 500
            assert entry["fair"]["tenants"] == 250 and entry["fifo"]["tenants"] == 1
    # each ratio is taken within one repetition; the row is their median
    throughput = {r["rep"]: r["jobs_per_s"] for r in both["raw"]["fairlane"]["throughput"]}
    ratios = []
    for entry in both["raw"]["fairlane"]["limit"]:
        ours = throughput[entry["rep"]]
        assert entry["ratios"]["fairlane_over_fair"] == ours / entry["fair"]["jobs_per_s"]
        assert entry["ratios"]["fairlane_over_fifo"] == ours / entry["fifo"]["jobs_per_s"]
        ratios.append(entry["ratios"]["fairlane_over_fair"])
    rows = {row["metric"]: row for row in both["summary"]}
    fair = rows["Fairlane throughput / fair limit"]["values"]["fairlane"]
    assert _positive(fair) and fair == pytest.approx(sum(ratios) / 2)
    assert _positive(rows["Fairlane throughput / FIFO limit"]["values"]["fairlane"])
    assert "Fairlane throughput / fair limit" in both["markdown"]
    # the yardstick's runs took their turns among the throughput runs
    assert sorted(both["meta"]["order"]) == sorted(
        f"{rep}:{sc}:{unit}"
        for rep in range(2)
        for sc, unit in (("throughput", "fairlane"), ("limit", "fifo"), ("limit", "fair"))
    )


def _check_memory(result: dict[str, Any], redis_url: str) -> None:
    """The waiting jobs' memory: the server's own count, the producer's buffers left out;
    the run's keys deleted afterwards, as every scenario's."""
    memory = result["medians"]["fairlane"]["memory"]
    assert memory["jobs"] == 5_000 and memory["batch_method"] == "enqueue_many"
    assert _positive(memory["bytes_per_job"])
    grown = memory["after"]["used_memory"] - memory["before"]["used_memory"]
    assert memory["used_memory_per_job"] == pytest.approx(grown / 5_000)
    row = next(r for r in result["summary"] if r["metric"] == "Memory per waiting job")
    assert row["values"] == {"fairlane": memory["bytes_per_job"]}
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"bench{result['meta']['config']['run_id']}_*")) == []
    finally:
        client.close()


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


@pytest.mark.anyio
@pytest.mark.embedded_only
async def test_the_keyed_run_puts_every_key_on_every_job_and_times_both_ways(
    redis_url: str, namespace: str
) -> None:
    out = await keyed.run(
        redis_url, namespace, jobs=300, batch=100, concurrency=20, fairness_keys=4, first="keyed"
    )
    assert out["order"] == ["keyed", "plain"]
    assert out["keyed"]["keys_stored"] == {"lim": True, "rk": True, "fk": True}
    assert out["plain"]["keys_stored"] == {"lim": False, "rk": False, "fk": False}
    for way in keyed.WAYS:
        run = out[way]
        assert run["batch"] == 75  # a batch per fairness key in turn: 300 jobs over 4 keys
        assert _positive(run["jobs_per_s"]) and _positive(run["fcall_usec_per_job"]), way
        # one enqueue call per batch; the drain's commands are counted per command
        assert run["enqueue"]["fcall_calls_per_job"] == pytest.approx(4 / 300), way
        assert run["drain"]["fcall_usec_per_job"] == run["fcall_usec_per_job"]
        assert "info" not in run["drain"]["by_command"], way
    assert out["ratio"] == pytest.approx(out["keyed"]["jobs_per_s"] / out["plain"]["jobs_per_s"])
    # the keys' bookkeeping is work the plain lane does not do
    assert out["keyed"]["drain"]["commands_per_job"] > out["plain"]["drain"]["commands_per_job"]
    # nothing of either way's app is left on the server
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert [k async for k in client.scan_iter(match=f"*{namespace}_*", count=1000)] == []
    finally:
        await client.aclose()


def test_the_instruction_count_enqueues_the_shapes_the_readme_names() -> None:
    one = list(instructions.batches(2_500, 1_000, 0))
    assert [(t, len(c)) for t, c in one] == [
        ("default", 1_000),
        ("default", 1_000),
        ("default", 500),
    ]
    assert [n for _, c in one for (n,) in c] == list(range(2_500))
    spread = list(instructions.batches(20_000, 1_000, 10_000))
    assert len(spread) == 10_000
    assert {len(c) for _, c in spread} == {2}
    assert len({t for t, _ in spread}) == 10_000


@pytest.mark.parametrize("probe", sorted(imports.PROBES))
def test_each_import_probe_runs_as_it_is_counted(probe: str) -> None:
    # what callgrind counts is only worth a figure if the probe itself runs cleanly
    env = imports.probe_environment()
    done = subprocess.run(
        [sys.executable, "-c", imports.PROBES[probe]],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_the_lua_profile_wraps_what_a_module_exports() -> None:
    text = """local mod = {}
do
  local function helper() end
  local function fetch() end
  function mod.read(k) end
  mod.fetch = fetch
  mod.LIMIT = limit
end
"""
    assert luaprofile.exported(text) == ("mod", ["fetch", "read"])
    assert luaprofile.exported("-- no module here\n") is None


@pytest.mark.anyio
async def test_the_lua_profile_times_the_library_from_inside() -> None:
    # a server of its own: the timed library carries the release's name, and any app on
    # the server runs it
    with RedisServer() as server:
        phases = await luaprofile.profile(server.url, jobs=200)
    by_name = {p: {r.name: r for r in rows} for p, rows in phases.items()}
    assert by_name["enqueue"]["enqueuing.enqueue"].calls == 1
    assert by_name["fetch"]["leasing.lease_jobs"].calls == 2  # 200 jobs, 100 a call
    assert by_name["settle"]["records.finish"].calls == 200
    # every second timed is some function's own, the timers' cost taken out of each
    # alike: the selves add up to the one root's whole
    for phase in ("fetch", "settle"):
        root = by_name[phase]["workers.exchange"]
        assert sum(r.own for r in phases[phase]) == pytest.approx(root.inclusive, rel=1e-6)
