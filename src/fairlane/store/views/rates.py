"""Rate keys: each key's rate in force, its tokens now, its pause, its adaptive value,
its counters and the jobs waiting for it.

The layout is the contract's (``docs/contracts/rates.md``, "Store layout"), the names
``fairlane.store.keys``': the ``rates`` zset lists every rate key seen (scored by when
its state was written); a key's ``rate:<key>`` hash holds its bucket (``t`` tokens as
of ``s``), its pause (``pu`` until, ``pc`` why), an adaptive value ``a`` and its
counters (``ta`` tokens taken, ``tr`` refunded, ``td`` charged as debt, ``pn``
pushbacks, ``wn`` waiters woken and ``wt`` the ms they waited); the ``thr`` hash holds
what is in force while a job references the key (``rp:<key>`` its rate, ``ad:<key>`` an
adaptive key's bounds); ``ratedue`` says when a key blocked by its rate wakes its
waiters, who wait in the throttle keys' ``thr:wait`` zset like any throttle key's.

The tokens shown are the level on the server's clock (``fairlane.policy.rates.level``,
read with ``TIME`` on the shard's node), not the stored ``t``: a bucket is written only
when something takes from it, and refills in between. A key in force with no state
left (its hash expired once full) is a fresh key: full.

Two round trips, the second only when some key is listed: the ``rates`` zsets (the
``limit`` keys with the highest scores, per shard) with the shards' clocks (and, for
the dashboard, the keys in force with no state yet); then, per
key listed, its hash, its in-force fields, its due time and its waiters (a count and
the first ``head``). The index is the read models' to trim (the scripts add a key when
they create its state): an entry whose hash is gone while nothing references the key
(no rate in force, no waiter, not due) is removed in a third round trip, each removal
followed by a look at whether the state exists again -- created by a script between the
read and the removal -- which puts such an entry back (a fourth, rarely): a key never
drops out of the index while it has state.

Over shards, a key's counters, tokens and waiters are summed over those that hold it,
its pause is the latest, its due the earliest, its adaptive value the smallest.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from fairlane.policy.ratekeys import UNLIMITED
from fairlane.policy.rates import Adaptive, Bucket, Rate, adaptive_limit, due_at, level
from fairlane.store.fields import field_int, field_text
from fairlane.store.keys import AppKeys
from fairlane.store.reads import Plan, cmd, scan_fields, server_time

__all__ = [
    "RATE_FIELDS",
    "UNLIMITED",
    "JobRates",
    "RateKeyView",
    "RateKeys",
    "decode_job_rates",
    "job_rates",
    "parse_adaptive",
    "parse_rate",
    "rate_keys",
]

# fields of the ``thr`` hash (``fairlane.store.keys``) holding what is in force
_RATE_FIELD: Final = "rp:"
_ADAPTIVE_FIELD: Final = "ad:"

# UNLIMITED (re-exported): the concurrency limit in force of a key named only as a rate
# key, the policy's number, which the library also writes into the scripts

#: The fields of a ``rate:<key>`` hash and what each holds.
RATE_FIELDS: Final[Mapping[str, str]] = {
    "t": "tokens as of s (negative: a debt)",
    "s": "stamp of t, server ms",
    "pu": "paused until, server ms",
    "pc": "the pause's cause",
    "a": "an adaptive key's value (its limit in force is the floor)",
    "ta": "tokens taken",
    "tr": "tokens refunded",
    "td": "tokens charged as debt",
    "pn": "pushbacks",
    "wn": "waiters woken",
    "wt": "ms those waiters waited on the key",
}


def _float(value: Any) -> float | None:
    try:
        number = float(field_text(value))
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def parse_rate(raw: Any) -> Rate | None:
    """A rate in force, ``'limit,per_ms,burst,units'``; None when absent or damaged."""
    parts = field_text(raw).split(",")
    if len(parts) != 4:
        return None
    limit, per_ms, burst = (_float(p) for p in parts[:3])
    if limit is None or per_ms is None or burst is None:
        return None
    try:
        return Rate(limit, per_ms / 1000.0, burst, "units" if parts[3] == "1" else "jobs")
    except (TypeError, ValueError):
        return None


def parse_adaptive(raw: Any) -> Adaptive | None:
    """An adaptive key's bounds in force, ``'max,min'``; None when absent or damaged."""
    parts = field_text(raw).split(",")
    if len(parts) != 2:
        return None
    high, low = (field_int(p) for p in parts)
    if high is None or low is None:
        return None
    try:
        return Adaptive(high, low)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class RateKeyView:
    """One rate key over every shard that holds it, as of ``now_ms`` (server time)."""

    key: str
    now_ms: int
    rate: Rate | None
    """Its rate in force: None when no job references it now (the bucket outlives it)."""
    tokens: float | None
    """Its level now (a debt below zero); the stored tokens when no rate is in force,
    None when nothing is stored either."""
    paused_until_ms: int | None = None
    """When its pause ends, while paused (None: not paused)."""
    pause_cause: str = ""
    adaptive: float | None = None
    """An adaptive key's value (its limit in force is the floor)."""
    adaptive_bounds: Adaptive | None = None
    taken: float = 0.0
    refunded: float = 0.0
    debt: float = 0.0
    pushbacks: int = 0
    woken: int = 0
    waited_ms: int = 0
    """The ms its woken waiters waited on it, all together (``waited_ms / woken``: the mean)."""
    waiters: int = 0
    head: tuple[str, ...] = ()
    """The first waiters' job ids, by tenant group (which group goes next is the key's
    fair tags' call)."""
    due_ms: int | None = None
    """When the server wakes its waiters (it is blocked by its rate and has some)."""
    written_ms: int = 0
    """Its score in the index: when the scripts wrote its state (0: in force, no state)."""
    shards: int = 1

    @property
    def paused(self) -> bool:
        return self.paused_until_ms is not None and self.paused_until_ms > self.now_ms

    @property
    def adaptive_limit(self) -> int | None:
        """The concurrency limit an adaptive key has in force now."""
        if self.adaptive is not None:
            return adaptive_limit(self.adaptive)
        return self.adaptive_bounds.max if self.adaptive_bounds is not None else None

    def next_tokens_ms(self, cost: float = 1.0) -> int | None:
        """When a job of ``cost`` fits next (now when it fits now; the pause's end if
        later); None without a rate in force or a level."""
        if self.rate is None or self.tokens is None:
            return None
        bucket = Bucket(self.tokens, self.now_ms, self.paused_until_ms or 0)
        if self.tokens >= cost and not self.paused:
            return self.now_ms
        return due_at(self.rate, bucket, cost, self.now_ms)


