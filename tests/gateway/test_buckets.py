"""Each tenant's token bucket in the gateway (``fairlane.gateway.buckets``): a tenant
starts full, is refused once empty with the exact wait for its next token, refills at
its rate, gets a token back, and idle full buckets are dropped. Pure: time passed in."""

from __future__ import annotations

import pytest

from fairlane.gateway import buckets
from fairlane.gateway.buckets import TenantBuckets
from fairlane.policy.rates import Rate

FIVE_A_SECOND = Rate(5, 1.0, burst=2)


def test_a_tenant_starts_full_and_is_refused_with_the_wait_for_its_next_token() -> None:
    held = TenantBuckets()
    assert held.take("acme", FIVE_A_SECOND, 1_000) is None
    assert held.take("acme", FIVE_A_SECOND, 1_000) is None
    # empty: the next token comes 1/5 s later, nothing is taken meanwhile
    assert held.take("acme", FIVE_A_SECOND, 1_000) == 0.2
    assert held.take("acme", FIVE_A_SECOND, 1_150) == pytest.approx(0.05)
    assert held.take("acme", FIVE_A_SECOND, 1_200) is None
    # another tenant has a bucket of its own
    assert held.take("globex", FIVE_A_SECOND, 1_200) is None


def test_a_bucket_refills_to_its_burst_and_no_further() -> None:
    held = TenantBuckets()
    for _ in range(2):
        assert held.take("acme", FIVE_A_SECOND, 0) is None
    # ten seconds idle refill two tokens, not fifty
    taken = [held.take("acme", FIVE_A_SECOND, 10_000) is None for _ in range(3)]
    assert taken == [True, True, False]


def test_a_token_given_back_can_be_taken_again() -> None:
    held = TenantBuckets()
    for _ in range(2):
        held.take("acme", FIVE_A_SECOND, 0)
    held.give_back("acme", 0)
    assert held.take("acme", FIVE_A_SECOND, 0) is None
    assert held.take("acme", FIVE_A_SECOND, 0) == 0.2
    held.give_back("nobody", 0)  # a tenant without a bucket: nothing to give back
    assert len(held) == 1


def test_a_slow_rate_says_how_many_seconds() -> None:
    held = TenantBuckets()
    one_a_minute = Rate(1, 60.0)
    assert held.take("acme", one_a_minute, 0) is None
    assert held.take("acme", one_a_minute, 15_000) == 45.0


def test_full_buckets_are_dropped_when_the_map_grows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buckets, "PRUNE_AT", 4)
    held = TenantBuckets()
    for tenant in ("a", "b", "c", "d"):
        held.take(tenant, FIVE_A_SECOND, 0)
    held.take("d", FIVE_A_SECOND, 0)  # d is empty; a, b, c are refilled by 300 ms
    held.take("e", FIVE_A_SECOND, 300)
    assert len(held) == 2  # d (not full yet) and e
    # d kept its level (1.5 tokens), where a new bucket would have held two
    assert held.take("d", FIVE_A_SECOND, 300) is None
    assert held.take("d", FIVE_A_SECOND, 300) == pytest.approx(0.1)
