"""Global keys: each key shared by the shards of an app of many shards, and each shard's
part of it, as the balancer left them (``fairlane.policy.globalkeys`` states the rule).

A shard's side lives in its ``thr`` hash and its ``gkeys`` zset (``store/keys.py``):
``gs`` the app's shard count once its workers made the keys global (absent: every key is
local, as on one shard), ``gf:<key>`` the part in force (absent: none yet), beside the
throttle fields every key has (``l:`` its limit, ``u:`` slots in use, ``o:`` offers).
``gkeys`` lists the global keys the shard has used. The jobs waiting on a key are its
members in ``thr:wait``; the weight of its waiting tenants is summed over the first
``WEIGHT_SAMPLE`` of ``thr:s:<key>`` and scaled up to all of them, as the balancer's
report does (``store/lua/globalkeys.lua``), so what is shown is what the balancer reads.

These reads only read: unlike the balancer's report they neither raise a shard's epoch
nor drop an idle key from ``gkeys``. Two round trips: the shards' fields, then the
waiting tenants' weights (only when some tenant waits).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fairlane.policy.globalkeys import is_tenant_key, slots_of
from fairlane.policy.ratekeys import UNLIMITED
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Cmd, Plan, cmd

__all__ = [
    "WEIGHT_SAMPLE",
    "GlobalKeyView",
    "GlobalKeys",
    "JobGlobalKeys",
    "ShardPart",
    "global_keys",
    "job_global_keys",
]

#: waiting tenants whose weights are read per key and shard (as the balancer's report)
WEIGHT_SAMPLE: Final = 100


@dataclass(frozen=True, slots=True)
class ShardPart:
    """One shard's side of a global key."""

    shard: int
    part: float  # its part in force, 0 when it has none
    slots: int | None  # the slots its part gives (None: a key of rates only)
    used: int  # slots held by running jobs and offered to woken ones
    waiting: int  # jobs parked on the key here
    weight: float  # the weights of the tenants waiting here (sampled)

    @property
    def held(self) -> int | None:
        """The slots the shard holds: its part's, or more while more run (the policy's
        ``held``, in slots)."""
        return None if self.slots is None else max(self.slots, self.used)


@dataclass(frozen=True, slots=True)
class GlobalKeyView:
    """A global key over the app's shards: its limit (None: a key of rates only) and
    each shard's part, in shard order."""

    key: str
    limit: int | None
    parts: tuple[ShardPart, ...]

    @property
    def shards(self) -> int:
        return len(self.parts)

    @property
    def used(self) -> int:
        return sum(p.used for p in self.parts)

    @property
    def waiting(self) -> int:
        return sum(p.waiting for p in self.parts)


@dataclass(frozen=True, slots=True)
class GlobalKeys:
    """The global keys read; ``known``: how many keys the shards list, the keys read
    unless some shard lists more than the read's limit (then the most one shard lists, a
    lower bound)."""

    enabled: bool = False
    keys: list[GlobalKeyView] = field(default_factory=list)
    known: int = 0


@dataclass(frozen=True, slots=True)
class JobGlobalKeys:
    """The global keys a job names, seen from its shard (``shard``)."""

    shard: int = 0
    keys: dict[str, GlobalKeyView] = field(default_factory=dict)


def _waiters_range(key: str) -> tuple[str, str]:
    # members are '<key>\0<tenant>\0...': every member of one key, none of another
    return f"[{key}\0", f"({key}\1"


def _shard_reads(k: AppKeys, key: str) -> list[Cmd]:
    low, high = _waiters_range(key)
    tags = k.throttle_tags(key, "s")
    return [
        cmd("hmget", k.throttles, f"l:{key}", f"u:{key}", f"o:{key}", f"gf:{key}"),
        cmd("zlexcount", k.throttle_waiters, low, high),
        cmd("zrange", tags, 0, WEIGHT_SAMPLE - 1),
        cmd("zcard", tags),
    ]


