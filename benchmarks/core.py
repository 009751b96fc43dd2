"""Runs the suite: every scenario for every system, interleaved, repeated; sums it up.

For each repetition, for each scenario, the systems run one after the other in a fresh
random order, each through its driver (``benchmarks/peers/<system>_driver.py``, run
with the Python of the system's own environment, see ``venvs.py``), so that drift in
the machine's load hits every system alike. Each figure is then the median of the
repetitions. The result is a JSON-ready dict: ``meta``, ``raw`` (every repetition of
every system and scenario), ``medians`` and ``summary`` (one row per headline figure,
with Fairlane's ratio to each peer and to the best peer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from benchmarks import keyed, serverprofile
from benchmarks.common import REPO_ROOT, Meter, delete_matching, script_commands
from benchmarks.config import LIMIT_MODES, SHARED, Config
from benchmarks.venvs import SYSTEMS, ensure, peers_dir
from fairlane.store.library import LIBRARY_CODE

Progress = Callable[[str], None]
IN_FAIRLANE_SCRIPTS = script_commands(LIBRARY_CODE)

# (scenario, label, unit, which way is better, path into the scenario's figures)
Metric = tuple[str, str, str, str, tuple[str, ...]]
SHARED_METRICS: tuple[Metric, ...] = (
    ("throughput", "Throughput, 1 worker", "jobs/s", "higher", ("jobs_per_s",)),
    ("throughput", "Enqueue, batched", "jobs/s", "higher", ("enqueue_jobs_per_s",)),
    (
        "throughput",
        "Server commands/job",
        "cmd/job",
        "lower",
        ("server", "commands_per_job"),
    ),
    ("throughput", "Worker RSS after the drain", "MiB", "lower", ("worker_rss_end_mb",)),
    ("latency", "Enqueue->start p50, idle worker", "ms", "lower", ("p50_ms",)),
    ("latency", "Enqueue->start p99, idle worker", "ms", "lower", ("p99_ms",)),
    ("noisy", "Noisy neighbor: quiet start p50", "ms", "lower", ("p50_ms",)),
    ("noisy", "Noisy neighbor: quiet start p99", "ms", "lower", ("p99_ms",)),
    ("noisy", "Noisy neighbor: quiet start max", "ms", "lower", ("max_ms",)),
    ("memory", "Memory per waiting job", "B/job", "lower", ("bytes_per_job",)),
    ("startup", "Worker start-up, spawn to its first job, p50", "ms", "lower", ("p50_ms",)),
)


def limit_title(cfg: Config, mode: str) -> str:
    """The yardstick's mode as the tables name it."""
    if mode == "fifo":
        return "FIFO"
    return f"fair over {min(cfg.limit_tenants, cfg.jobs):,} tenants"


