"""Whether a server is fit for Fairlane: the checks ``fairlane doctor`` reports.

Each check is a ``Finding``: OK, WARN or ERROR, the check's name and what was found. A
server is checked for its version (Redis 7.0+ or Valkey 7.2+, for Functions), its
eviction policy (``noeviction``: anything else may delete jobs under memory pressure),
its persistence (what a crash loses), its memory use, the Functions it serves, and, for
an app, its live workers and whether each of its admission pools names a lane the app
uses (a pool on no such lane bounds nothing; the app refuses to connect with one). On
a Redis Cluster every primary is checked as a server of its own (each holds the jobs
of the apps whose slots it serves), a primary that does not answer is an ERROR of its
own, and every slot must be assigned. An app on a cluster is checked for how its
scheduling shards (``App(shards=n)``) fall on the primaries: a primary with none of
them does none of the app's scheduling, and primaries with more shards than others
carry more of it (a WARN, with the shard count to use: as many as the primaries, or a
multiple).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import redis
from redis.exceptions import RedisError, ResponseError

from fairlane.config.pools import FairlaneConfig, unused_pools, unused_pools_message
from fairlane.store.connection import SyncClient
from fairlane.store.keys import AppKeys
from fairlane.store.reads import run_sync
from fairlane.store.views.fleet import live_workers

__all__ = [
    "CLUSTER_WIDE",
    "Finding",
    "Level",
    "check_server",
    "diagnose",
    "diagnose_cluster",
    "pools_finding",
    "shards_finding",
    "workers_finding",
]

Level = Literal["OK", "WARN", "ERROR"]
_MIN_VERSION = (7, 0)
_MEMORY_WARN = 0.9
CLUSTER_WIDE = "cluster"  # the node of findings about a whole cluster
_CLUSTER_SLOTS = 16384


@dataclass(frozen=True)
class Finding:
    """One check's verdict: its level, the check, and what was found."""

    level: Level
    check: str
    detail: str


def _node_name(node: Any) -> str:
    host, port = str(node.host), int(node.port)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def diagnose_cluster(client: redis.RedisCluster) -> list[tuple[str | None, Finding]]:
    """Every primary checked as a server of its own (each holds jobs of the apps whose
    slots it serves), then whether every slot is served. A primary that does not answer
    is an ERROR of its own rather than the end of the report."""
    rows: list[tuple[str | None, Finding]] = []
    states: dict[str, dict[str, str]] = {}
    get_primaries: Any = client.get_primaries  # unannotated in redis-py
    primaries: list[Any] = get_primaries()
    for node in sorted(primaries, key=lambda n: (str(n.host), int(n.port))):
        name = _node_name(node)
        # the cluster client's own client of the node: the URL's login, TLS and timeouts
        direct: redis.Redis = client.get_redis_connection(node)
        try:
            findings = diagnose(direct)
            states[name] = _cluster_info(direct)
        except RedisError as exc:
            findings = [Finding("ERROR", "ping", f"unreachable: {exc}")]
        rows.extend((name, finding) for finding in findings)
    rows.insert(0, (CLUSTER_WIDE, _slots_finding(states, len(primaries))))
    return rows


def _cluster_info(client: redis.Redis) -> dict[str, str]:
    run: Any = client.execute_command
    reply: Any = run("CLUSTER", "INFO")
    if isinstance(reply, dict):
        return {str(k): str(v) for k, v in reply.items()}
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return dict(line.strip().split(":", 1) for line in text.splitlines() if ":" in line)


def _slots_finding(states: dict[str, dict[str, str]], primaries: int) -> Finding:
    if not states:
        return Finding("ERROR", "slots", "no primary answered CLUSTER INFO")
    faults = []
    for name, info in states.items():
        state = info.get("cluster_state", "?")
        assigned = info.get("cluster_slots_assigned", "?")
        if state != "ok" or assigned != str(_CLUSTER_SLOTS):
            faults.append(f"{name} reports cluster_state {state}, {assigned} slots assigned")
    if faults:
        return Finding(
            "ERROR",
            "slots",
            "; ".join(faults) + ": jobs in uncovered slots cannot be enqueued or fetched",
        )
    return Finding(
        "OK",
        "slots",
        f"all {_CLUSTER_SLOTS} slots assigned, cluster_state ok ({primaries} primaries)",
    )


