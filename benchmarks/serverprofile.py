"""Server time per entry point: what each function of Fairlane's Lua library costs Redis.

The ``profile`` scenario runs the throughput shape once more (``jobs`` no-op jobs enqueued
with ``enqueue_many`` in batches of ``batch``, then one worker process of
``benchmarks.fairlane_worker`` at ``concurrency`` draining them) with the server's
``SLOWLOG`` logging every command (``slowlog-log-slower-than 0``). Each ``FCALL`` entry
gives one call's server time; the commands a function runs are logged too, each as it
ends, so they sit just before their ``FCALL`` in the log (consecutive ids: nothing else
runs while a script does; ``SLOWLOG GET`` lists the newest first, so there they follow
it). Redis 7.0 logs them under the address ``?:0`` of its script client: walking the
log in id order, the ``?:0`` entries since the last script call belong to the next one.
Valkey 8 logs them under the caller's address and name instead (a probe script at the
start tells which): there the entries of the ``FCALL``'s own connection just before it,
with no other connection's entry between, are its commands (less those no script runs:
``DIRECT_ONLY``); a command that connection pipelined just before an ``FCALL`` would be
counted as inside it, which Fairlane's hot path never does. Per function (the name
after the ``fl<version>_`` prefix): calls, server microseconds per call and per job,
and the commands run inside it per job. Commands the clients sent themselves are
summed apart (``direct``).

The log is drained as the run goes (``SLOWLOG GET -1`` and ``SLOWLOG RESET`` in one
``MULTI``, so no entry falls between the two), which keeps its memory bounded; the ids
tell whether any entry was lost all the same (``lost_entries``). Logging every command
costs server time of its own, so this run's times are higher than the plain throughput
run's; the headline "FCALL us/job" comes from that run (``INFO commandstats``), and this
table says where the time goes. The run's ``INFO commandstats`` is read too: its FCALL
calls and microseconds must equal the log's (``check``). The server's slowlog settings
are put back afterwards; the entries it held before the run are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from benchmarks.common import WorkerProcess, command_name, delete_matching, wait_until
from benchmarks.fairlane_worker import make_app
from fairlane.store.keys import AppKeys

WORKER = "benchmarks.fairlane_worker"
#: the address SLOWLOG gives a command that a script ran
SCRIPT_CLIENT = "?:0"
#: the profiling connection's name: its own commands are left out of the figures
METER_NAME = "fairlane-bench-profile"
SETTINGS = ("slowlog-log-slower-than", "slowlog-max-len")
PROBE_KEY = "fairlane-bench-profile-probe"  # read by one script, never written
#: entries the log may hold between two drains (a drain every DRAIN_EVERY seconds)
MAX_LEN = 1_000_000
DRAIN_EVERY = 0.2
_FUNCTION = re.compile(r"^fl[0-9a-f]+_")
_CALLS = frozenset({"fcall", "fcall_ro"})
_SCRIPTS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro"})
#: commands a script cannot run (or Fairlane's never does): always sent by a client
DIRECT_ONLY = frozenset(
    {
        "hello", "auth", "select", "ping", "quit", "reset", "multi", "exec", "discard",
        "watch", "unwatch", "subscribe", "psubscribe", "ssubscribe", "unsubscribe",
        "punsubscribe", "sunsubscribe", "blpop", "brpop", "blmove", "brpoplpush", "blmpop",
        "bzpopmin", "bzpopmax", "bzmpop", "xread", "xreadgroup", "wait", "waitaof",
        "client|setinfo", "client|setname", "client|id", "client|tracking", "function|load",
        "function|list", "function|delete", "script|load", "info", "slowlog|get",
    }
)  # fmt: skip
#: how the suite formats a number (``benchmarks.core.fmt``)
Fmt = Callable[[float | None], str]


@dataclass(frozen=True, slots=True)
class Entry:
    """One SLOWLOG entry: its id, duration (us), command name, arguments, client."""

    id: int
    usec: int
    command: str
    args: tuple[bytes, ...]
    client: str
    name: str

    @property
    def inner(self) -> bool:
        return self.client == SCRIPT_CLIENT

    @property
    def caller(self) -> tuple[str, str]:
        return self.client, self.name


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def parse_entry(raw: Sequence[Any]) -> Entry:
    """An entry of ``SLOWLOG GET``'s raw reply: ``[id, time, usec, args, addr, name]``."""
    args = tuple(a if isinstance(a, bytes) else str(a).encode() for a in raw[3])
    return Entry(
        id=int(raw[0]),
        usec=int(raw[2]),
        command=command_name(args),
        args=args,
        client=_text(raw[4]) if len(raw) > 4 else "",
        name=_text(raw[5]) if len(raw) > 5 else "",
    )