_READS: Final = 4


def _float(raw: Any) -> float:
    try:
        return float(field_text(raw)) if raw is not None else 0.0
    except ValueError:
        return 0.0


def _views(keys: Sequence[AppKeys], names: Sequence[str]) -> Plan[list[GlobalKeyView]]:
    """The views of ``names`` over every shard (names known to be global)."""
    where = [(shard, key) for key in names for shard in range(len(keys))]
    reply = yield [c for shard, key in where for c in _shard_reads(keys[shard], key)]
    rows = [reply[_READS * i : _READS * i + _READS] for i in range(len(where))]
    sampled = [[field_text(t) for t in row[2]] for row in rows]
    weights = yield [
        cmd("hmget", keys[shard].weights, tenants)
        for (shard, _), tenants in zip(where, sampled, strict=True)
        if tenants
    ]
    got = iter(weights)
    out: dict[str, list[tuple[ShardPart, int | None]]] = {key: [] for key in names}
    for (shard, key), row, tenants in zip(where, rows, sampled, strict=True):
        (limit_raw, used, offered, part_raw), waiting, _, count = row
        weight = 0.0
        if tenants:
            total = sum(_float(w) if w is not None else 1.0 for w in next(got))
            weight = total * int(count) / len(tenants)
        limit = field_int(limit_raw)
        limit = None if limit is None or limit >= UNLIMITED or limit <= 0 else limit
        part = _float(part_raw)
        slots = None if limit is None else slots_of(part, limit)
        in_use = (field_int(used) or 0) + (field_int(offered) or 0)
        out[key].append((ShardPart(shard, part, slots, in_use, int(waiting), weight), limit))
    views = []
    for key in names:
        limits = [limit for _, limit in out[key] if limit is not None]
        limit = max(limits) if limits else None
        parts = tuple(p if limit is None else _with_limit(p, limit) for p, _ in out[key])
        views.append(GlobalKeyView(key, limit, parts))
    return views


def _with_limit(part: ShardPart, limit: int) -> ShardPart:
    """A shard's side counted against the key's limit (a shard that has not run a job
    of the key yet has not recorded it)."""
    if part.slots is not None:
        return part
    return ShardPart(
        part.shard, part.part, slots_of(part.part, limit), part.used, part.waiting, part.weight
    )


def _enabled(replies: Iterable[Any]) -> bool:
    return any(field_int(r) for r in replies)


def global_keys(keys: Sequence[AppKeys], limit: int) -> Plan[GlobalKeys]:
    """Every global key some shard lists (at most ``limit`` per shard), sorted by key;
    nothing for an app whose keys are not global (one shard, or no worker made them so)."""
    reply = yield [
        c
        for k in keys
        for c in (
            cmd("hget", k.throttles, "gs"),
            cmd("zrange", k.global_keys, 0, limit - 1),
            cmd("zcard", k.global_keys),
        )
    ]
    if not _enabled(reply[0::3]):
        return GlobalKeys()
    names = sorted({field_text(n) for listed in reply[1::3] for n in listed})
    names = [n for n in names if not is_tenant_key(n)]
    views = (yield from _views(keys, names)) if names else []
    return GlobalKeys(True, views, max(len(names), *(int(n) for n in reply[2::3])))


def job_global_keys(
    keys: Sequence[AppKeys], shard: int, names: Iterable[str]
) -> Plan[JobGlobalKeys]:
    """The keys among ``names`` (a job's throttle and rate keys) that are global in its
    app, with each shard's part; ``shard``: the job's."""
    wanted = sorted({n for n in names if n and not is_tenant_key(n)})
    if len(keys) < 2 or not wanted:
        return JobGlobalKeys(shard)
    reply = yield [cmd("hget", k.throttles, "gs") for k in keys]
    if not _enabled(reply):
        return JobGlobalKeys(shard)
    views = yield from _views(keys, wanted)
    return JobGlobalKeys(shard, {v.key: v for v in views})