def fairlane_metrics(cfg: Config) -> tuple[Metric, ...]:
    rows: list[Metric] = [
        (
            "limit",
            f"Limit, {limit_title(cfg, 'fifo')} (yardstick)",
            "jobs/s",
            "higher",
            ("fifo", "jobs_per_s"),
        ),
        (
            "limit",
            f"Limit, {limit_title(cfg, 'fair')} (yardstick)",
            "jobs/s",
            "higher",
            ("fair", "jobs_per_s"),
        ),
        (
            "limit",
            "Fairlane throughput / fair limit",
            "x",
            "higher",
            ("ratios", "fairlane_over_fair"),
        ),
        (
            "limit",
            "Fairlane throughput / FIFO limit",
            "x",
            "higher",
            ("ratios", "fairlane_over_fifo"),
        ),
        (
            "throughput",
            "FCALL server time/job",
            "us/job",
            "lower",
            ("server", "fcall_usec_per_job"),
        ),
        (
            "profile",
            "Server time/job in functions, under SLOWLOG",
            "us/job",
            "lower",
            ("totals", "fcall_usec_per_job"),
        ),
        (
            "profile",
            "Commands/job inside functions",
            "cmd/job",
            "lower",
            ("totals", "inner_per_job"),
        ),
        (
            "throughput",
            "Client calls/job (server view)",
            "call/job",
            "lower",
            ("server", "client_calls_per_job"),
        ),
        (
            "throughput",
            "Worker RSS, peak during the drain",
            "MiB",
            "lower",
            ("worker_rss_peak_mb",),
        ),
    ]
    for count in cfg.tenant_counts:
        rows.append(
            (
                "tenants",
                f"Throughput, {count:,} active tenant{'s' if count > 1 else ''}",
                "jobs/s",
                "higher",
                ("by_tenants", str(count), "jobs_per_s"),
            )
        )
    for size in cfg.backlog_sizes:
        rows.append(
            (
                "backlog",
                f"Throughput, a backlog of {size:,} over {cfg.backlog_tenants:,} tenants",
                "jobs/s",
                "higher",
                ("by_size", str(size), "jobs_per_s"),
            )
        )
    if len(cfg.backlog_sizes) > 1:
        first, last = cfg.backlog_sizes[0], cfg.backlog_sizes[-1]
        rows.append(
            (
                "backlog",
                f"Backlog of {last:,} / of {first:,}, throughput (target >= 0.9)",
                "x",
                "higher",
                ("by_size", str(last), "ratio_to_first"),
            )
        )
    rows += [
        (
            "submit",
            f"submit() decisions, {cfg.submit_processes} processes",
            "dec/s",
            "higher",
            ("decisions_per_s",),
        ),
        ("submit", "submit() latency p50", "ms", "lower", ("latency_ms", "p50")),
        ("submit", "submit() latency p99", "ms", "lower", ("latency_ms", "p99")),
    ]
    for variant, title in (
        ("admission", "admission on"),
        ("no_admission", "admission off, 2 classes"),
        ("one_class", "admission off, 1 class (FIFO)"),
    ):
        rows += [
            (
                "overload",
                f"Overload, {title}: max queued",
                "jobs",
                "lower",
                (variant, "max_queued"),
            ),
            (
                "overload",
                f"Overload, {title}: guaranteed p50",
                "ms",
                "lower",
                (variant, "guaranteed", "p50_ms"),
            ),
            (
                "overload",
                f"Overload, {title}: guaranteed p99",
                "ms",
                "lower",
                (variant, "guaranteed", "p99_ms"),
            ),
            (
                "overload",
                f"Overload, {title}: standard rejected",
                "jobs",
                "-",
                (variant, "classes", "standard", "rejected"),
            ),
        ]
    for mode, title in (
        ("fair", "fair waiters"),
        ("fifo", "FIFO waiters (one tenant)"),
        ("no_key", "no key, lane of L slots"),
    ):
        rows.append(
            (
                "shared_key",
                f"Shared key, {title}: quiet p99",
                "ms",
                "lower",
                (mode, "quiet_start_delay_ms", "p99"),
            )
        )
    rows += [
        (
            "shared_key",
            "Shared key: FIFO p99 / fair p99 (target >= 10)",
            "x",
            "higher",
            ("ratios", "fifo_over_fair_p99"),
        ),
        (
            "shared_key",
            "Shared key: fair p99 / 3 hand-offs (target <= 1)",
            "x",
            "lower",
            ("ratios", "fair_p99_over_three_hand_offs"),
        ),
    ]
    for way, title in (
        ("retry", "no rate key, retries"),
        ("rate", "Rate at capacity"),
        ("rate_half_burst", "Rate at capacity, burst N/2"),
        ("adaptive", "Adaptive"),
    ):
        rows += [
            ("upstream", f"Upstream, {title}: goodput", "of capacity", "higher", (way, "goodput")),
            ("upstream", f"Upstream, {title}: 429s", "of calls", "lower",
             (way, "throttled_share")),
            ("upstream", f"Upstream, {title}: tenants' Jain index", "", "higher", (way, "jain")),
            ("upstream", f"Upstream, {title}: completion p99", "ms", "lower",
             (way, "completion_ms", "p99")),
        ]  # fmt: skip
    for way, title in (("plain", "plain"), ("keyed", "throttle, rate, fairness keys")):
        rows += [
            ("keyed", f"Keyed lane run, {title}: throughput", "jobs/s", "higher",
             (way, "jobs_per_s")),
            ("keyed", f"Keyed lane run, {title}: FCALL server time/job", "us/job", "lower",
             (way, "fcall_usec_per_job")),
        ]  # fmt: skip
    rows.append(
        ("keyed", "Keyed lane / plain throughput (target >= 0.7)", "x", "higher", ("ratio",))
    )
    return tuple(rows)