def diagnose(client: SyncClient) -> list[Finding]:
    started = time.perf_counter()
    client.ping()
    rtt = (time.perf_counter() - started) * 1000
    info: dict[str, Any] = {}
    for section in ("server", "memory", "persistence"):
        info.update(client.info(section))
    return [
        Finding("OK", "ping", f"{rtt:.1f} ms"),
        _version_finding(info),
        _policy_finding(client, info),
        _persistence_finding(client, info),
        _memory_finding(info),
        _functions_finding(client),
    ]


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _version_finding(info: dict[str, Any]) -> Finding:
    redis_version = str(info.get("redis_version", "?"))
    valkey = info.get("valkey_version")
    name = (
        f"Valkey {valkey} (redis_version {redis_version})" if valkey else f"Redis {redis_version}"
    )
    if valkey is None and _version_tuple(redis_version) < _MIN_VERSION:
        return Finding("ERROR", "version", f"{name}: Fairlane needs Redis 7.0+ or Valkey 7.2+")
    return Finding("OK", "version", name)


def _config(client: SyncClient, name: str) -> str | None:
    """A CONFIG GET value, or None where CONFIG is disabled (as on some managed services)."""
    try:
        reply: dict[Any, Any] = client.config_get(name)
    except ResponseError:
        return None
    value: Any = reply.get(name, reply.get(name.encode()))
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def _policy_finding(client: SyncClient, info: dict[str, Any]) -> Finding:
    policy = info.get("maxmemory_policy") or _config(client, "maxmemory-policy")
    if policy is None:
        return Finding("WARN", "maxmemory-policy", "unknown (neither INFO nor CONFIG reports it)")
    if policy != "noeviction":
        return Finding(
            "ERROR",
            "maxmemory-policy",
            f"{policy}: the server may evict job records and queues under memory pressure; "
            "set maxmemory-policy noeviction",
        )
    return Finding("OK", "maxmemory-policy", "noeviction (writes fail instead of losing jobs)")


def _persistence_finding(client: SyncClient, info: dict[str, Any]) -> Finding:
    appendonly = _config(client, "appendonly")
    aof = appendonly == "yes" if appendonly is not None else bool(info.get("aof_enabled"))
    fsync = _config(client, "appendfsync")
    save = _config(client, "save")
    parts = [f"appendonly {'yes' if aof else 'no'}"]
    if fsync is not None:
        parts.append(f"appendfsync {fsync}")
    if save is not None:
        parts.append(f"save {save!r}")
    described = ", ".join(parts)
    if aof and fsync in ("always", "everysec"):
        loss = "none" if fsync == "always" else "about 1s of writes"
        return Finding("OK", "persistence", f"{described}: a crash loses {loss}")
    if aof:
        return Finding(
            "WARN",
            "persistence",
            f"{described}: fsync is left to the OS; a crash can lose ~30s of jobs",
        )
    if save:
        return Finding(
            "WARN",
            "persistence",
            f"{described}: snapshots only; a crash loses jobs since the last one",
        )
    return Finding("WARN", "persistence", f"{described}: no persistence; a restart loses every job")


def _memory_finding(info: dict[str, Any]) -> Finding:
    limit = int(info.get("maxmemory", 0) or 0)
    used = int(info.get("used_memory", 0) or 0)
    used_h = info.get("used_memory_human", f"{used}B")
    if limit == 0:
        return Finding("OK", "maxmemory", f"no limit (using {used_h})")
    share = used / limit
    level: Level = "WARN" if share >= _MEMORY_WARN else "OK"
    return Finding(
        level, "maxmemory", f"{info.get('maxmemory_human', limit)} ({share:.0%} used, {used_h})"
    )


def _functions_finding(client: SyncClient) -> Finding:
    try:
        libraries = client.function_list()
    except ResponseError as exc:
        return Finding("ERROR", "functions", f"FUNCTION LIST failed: {exc}")
    names = []
    for library in libraries:
        fields = library if isinstance(library, dict) else _pairs(library)
        raw = fields.get(b"library_name", fields.get("library_name", b""))
        names.append(raw.decode() if isinstance(raw, bytes) else str(raw))
    ours = sorted(name for name in names if name.startswith("fairlane_"))
    if ours:
        loaded = f"Fairlane library loaded: {', '.join(ours)}"
    else:
        loaded = "no Fairlane library loaded yet (loaded on first connect)"
    count = f"{len(names)} librar{'y' if len(names) == 1 else 'ies'}"
    return Finding("OK", "functions", f"available ({count}; {loaded})")