@dataclass(frozen=True, slots=True)
class RateKeys:
    """The rate keys read: ``keys`` sorted by key; ``known`` how many the index holds
    (over every shard: more than listed when a shard held more than the read's limit)."""

    keys: list[RateKeyView] = field(default_factory=list)
    known: int = 0
    now_ms: int = 0

    def get(self, key: str) -> RateKeyView | None:
        return next((v for v in self.keys if v.key == key), None)


def _waiter_range(key: str) -> tuple[str, str]:
    """The lex range of ``thr:wait`` members ``<key>\\0...``."""
    return f"[{key}\0", f"({key}\1"


def _reads(k: AppKeys, key: str, head: int) -> list[Any]:
    low, high = _waiter_range(key)
    return [
        cmd("hgetall", k.rate_state(key)),
        cmd("hmget", k.throttles, _RATE_FIELD + key, _ADAPTIVE_FIELD + key),
        cmd("zscore", k.rate_due, key),
        cmd("zlexcount", k.throttle_waiters, low, high),
        cmd("zrangebylex", k.throttle_waiters, low, high, start=0, num=head),
    ]


def _one(key: str, now: int, written: int, replies: Sequence[Any]) -> tuple[RateKeyView, bool]:
    """A key's view in one shard, and whether its index entry is stale (nothing left)."""
    raw, (in_force, bounds), due, count, first = replies
    state = {field_text(k): v for k, v in raw.items()}
    rate = parse_rate(in_force)
    stored, stamp = _float(state.get("t")), field_int(state.get("s"))
    tokens: float | None = stored
    if rate is not None:
        bucket = Bucket(rate.capacity, now) if stored is None else Bucket(stored, stamp or now)
        tokens = level(rate, bucket, now)
    until = field_int(state.get("pu"))
    paused = until is not None and until > now
    view = RateKeyView(
        key=key,
        now_ms=now,
        rate=rate,
        tokens=tokens,
        paused_until_ms=until if paused else None,
        pause_cause=field_text(state.get("pc")) if paused else "",
        adaptive=_float(state.get("a")),
        adaptive_bounds=parse_adaptive(bounds),
        taken=_float(state.get("ta")) or 0.0,
        refunded=_float(state.get("tr")) or 0.0,
        debt=_float(state.get("td")) or 0.0,
        pushbacks=field_int(state.get("pn"), 0),
        woken=field_int(state.get("wn"), 0),
        waited_ms=field_int(state.get("wt"), 0),
        waiters=int(count),
        head=tuple(field_text(m).split("\0", 3)[-1] for m in first),
        due_ms=None if due is None else int(float(due)),
        written_ms=written,
    )
    stale = not state and in_force is None and bounds is None and not count and due is None
    return view, stale