# -- medians ---------------------------------------------------------------------------


def _dig(figures: Any, path: tuple[str, ...]) -> float | None:
    value = figures
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def median_tree(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of ``reps`` with every number replaced by its median over the reps."""
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in reps for k in r):  # a key some reps lack included
        if key == "rep":  # which repetition: no median of that
            continue
        values = [r[key] for r in reps if key in r]
        first = values[0]
        if isinstance(first, dict):
            out[key] = median_tree([v for v in values if isinstance(v, dict)])
        elif isinstance(first, int | float) and not isinstance(first, bool):
            nums = [v for v in values if isinstance(v, int | float)]
            out[key] = statistics.median(nums)
        else:
            out[key] = first
    return out


def _good(reps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in reps if "error" not in r]


def summary(result: dict[str, Any], cfg: Config) -> list[dict[str, Any]]:
    """One row per headline figure: medians, spread, Fairlane's ratio to each peer."""
    rows: list[dict[str, Any]] = []
    raw, medians = result["raw"], result["medians"]
    metrics = [(m, True) for m in SHARED_METRICS] + [(m, False) for m in fairlane_metrics(cfg)]
    for (scenario, label, unit, better, path), shared in metrics:
        systems = cfg.systems if shared else ("fairlane",)
        values: dict[str, float | None] = {}
        spread: dict[str, list[float]] = {}
        for system in systems:
            values[system] = _dig(medians.get(system, {}).get(scenario), path)
            per_rep = [_dig(r, path) for r in _good(raw.get(system, {}).get(scenario, []))]
            nums = [v for v in per_rep if v is not None]
            if nums:
                spread[system] = [min(nums), max(nums)]
        ours = values.get("fairlane")
        if ours is None and all(v is None for v in values.values()):
            continue
        ratios = {
            peer: (ours / theirs if ours is not None and theirs else None)
            for peer, theirs in values.items()
            if peer != "fairlane"
        }
        peers = {p: v for p, v in values.items() if p != "fairlane" and v is not None}
        best = None
        if peers and better in ("higher", "lower"):
            pick = max if better == "higher" else min
            best = pick(peers, key=lambda p: peers[p])
        rows.append(
            {
                "scenario": scenario,
                "metric": label,
                "unit": unit,
                "better": better,
                "shared": shared,
                "values": values,
                "spread": spread,
                "ratios": ratios,
                "best_peer": best,
                "vs_best": ratios.get(best) if best else None,
            }
        )
    return rows


# -- running a driver ----------------------------------------------------------------------


async def _run_driver(
    python: str,
    system: str,
    scenario: str,
    params: dict[str, Any],
    *,
    meter: Meter,
    timeout: float,
) -> dict[str, Any]:
    """One scenario of one system; for ``throughput`` also the server's command counts."""
    with tempfile.TemporaryFile() as log:
        return await _drive(python, system, scenario, params, meter, timeout, log)


async def _drive(  # noqa: PLR0917 - _run_driver's arguments and its log
    python: str,
    system: str,
    scenario: str,
    params: dict[str, Any],
    meter: Meter,
    timeout: float,
    log: Any,
) -> dict[str, Any]:
    measure = scenario == "throughput"
    params = {**params, "handshake": measure}
    proc = await asyncio.create_subprocess_exec(
        python,
        str(SYSTEMS[system].driver_path),
        "run",
        scenario,
        "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    assert proc.stdin is not None and proc.stdout is not None
    calls: Counter[str] | None = None
    fcall: dict[str, int] | None = None
    result: dict[str, Any] | None = None
    error = None
    try:
        if measure:
            await meter.reset()
        proc.stdin.write(json.dumps(params).encode() + b"\n")
        await proc.stdin.drain()
        async with asyncio.timeout(timeout):
            while line := await proc.stdout.readline():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                kind = event.get("event")
                if kind == "measured":
                    calls = await meter.calls()
                    if system == "fairlane":
                        with meter.own():
                            fcall = await serverprofile.fcall_stats(meter.client)
                    proc.stdin.write(b"go\n")
                    await proc.stdin.drain()
                elif kind == "result":
                    result = event["figures"]
                elif kind == "error":
                    error = event.get("message")
            await proc.wait()
    except TimeoutError:
        error = f"no result within {timeout:.0f}s"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.seek(0)
        stderr = log.read().decode(errors="replace")
    if result is None or proc.returncode != 0:
        tail = "\n".join(stderr.splitlines()[-15:])
        return {"error": error or f"driver exited {proc.returncode}", "stderr_tail": tail}
    if calls is not None:
        polls = Counter(result.get("poll_commands", {}))
        result["server"] = _server_view(calls, polls, int(result["jobs"]), system, fcall)
    return result


def _server_view(
    calls: Counter[str],
    polls: Counter[str],
    jobs: int,
    system: str,
    fcall: dict[str, int] | None = None,
) -> dict[str, Any]:
    """Commands per job, without the benchmark's own progress polls."""
    calls = calls.copy()
    calls.subtract(polls)
    calls = +calls
    total = sum(calls.values())
    out: dict[str, Any] = {
        "commands": total,
        "commands_per_job": total / jobs,
        "by_command": dict(calls.most_common()),
    }
    if system == "fairlane":
        # the commands Fairlane's Lua never runs were each sent by a client
        sent = sum(n for name, n in calls.items() if name not in IN_FAIRLANE_SCRIPTS)
        out["client_calls"] = sent
        out["client_calls_per_job"] = sent / jobs
    if fcall is not None:
        # the server's time in Fairlane's functions, the commands they run included
        out["fcall_usec"] = fcall["usec"]
        out["fcall_usec_per_job"] = fcall["usec"] / jobs
        out["fcall_calls_per_job"] = fcall["calls"] / jobs
    return out


async def _run_profile(cfg: Config, ns: str) -> dict[str, Any]:
    """The ``profile`` scenario, run from here: it reads the server's log as it goes."""
    try:
        async with asyncio.timeout(cfg.timeout):
            return await serverprofile.run(
                cfg.url, ns, jobs=cfg.jobs, batch=cfg.batch, concurrency=cfg.concurrency,
                timeout=cfg.timeout,
            )  # fmt: skip
    except Exception as exc:  # a failed scenario is reported, as a driver's is
        return {"error": f"{type(exc).__name__}: {exc}"}


async def _run_keyed(cfg: Config, ns: str, rep: int) -> dict[str, Any]:
    """The ``keyed`` scenario, run from here as ``profile`` is; the ways take turns going
    first, one repetition to the next."""
    try:
        async with asyncio.timeout(cfg.timeout):
            return await keyed.run(
                cfg.url, ns, jobs=cfg.jobs, batch=cfg.batch, concurrency=cfg.concurrency,
                fairness_keys=cfg.keyed_fairness_keys, first=keyed.WAYS[rep % 2],
                timeout=cfg.timeout,
            )  # fmt: skip
    except Exception as exc:  # a failed scenario is reported, as a driver's is
        return {"error": f"{type(exc).__name__}: {exc}"}


async def _run_limit(cfg: Config, ns: str, mode: str) -> dict[str, Any]:
    """One mode of the yardstick, in a process of its own with the suite's interpreter
    (and so uvloop and hiredis where this environment has them): nothing else runs in
    it while it drains."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.yardstick", "--redis-url", cfg.url, "--mode", mode,
        "--ns", ns, "--jobs", str(cfg.jobs), "--concurrency", str(cfg.concurrency),
        "--tenants", str(cfg.limit_tenants),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
    )  # fmt: skip
    try:
        async with asyncio.timeout(cfg.timeout):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"error": f"no result within {cfg.timeout:.0f}s"}
    lines = out.decode().splitlines()
    if proc.returncode != 0 or not lines:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-15:])
        return {"error": f"yardstick exited {proc.returncode}", "stderr_tail": tail}
    figures: dict[str, Any] = json.loads(lines[-1])
    return figures


def _file_limit(reps: list[dict[str, Any]], rep: int, mode: str, figures: dict[str, Any]) -> None:
    """File one mode's figures in its repetition's entry, which holds both modes (a
    failed mode marks the whole entry failed: its ratios would lack a term)."""
    entry = next((e for e in reps if e["rep"] == rep), None)
    if entry is None:
        entry = {"rep": rep}
        reps.append(entry)
    entry[mode] = figures
    if "error" in figures:
        entry.setdefault("error", f"yardstick {mode}: {figures['error']}")


def _limit_ratios(own: dict[str, list[dict[str, Any]]]) -> None:
    """Fairlane's throughput over each limit, within each repetition that measured both
    (their median is the summary's ratio)."""
    ours = {r["rep"]: r["jobs_per_s"] for r in _good(own.get("throughput", []))}
    for entry in _good(own.get("limit", [])):
        if entry["rep"] in ours:
            entry["ratios"] = {
                f"fairlane_over_{mode}": ours[entry["rep"]] / entry[mode]["jobs_per_s"]
                for mode in LIMIT_MODES
            }


async def _versions(python: str, system: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        python,
        str(SYSTEMS[system].driver_path),
        "versions",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == "versions":
                return {"python": event.get("python"), **event["versions"]}
    return {}


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
        "machine": platform.machine(),
        "processor": _cpu_model(),
        "cpus": os.cpu_count(),
        "load_at_start": _load(),
        "config": cfg.as_dict(),
        "peers_dir": str(peers_dir(cfg.peers_dir)),
    }


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _load() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def plan(cfg: Config, rng: random.Random) -> Iterator[tuple[int, str, str]]:
    """(rep, scenario, system) in run order: systems shuffled afresh for each scenario.

    The ``limit`` scenario runs the yardstick's modes in place of systems; when
    ``throughput`` runs too, they are shuffled in among its systems, so that each
    repetition's ratio of Fairlane to the limit compares runs taken side by side.
    """
    joined = {"throughput", "limit"} <= set(cfg.scenarios)
    for rep in range(cfg.reps):
        for scenario in cfg.scenarios:
            if scenario == "limit" and joined:
                continue
            steps = [(scenario, s) for s in _units(cfg, scenario)]
            if scenario == "throughput" and joined:
                steps += [("limit", mode) for mode in LIMIT_MODES]
            rng.shuffle(steps)
            for name, unit in steps:
                yield rep, name, unit


def _units(cfg: Config, scenario: str) -> tuple[str, ...]:
    if scenario == "limit":
        return LIMIT_MODES
    return cfg.systems if scenario in SHARED else ("fairlane",)


async def run_suite(cfg: Config, progress: Progress | None = None) -> dict[str, Any]:
    """Run every scenario of ``cfg``, ``cfg.reps`` times, and return the figures."""
    say = progress or (lambda _: None)
    pythons: dict[str, str] = {}
    for system in cfg.systems:
        own = cfg.fairlane_env == "own"
        python = await asyncio.to_thread(ensure, system, cfg.peers_dir, say, own=own)
        pythons[system] = str(python)
    meter = Meter(cfg.url)
    rng = random.Random(cfg.seed)
    params = cfg.params()
    try:
        result: dict[str, Any] = {"meta": await _meta(cfg, meter)}
        result["meta"]["versions"] = {s: await _versions(pythons[s], s) for s in cfg.systems}
        raw: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in cfg.systems}
        order: list[str] = []
        steps = list(plan(cfg, rng))
        for i, (rep, scenario, system) in enumerate(steps, 1):
            limit = scenario == "limit"
            who = f"yardstick, {limit_title(cfg, system)}" if limit else cfg.label(system)
            say(f"[{i}/{len(steps)}] rep {rep + 1}/{cfg.reps}, {scenario}: {who}")
            ns = f"bench{cfg.run_id}_" + (
                f"yardstick{rep}" if limit else f"{system}_{scenario[:4]}{rep}"
            )
            if limit:
                figures = await _run_limit(cfg, ns, system)
            elif scenario == "profile":
                figures = await _run_profile(cfg, ns)
            elif scenario == "keyed":
                figures = await _run_keyed(cfg, ns, rep)
            else:
                figures = await _run_driver(
                    pythons[system],
                    system,
                    scenario,
                    {**params, "ns": ns},
                    meter=meter,
                    timeout=cfg.timeout,
                )
            with meter.own():
                await delete_matching(meter.client, f"*{ns}*")  # left by a failed run
            if limit:
                _file_limit(raw["fairlane"].setdefault("limit", []), rep, system, figures)
            else:
                figures["rep"] = rep
                raw[system].setdefault(scenario, []).append(figures)
            order.append(f"{rep}:{scenario}:{system}")
            if "error" in figures:
                say(f"  {who} {scenario} failed: {figures['error']}")
        _limit_ratios(raw["fairlane"])
        result["meta"]["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
        result["meta"]["load_at_end"] = _load()
        result["meta"]["order"] = order
    finally:
        await meter.aclose()
    result["raw"] = raw
    result["medians"] = {
        system: {sc: median_tree(_good(reps)) for sc, reps in scenarios.items() if _good(reps)}
        for system, scenarios in raw.items()
    }
    result["summary"] = summary(result, cfg)
    result["warnings"] = [
        f"{cfg.label(system)} {scenario} rep {r['rep'] + 1}: {r['error']}"
        for system, scenarios in raw.items()
        for scenario, reps in scenarios.items()
        for r in reps
        if "error" in r
    ]
    result["warnings"] += [
        f"Fairlane profile rep {r['rep'] + 1}: the SLOWLOG lost {r['lost_entries']} entries "
        "or disagrees with INFO commandstats on FCALL; its table is incomplete"
        for r in _good(raw.get("fairlane", {}).get("profile", []))
        if r.get("lost_entries") or not r.get("check", True)
    ]
    result["markdown"] = markdown(result, cfg)
    return result


# -- markdown ------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    if value is None:
        return "-"
    size = abs(value)
    if size >= 1000:
        return f"{value:,.0f}"
    if size >= 100:
        return f"{value:.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if size >= 0.1 or size == 0 else f"{value:.3f}"


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.3g}x"


ARROWS = {"higher": "\u2191", "lower": "\u2193"}


def markdown(result: dict[str, Any], cfg: Config) -> str:
    """The summary as two markdown tables (all systems; Fairlane alone) and a legend."""
    meta = result["meta"]
    server = meta.get("server", {})
    versions = meta.get("versions", {})
    lines = [
        f"Run {meta['started']} - {meta.get('finished', '?')}: {cfg.reps} repetition(s), "
        f"medians; {meta.get('cpus')} CPUs ({meta.get('processor')}), "
        f"{meta.get('platform')}, Redis {server.get('redis_version', '?')}, "
        f"Python {meta.get('python')}; load average {meta.get('load_at_start')} at the start.",
        "",
        "Versions: "
        + "; ".join(
            f"{cfg.label(s)}: " + ", ".join(f"{k} {v}" for k, v in versions.get(s, {}).items() if v)
            for s in cfg.systems
        ),
        "",
    ]
    shared = [r for r in result["summary"] if r["shared"]]
    if shared:
        peers = list(cfg.peers)
        head = ["Figure", "Unit", "", "Fairlane", *(cfg.label(p) for p in peers)]
        if peers:
            head += ["Best peer", "Fairlane / best"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in shared:
            cells = [
                row["metric"],
                row["unit"],
                ARROWS.get(row["better"], ""),
                fmt(row["values"]["fairlane"]),
            ]
            for peer in peers:
                value = row["values"].get(peer)
                ratio = row["ratios"].get(peer)
                cells.append(f"{fmt(value)} ({fmt_ratio(ratio)})" if value is not None else "-")
            if peers:
                best = row["best_peer"]
                cells += [cfg.label(best) if best else "-", fmt_ratio(row["vs_best"])]
            lines.append("| " + " | ".join(cells) + " |")
        if peers:
            lines += [
                "",
                "A peer's cell is its median and, in brackets, Fairlane's median divided by "
                "it (Fairlane / peer); the arrow says which way is better (\u2191 higher, "
                "\u2193 lower). The best peer is the one with the best median for that figure.",
            ]
        lines.append("")
    own = [r for r in result["summary"] if not r["shared"]]
    if own:
        lines += ["| Fairlane alone | Unit | | Median | Min - max |", "|---|---|---|---|---|"]
        for row in own:
            low_high = row["spread"].get("fairlane")
            span = f"{fmt(low_high[0])} - {fmt(low_high[1])}" if low_high else "-"
            lines.append(
                f"| {row['metric']} | {row['unit']} | {ARROWS.get(row['better'], '')} | "
                f"{fmt(row['values']['fairlane'])} | {span} |"
            )
        lines.append("")
    lines += serverprofile.markdown_lines(result["medians"].get("fairlane", {}), fmt)
    for warning in result.get("warnings", []):
        lines.append(f"Warning: {warning}")
    return "\n".join(lines).rstrip() + "\n"
