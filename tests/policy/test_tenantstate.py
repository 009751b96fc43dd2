"""The rules of what a tenant leaves behind (``fairlane.policy.tenantstate``).

A finish tag may go exactly when it does not raise the tenant's start at an activation
now, and an activation after more tenants became active is unchanged too; the rate
buckets, rejection counters and admission counters are deleted only when every reader
takes them as missing. Pure: no server.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fairlane.policy.ceilings import RATE_BUCKETS, RATE_WIDTH_MS, RateWindow
from fairlane.policy.tenantstate import (
    DEFAULT_IDLE_TTL,
    REJECTION_WINDOW_MS,
    SIGNAL_WINDOW_MS,
    TENANT_STATE,
    activation_start,
    bucket_expired,
    counter_empty,
    finish_tag_forgotten,
    finish_tag_removable,
    key_forgotten,
    rejection_expired,
    signals_forgotten,
)

tags = st.floats(-1e6, 1e6, allow_nan=False)
work = st.floats(0, 1e4, allow_nan=False)
active = st.integers(0, 50)


@given(finish=tags, vtime=tags, in_flight=work)
def test_a_tag_is_removable_exactly_when_no_activation_at_this_work_in_flight_could_differ(
    finish: float, vtime: float, in_flight: float
) -> None:
    """With ``r`` in flight the least start is ``V - r`` (one active tenant): removable
    exactly when the tag would not move that start, hence none with more tenants."""
    differs = [
        activation_start(finish, vtime, in_flight, m) != activation_start(None, vtime, in_flight, m)
        for m in range(5)
    ]
    assert finish_tag_removable(finish, vtime, in_flight) == (not any(differs))


@given(
    finish=tags,
    vtime=tags,
    in_flight=work,
    m=active,
    later=st.floats(0, 1e4),
    extra=st.floats(0, 1),
)
def test_a_removed_tag_stays_neutral_while_work_in_flight_grows_no_faster_than_v(
    *, finish: float, vtime: float, in_flight: float, m: int, later: float, extra: float
) -> None:
    """Removed at ``(V, r)``: any later activation at ``V' = V + later`` with at most
    ``r + later`` in flight and any number of active tenants starts where it would have."""
    if finish_tag_removable(finish, vtime, in_flight):
        v, r = vtime + later, in_flight + extra * later
        assert activation_start(finish, v, r, m) == activation_start(None, v, r, m)


def test_work_in_flight_is_the_only_way_a_removed_tag_could_matter() -> None:
    # removed at V=10 with nothing in flight; later 100 units in flight with one active
    # tenant: the tenant starts at B' = -90 instead of 10, the credit a new tenant gets
    assert finish_tag_removable(10.0, 10.0, 0.0)
    assert activation_start(10.0, 10.0, 100.0, 1) == 10.0
    assert activation_start(None, 10.0, 100.0, 1) == -90.0
    # with 4 units in flight a tag must be 4 behind V, however many tenants are active
    assert not finish_tag_removable(7.0, 10.0, 4.0)
    assert finish_tag_removable(6.0, 10.0, 4.0)
    # a tag above V - r stays until it has been idle for the ttl
    assert not finish_tag_removable(10.5, 10.0, 0.0)
    assert not finish_tag_forgotten(None, 10_000, 1_000)
    assert not finish_tag_forgotten(9_500, 10_000, 1_000)
    assert finish_tag_forgotten(9_000, 10_000, 1_000)


@given(
    writes=st.lists(st.integers(0, 10**7), min_size=1, max_size=20),
    later=st.integers(0, 10**7),
)
def test_an_expired_bucket_is_never_counted_again(writes: list[int], later: int) -> None:
    """A ring that held only expired buckets counts exactly what an empty ring counts."""
    writes.sort()
    now = writes[-1] + later
    ring = RateWindow(RATE_BUCKETS, RATE_WIDTH_MS)
    for t in writes:
        ring.add(t)
    stamps = {t // RATE_WIDTH_MS for t in writes}
    if all(bucket_expired(stamp, now) for stamp in stamps):
        assert ring.count(now) == 0
        fresh = RateWindow(RATE_BUCKETS, RATE_WIDTH_MS)
        ring.add(now, 3)
        fresh.add(now, 3)
        assert ring.count(now) == fresh.count(now) == 3


@given(idle=st.integers(0, 10**9), ttl=st.integers(1, 10**9))
def test_signals_go_only_once_every_bucket_is_out_of_the_window(idle: int, ttl: int) -> None:
    """Signals untouched for ``idle`` ms: their newest bucket was written at ``now - idle``
    at the latest, so when they go every bucket is expired."""
    now = 10**10
    if signals_forgotten(idle, ttl):
        assert bucket_expired((now - idle) // RATE_WIDTH_MS, now)
        assert idle >= ttl
    assert key_forgotten(idle, ttl) == (idle >= ttl)


def test_rejection_counters_go_once_their_window_has_passed() -> None:
    now = 1_000_000
    assert not rejection_expired(f"3|{now - REJECTION_WINDOW_MS + 1}", now)
    assert rejection_expired(f"3|{now - REJECTION_WINDOW_MS}", now)
    assert not rejection_expired(f"3|{now + 5}", now)  # a window from a later clock
    assert rejection_expired("garbage", now)  # note_rejection starts afresh on it too


def test_only_a_zero_counter_is_empty() -> None:
    assert counter_empty("0")
    assert not counter_empty("1")
    assert not counter_empty("-1")
    assert not counter_empty("x")


def test_the_table_and_the_defaults() -> None:
    assert DEFAULT_IDLE_TTL == 7 * 86400
    assert SIGNAL_WINDOW_MS == RATE_BUCKETS * RATE_WIDTH_MS
    assert {kind.name for kind in TENANT_STATE} >= {
        "finish tag",
        "learned cost",
        "signals",
        "rejection counter",
    }