def function_name(entry: Entry) -> str:
    """The library function an ``FCALL`` entry called, without its version prefix."""
    called = _text(entry.args[1]) if len(entry.args) > 1 else "?"
    return _FUNCTION.sub("", called)


@dataclass(slots=True)
class Cost:
    """What one entry point (or one directly sent command) cost over a run."""

    calls: int = 0
    usec: int = 0
    inner: Counter[str] = field(default_factory=Counter)
    inner_usec: int = 0


@dataclass(slots=True)
class Attribution:
    """A run's SLOWLOG entries summed per entry point; ``direct``: sent by clients."""

    functions: dict[str, Cost] = field(default_factory=dict)
    direct: dict[str, Cost] = field(default_factory=dict)
    entries: int = 0
    first_id: int | None = None
    last_id: int | None = None
    #: script commands with no script entry after them in the log (the run cut mid-way)
    orphans: int = 0
    #: ids the drains themselves drop: each ``SLOWLOG GET``'s own entry, logged just
    #: before the ``RESET`` in its ``MULTI`` empties the log
    dropped: set[int] = field(default_factory=set)
    #: the calls of functions and scripts by command (``fcall``, ``fcall_ro``, ``evalsha``)
    script_calls: Counter[str] = field(default_factory=Counter)
    #: the server logs a script's commands under its caller's address, not ``?:0``
    by_caller: bool = False

    def add(self, entries: Iterable[Entry]) -> None:
        """Take in entries in id order (a drain's, oldest first; drains in order)."""
        pending: list[Entry] = []  # logged by the script client: inside the next script
        held: list[Entry] = []  # logged by a caller (``by_caller``): maybe inside its next
        for entry in sorted(entries, key=lambda e: e.id):
            self.entries += 1
            if self.first_id is None:
                self.first_id = entry.id
            self.last_id = entry.id
            if entry.inner:
                pending.append(entry)
                continue
            if entry.command in _CALLS or entry.command in _SCRIPTS:
                ran = [h for h in held if h.caller == entry.caller]
                self._sent([h for h in held if h.caller != entry.caller])
                self._script(entry, pending + ran)
                pending.clear()
                held.clear()
                continue
            if held and held[-1].caller != entry.caller:
                # another connection's command ran between: what was held ran before any
                # script of its own connection began
                self._sent(held)
                held.clear()
            if self.by_caller and entry.name != METER_NAME and entry.command not in DIRECT_ONLY:
                held.append(entry)
            else:
                self._sent([*held, entry])
                held.clear()
        self._sent(held)
        # a drain is atomic between two commands, so a script never spans two drains
        self.orphans += len(pending)

    def _script(self, entry: Entry, ran: list[Entry]) -> None:
        name = function_name(entry) if entry.command in _CALLS else f"({entry.command})"
        cost = self.functions.setdefault(name, Cost())
        self.script_calls[entry.command] += 1
        cost.calls += 1
        cost.usec += entry.usec
        for inner in ran:
            cost.inner[inner.command] += 1
            cost.inner_usec += inner.usec

    def _sent(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.name == METER_NAME:
                continue
            cost = self.direct.setdefault(entry.command, Cost())
            cost.calls += 1
            cost.usec += entry.usec

    def commands(self) -> Counter[str]:
        """Every command of the run by name, as ``INFO commandstats`` counts them: each
        function call, each command run inside one, each sent directly (the profiling
        connection's own left out)."""
        out: Counter[str] = Counter(self.script_calls)
        for cost in self.functions.values():
            out.update(cost.inner)
        for name, cost in self.direct.items():
            out[name] += cost.calls
            out.update(cost.inner)
        return out

    @property
    def lost(self) -> int:
        """Entries missing from the id range seen (the log overflowed between drains)."""
        if self.first_id is None or self.last_id is None:
            return 0
        first, last = self.first_id, self.last_id
        dropped = sum(1 for i in self.dropped if first <= i <= last)
        return last - first + 1 - self.entries - dropped


def figures(attribution: Attribution, jobs: int) -> dict[str, Any]:
    """Per function: calls, us per call and per job, commands inside per job."""
    functions: dict[str, Any] = {}
    ordered = sorted(attribution.functions.items(), key=lambda kv: -kv[1].usec)
    for name, cost in ordered:
        inner = sum(cost.inner.values())
        functions[name] = {
            "calls": cost.calls,
            "usec": cost.usec,
            "usec_per_call": cost.usec / cost.calls,
            "usec_per_job": cost.usec / jobs,
            "inner_commands": inner,
            "inner_per_job": inner / jobs,
            "inner_per_call": inner / cost.calls,
            "inner_usec_per_job": cost.inner_usec / jobs,
            "by_command": {c: n / jobs for c, n in cost.inner.most_common()},
        }
    direct = {
        name: {"calls": c.calls, "usec": c.usec, "usec_per_job": c.usec / jobs}
        for name, c in sorted(attribution.direct.items(), key=lambda kv: -kv[1].usec)
    }
    fcall = [c for n, c in attribution.functions.items() if not n.startswith("(")]
    calls, usec = sum(c.calls for c in fcall), sum(c.usec for c in fcall)
    inner = sum(sum(c.inner.values()) for c in attribution.functions.values())
    inner_usec = sum(c.inner_usec for c in attribution.functions.values())
    return {
        "functions": functions,
        "direct": direct,
        "totals": {
            "fcall_calls": calls,
            "fcall_usec": usec,
            "fcall_usec_per_job": usec / jobs,
            "inner_per_job": inner / jobs,
            "inner_usec_per_job": inner_usec / jobs,
            "direct_calls_per_job": sum(c.calls for c in attribution.direct.values()) / jobs,
            "direct_usec_per_job": sum(c.usec for c in attribution.direct.values()) / jobs,
        },
        "entries": attribution.entries,
        "lost_entries": attribution.lost,
        "orphan_entries": attribution.orphans,
    }


# -- the server's log --------------------------------------------------------------------


class SlowLog:
    """Logging every command on a server for the length of a ``with`` block."""

    def __init__(self, client: aioredis.Redis, attribution: Attribution) -> None:
        self.client = client
        self.attribution = attribution
        self.saved: dict[str, str] = {}

    async def __aenter__(self) -> SlowLog:
        for name in SETTINGS:
            reply = await self.client.config_get(name)
            self.saved[name] = _text(reply[name])
        await self.client.config_set("slowlog-max-len", MAX_LEN)
        await self.client.slowlog_reset()
        await self.client.config_set("slowlog-log-slower-than", 0)
        self.attribution.by_caller = await self._probe()
        return self

    async def _probe(self) -> bool:
        """Whether the server logs a script's commands under the caller's address (Valkey
        8 does) rather than its script client's (Redis 7.0 does): one script tells."""
        await self.client.eval("return redis.call('exists', KEYS[1])", 1, PROBE_KEY)
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command("SLOWLOG", "GET", "-1")
            pipe.execute_command("SLOWLOG", "RESET")
            raw, _ = await pipe.execute()
        inside = [e for e in map(parse_entry, raw) if e.command == "exists"]
        return bool(inside) and not inside[0].inner

    async def drain(self) -> int:
        """Move the log's entries into the attribution; returns how many it held."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command("SLOWLOG", "GET", "-1")
            pipe.execute_command("SLOWLOG", "RESET")
            raw, _ = await pipe.execute()
        entries = [parse_entry(e) for e in raw]
        if entries:
            self.attribution.dropped.add(max(e.id for e in entries) + 1)
        self.attribution.add(entries)
        return len(entries)

    async def __aexit__(self, *exc: object) -> None:
        # the logging stops before the last drain, which then sees every entry
        await self.client.config_set(
            "slowlog-log-slower-than", self.saved["slowlog-log-slower-than"]
        )
        with contextlib.suppress(Exception):
            await self.drain()
        await self.client.config_set("slowlog-max-len", self.saved["slowlog-max-len"])
        await self.client.slowlog_reset()


async def _drain_every(log: SlowLog, seconds: float, stop: asyncio.Event) -> None:
    # stopped by the event, never cancelled: a drain cut short after the server ran it
    # would lose the entries it took out of the log
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
        await log.drain()


async def fcall_stats(client: aioredis.Redis) -> dict[str, int]:
    """``FCALL``'s calls and microseconds in ``INFO commandstats`` (since the last reset)."""
    raw = await client.info("commandstats")
    stat = raw.get("cmdstat_fcall", {})
    return {"calls": int(stat.get("calls", 0)), "usec": int(stat.get("usec", 0))}


# -- the scenario ------------------------------------------------------------------------


async def run(
    url: str,
    ns: str,
    *,
    jobs: int,
    batch: int,
    concurrency: int,
    timeout: float = 600.0,
    drain_every: float = DRAIN_EVERY,
) -> dict[str, Any]:
    """The throughput shape under a full SLOWLOG: the cost of each entry point."""
    meter = aioredis.Redis.from_url(url, client_name=METER_NAME)
    bench = make_app(ns, url)
    keys = AppKeys.for_app(ns)
    attribution = Attribution()
    try:
        async with SlowLog(meter, attribution) as log:
            await meter.config_resetstat()  # after the log's own probe script
            stop = asyncio.Event()
            drainer = asyncio.ensure_future(_drain_every(log, drain_every, stop))
            try:
                started = time.perf_counter()
                async with bench.app:
                    for start in range(0, jobs, batch):
                        await bench.noop.enqueue_many(
                            [(i,) for i in range(start, min(jobs, start + batch))]
                        )
                enqueue_s = time.perf_counter() - started
                worker = WorkerProcess(
                    WORKER, ["--url", url, "--app", ns, "--concurrency", str(concurrency)]
                )
                try:
                    ready = await worker.start()

                    async def drained() -> bool:
                        done = await meter.hget(keys.stats, "completed")
                        return int(done or 0) >= jobs

                    done = await wait_until(drained, timeout=timeout)
                    await worker.stop()
                finally:
                    await worker.close()
            finally:
                stop.set()
                await drainer
        stats = await fcall_stats(meter)
    finally:
        with contextlib.suppress(Exception):
            await delete_matching(meter, f"{keys.prefix}*")
        await meter.aclose()
    out = figures(attribution, jobs)
    totals = out["totals"]
    out.update(
        jobs=jobs,
        batch=batch,
        concurrency=concurrency,
        enqueue_seconds=enqueue_s,
        drain_seconds=done - ready,
        jobs_per_s_under_slowlog=jobs / (done - ready),
        commandstats_fcall=stats,
        # the log and the server's own statistics agree on every FCALL: none missed
        check=stats == {"calls": totals["fcall_calls"], "usec": totals["fcall_usec"]},
    )
    return out


# -- the table ---------------------------------------------------------------------------

HEADER = (
    "Function",
    "Calls",
    "us/call",
    "us/job",
    "us/job in cmds",
    "Cmds/job inside",
    "Top commands inside, per job",
)


def _count(value: float, fmt: Fmt) -> str:
    """A count as a whole number (a median of an even number of runs may fall between)."""
    return f"{int(value):,}" if float(value).is_integer() else fmt(value)


def table_rows(profile: dict[str, Any], fmt: Fmt) -> list[tuple[str, ...]]:
    """The per-entry-point table's rows (a ``total`` row last), numbers formatted by ``fmt``."""
    rows: list[tuple[str, ...]] = []
    for name, f in profile.get("functions", {}).items():
        top = sorted(f.get("by_command", {}).items(), key=lambda kv: -kv[1])[:3]
        rows.append(
            (
                name,
                _count(f["calls"], fmt),
                fmt(f["usec_per_call"]),
                fmt(f["usec_per_job"]),
                fmt(f["inner_usec_per_job"]),
                fmt(f["inner_per_job"]),
                ", ".join(f"{c} {fmt(n)}" for c, n in top),
            )
        )
    totals = profile.get("totals", {})
    if totals:
        direct = profile.get("direct", {})
        top_direct = list(direct)[:3]
        rows.append(
            (
                "(sent directly)",
                _count(sum(d["calls"] for d in direct.values()), fmt),
                "-",
                fmt(totals["direct_usec_per_job"]),
                "-",
                "-",
                ", ".join(top_direct),
            )
        )
        rows.append(
            (
                "all functions",
                _count(totals["fcall_calls"], fmt),
                fmt(totals["fcall_usec"] / totals["fcall_calls"]) if totals["fcall_calls"] else "-",
                fmt(totals["fcall_usec_per_job"]),
                fmt(totals["inner_usec_per_job"]),
                fmt(totals["inner_per_job"]),
                "",
            )
        )
    return rows


def headline(medians: dict[str, Any], fmt: Fmt) -> str | None:
    """The plain throughput run's figures that the per-entry-point table stands beside
    (``medians``: Fairlane's, by scenario); None without a ``profile`` run."""
    throughput, profile = medians.get("throughput"), medians.get("profile")
    if profile is None:
        return None
    parts = []
    if throughput:
        server = throughput.get("server", {})
        parts.append(
            f"throughput run (no SLOWLOG): {fmt(throughput.get('jobs_per_s'))} jobs/s, "
            f"{fmt(server.get('commands_per_job'))} commands/job, "
            f"{fmt(server.get('fcall_usec_per_job'))} FCALL us/job"
        )
    parts.append(
        f"this table's own run (SLOWLOG on, {int(profile['jobs']):,} jobs): "
        f"{fmt(profile.get('jobs_per_s_under_slowlog'))} jobs/s, "
        f"{fmt(profile['totals']['fcall_usec_per_job'])} FCALL us/job"
    )
    return "; ".join(parts)


def markdown_lines(medians: dict[str, Any], fmt: Fmt) -> list[str]:
    """The per-entry-point table as markdown (medians of the ``profile`` runs), or none."""
    line = headline(medians, fmt)
    if line is None:
        return []
    head = HEADER
    lines = [
        f"Server time per entry point: {line}.",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * (len(head) - 2) + "---|",
    ]
    for row in table_rows(medians["profile"], fmt):
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    return [*lines, ""]