def _sum_opt(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _merged(views: Sequence[RateKeyView]) -> RateKeyView:
    if len(views) == 1:
        return views[0]
    first = views[0]
    pauses = [v for v in views if v.paused_until_ms is not None]
    last_pause = max(pauses, key=lambda v: v.paused_until_ms or 0) if pauses else None
    dues = [v.due_ms for v in views if v.due_ms is not None]
    adaptive = [v.adaptive for v in views if v.adaptive is not None]
    return RateKeyView(
        key=first.key,
        now_ms=max(v.now_ms for v in views),
        rate=next((v.rate for v in views if v.rate is not None), None),
        tokens=_sum_opt(v.tokens for v in views),
        paused_until_ms=last_pause.paused_until_ms if last_pause else None,
        pause_cause=last_pause.pause_cause if last_pause else "",
        adaptive=min(adaptive) if adaptive else None,
        adaptive_bounds=next((v.adaptive_bounds for v in views if v.adaptive_bounds), None),
        taken=sum(v.taken for v in views),
        refunded=sum(v.refunded for v in views),
        debt=sum(v.debt for v in views),
        pushbacks=sum(v.pushbacks for v in views),
        woken=sum(v.woken for v in views),
        waited_ms=sum(v.waited_ms for v in views),
        waiters=sum(v.waiters for v in views),
        head=tuple(i for v in views for i in v.head),
        due_ms=min(dues) if dues else None,
        written_ms=max(v.written_ms for v in views),
        shards=len(views),
    )


def rate_keys(
    keys: Sequence[AppKeys],
    limit: int = 500,
    head: int = 5,
    *,
    trim: bool = True,
    in_force: bool = False,
) -> Plan[RateKeys]:
    """The rate keys of every shard (at most ``limit`` per shard from the index, those
    written most recently), sorted by key, each with its first ``head`` waiters;
    ``in_force`` adds the keys whose rate is in force but that have no state yet (no
    job took from them: the scripts index a key when they create its state), read by
    ``HSCAN`` of the ``thr`` hash as the throttle view reads it; ``trim`` removes the
    index entries of keys with nothing left."""
    per_shard = 4 if in_force else 3
    batch = []
    for k in keys:
        batch += [
            cmd("zrevrange", k.rate_index, 0, limit - 1, withscores=True),
            cmd("zcard", k.rate_index),
            server_time(k.rate_index),
        ]
        if in_force:
            batch.append(scan_fields(k.throttles, _RATE_FIELD + "*"))
    reply = yield batch
    listed: list[tuple[int, str, int]] = []  # (shard, key, written ms)
    known = 0
    clocks: list[int] = []
    for shard in range(len(keys)):
        entries, count, now = reply[per_shard * shard : per_shard * shard + 3]
        known += int(count)
        clocks.append(int(now))
        indexed = [(shard, field_text(m), int(float(s))) for m, s in entries]
        listed += indexed
        if in_force:
            seen = {key for _, key, _ in indexed}
            fresh = sorted(
                {field_text(f)[len(_RATE_FIELD) :] for f in reply[per_shard * shard + 3]} - seen
            )
            listed += [(shard, key, 0) for key in fresh]
    now_ms = max(clocks, default=0)
    if not listed:
        return RateKeys([], known, now_ms)
    reads = yield [c for shard, key, _ in listed for c in _reads(keys[shard], key, head)]
    per_key: dict[str, list[RateKeyView]] = defaultdict(list)
    stale: dict[int, list[str]] = defaultdict(list)
    for i, (shard, key, written) in enumerate(listed):
        view, gone = _one(key, clocks[shard], written, reads[5 * i : 5 * i + 5])
        if gone:
            stale[shard].append(key)
        else:
            per_key[key].append(view)
    if trim and stale:
        trimmed = [(shard, key) for shard, names in stale.items() for key in names]
        # each entry's removal, then whether its state exists again (the order is kept:
        # a shard's keys share one node)
        checked = yield [
            c
            for shard, key in trimmed
            for c in (
                cmd("zrem", keys[shard].rate_index, key),
                cmd("exists", keys[shard].rate_state(key)),
            )
        ]
        back = [(shard, key) for i, (shard, key) in enumerate(trimmed) if int(checked[2 * i + 1])]
        if back:
            yield [
                cmd("zadd", keys[shard].rate_index, {key: clocks[shard]}, nx=True)
                for shard, key in back
            ]
        known -= len(trimmed) - len(back)
    return RateKeys([_merged(per_key[key]) for key in sorted(per_key)], known, now_ms)


# -- one job's rate keys (explain) ----------------------------------------------------

_MSGPACK: Final = msgspec.msgpack.Decoder()


@dataclass(frozen=True, slots=True)
class JobRates:
    """A job's rate keys as its record names them, and their state now.

    ``rates``: its rate keys (``rk``); ``adaptive``: its adaptive concurrency keys (a
    ``lim`` entry ``[key, max, min]``); ``units``: its rate cost in units (``rmu``,
    None without a key counting units); ``pushbacks``: the pushbacks it has taken
    without spending an attempt (``pb``); ``keys``: those keys' views now."""

    rates: dict[str, Rate] = field(default_factory=dict)
    adaptive: dict[str, Adaptive] = field(default_factory=dict)
    units: float | None = None
    pushbacks: int = 0
    keys: dict[str, RateKeyView] = field(default_factory=dict)

    def cost(self, key: str) -> float:
        """What the job takes from ``key``: 1, or its units on a key counting units."""
        rate = self.rates.get(key)
        if rate is not None and rate.units and self.units is not None:
            return self.units
        return 1.0


def _msgpack_list(raw: Any) -> list[Any]:
    if not raw:
        return []
    try:
        value = _MSGPACK.decode(raw if isinstance(raw, bytes) else field_text(raw).encode())
    except (msgspec.DecodeError, UnicodeEncodeError):
        return []
    return value if isinstance(value, list) else []


def decode_job_rates(raw: Mapping[str, Any]) -> JobRates:
    """A job hash's rate fields (``rk``, ``rmu``, ``pb``, adaptive ``lim`` entries),
    leniently: an entry that does not parse is left out."""
    rates: dict[str, Rate] = {}
    for entry in _msgpack_list(raw.get("rk")):
        if isinstance(entry, list) and len(entry) == 5:
            key, limit, per_ms, burst, units = entry
            rate = parse_rate(f"{limit},{per_ms},{burst},{1 if units else 0}")
            if rate is not None:
                rates[field_text(key)] = rate
    adaptive: dict[str, Adaptive] = {}
    for entry in _msgpack_list(raw.get("lim")):
        if isinstance(entry, list) and len(entry) == 3:
            bounds = parse_adaptive(f"{entry[1]},{entry[2]}")
            if bounds is not None:
                adaptive[field_text(entry[0])] = bounds
    milli = _float(raw.get("rmu"))
    return JobRates(
        rates, adaptive, None if milli is None else milli / 1000.0, field_int(raw.get("pb"), 0)
    )


def job_rates(keys: AppKeys, job_id: str, head: int = 5) -> Plan[JobRates]:
    """Job ``job_id``'s rate keys (``keys``: its shard's) and their state now, in two
    round trips (one when the job names none)."""
    reply = yield [
        cmd("hmget", keys.job(job_id), "rk", "rmu", "pb", "lim"),
        server_time(keys.rate_index),
    ]
    (rk, rmu, pb, lim), now = reply
    spec = decode_job_rates({"rk": rk, "rmu": rmu, "pb": pb, "lim": lim})
    names = sorted({*spec.rates, *spec.adaptive})
    if not names:
        return spec
    reads = yield [c for key in names for c in _reads(keys, key, head)]
    views = {
        key: _one(key, int(now), 0, reads[5 * i : 5 * i + 5])[0] for i, key in enumerate(names)
    }
    return JobRates(spec.rates, spec.adaptive, spec.units, spec.pushbacks, views)