def _pairs(flat: list[Any]) -> dict[Any, Any]:
    return dict(zip(flat[::2], flat[1::2], strict=False))


def workers_finding(client: SyncClient, app_name: str, max_age: float, shards: int) -> Finding:
    """Whether the app has a live worker (every worker beats in the home shard)."""
    keys = AppKeys.for_shard(app_name, 0, shards)
    workers = run_sync(client, live_workers(keys, max_age))
    if not workers:
        return Finding("WARN", "workers", f"no live worker of app {app_name!r}")
    return Finding("OK", "workers", f"{len(workers)} live worker(s) of app {app_name!r}")


def pools_finding(config: FairlaneConfig, lanes_used: Sequence[str]) -> Finding:
    """Whether each admission pool names a lane in ``lanes_used`` (the lanes of the
    app's tasks and its default lane)."""
    lanes = ", ".join(sorted(set(lanes_used)))
    if not config.pools:
        return Finding("OK", "pools", f"no admission pool: lane(s) {lanes} have the default bounds")
    unused = unused_pools(config, lanes_used)
    if unused:
        return Finding("ERROR", "pools", unused_pools_message(unused, lanes_used))
    named = ", ".join(sorted(config.pools))
    return Finding("OK", "pools", f"pool(s) {named} on lanes the app uses ({lanes})")


def shards_finding(client: redis.RedisCluster, app_name: str, shards: int) -> Finding:
    """How the app's shards fall on the cluster's primaries (by the slot of each
    shard's keys): a WARN when some primary holds none or the counts are uneven."""
    # unannotated in redis-py
    get_primaries: Any = client.get_primaries
    node_of: Any = client.get_node_from_key
    primaries = sorted(_node_name(n) for n in get_primaries())
    held = dict.fromkeys(primaries, 0)
    for shard in range(shards):
        node = _node_name(node_of(AppKeys.for_shard(app_name, shard, shards).stats))
        held[node] = held.get(node, 0) + 1
    spread = ", ".join(f"{name} {n}" for name, n in held.items())
    where = f"app {app_name!r}: {shards} shard(s) on {len(primaries)} primaries ({spread})"
    advice = (
        f"when one primary's CPU is the limit, give the app shards={len(primaries)} (as many "
        "as primaries) or a multiple of it, the same in every process of the app"
    )
    idle = [name for name, n in held.items() if n == 0]
    if idle:
        return Finding(
            "WARN",
            "shards",
            f"{where}: {len(idle)} primar{'y does' if len(idle) == 1 else 'ies do'} none of "
            f"its scheduling; {advice}",
        )
    if max(held.values()) != min(held.values()):
        return Finding(
            "WARN",
            "shards",
            f"{where}: uneven, the primaries with more shards carry more of its scheduling; "
            f"{advice}",
        )
    return Finding("OK", "shards", f"{where}: even")


def check_server(
    client: SyncClient,
    app: str | None = None,
    *,
    max_age: float = 0.0,
    shards: int = 1,
    app_findings: Sequence[Finding] = (),
) -> list[tuple[str | None, Finding]]:
    """Every finding, each with the node it is about: None on a single server,
    ``CLUSTER_WIDE`` for one about a whole cluster. With ``app``, whether it has a
    worker whose heartbeat is younger than ``max_age`` s, and ``app_findings`` (checks
    of its declarations, such as ``pools_finding``)."""
    wide: str | None = None
    if isinstance(client, redis.RedisCluster):
        rows, wide = diagnose_cluster(client), CLUSTER_WIDE
    else:
        rows = [(None, finding) for finding in diagnose(client)]
    if app is not None:
        rows.append((wide, workers_finding(client, app, max_age, shards)))
        if isinstance(client, redis.RedisCluster):
            rows.append((wide, shards_finding(client, app, shards)))
    rows.extend((wide, finding) for finding in app_findings)
    return rows
