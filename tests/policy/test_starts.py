"""The ring of a class's starts (``fairlane.policy.starts``): a bucket's packing, which
seconds the ring keeps, and what it says of a job's waits."""

from __future__ import annotations

from fairlane.policy.starts import (
    BUCKETS,
    RETRY_START,
    TELL_SHARE,
    WIDTH_MS,
    StartsWhile,
    bucket_of,
    kept,
    pack,
    starts_while,
    unpack,
)

NOW = 1_700_000_000_000


def test_a_bucket_packs_starts_and_retries_in_one_integer() -> None:
    for starts, retries in [(0, 0), (1, 0), (5, 5), (RETRY_START - 1, 3)]:
        assert unpack(pack(starts, retries)) == (starts, retries)
    # what the scripts add per start: 1, or RETRY_START + 1 for a retry
    assert unpack(3 * 1 + 2 * (RETRY_START + 1)) == (5, 2)
    # exact in a double, as the scripts hold it, for any count a second can see
    assert float(pack(10**6, 10**6)) == pack(10**6, 10**6)
    assert unpack(-1) == (0, 0)


def test_the_ring_keeps_its_last_buckets_seconds() -> None:
    now = bucket_of(NOW)
    assert bucket_of(NOW + WIDTH_MS - 1) == now
    assert kept(now, NOW) and kept(now - BUCKETS + 1, NOW)
    assert not kept(now - BUCKETS, NOW)


def test_a_wait_is_told_the_retries_of_other_jobs_over_the_seconds_it_touched() -> None:
    s = bucket_of(NOW)
    ring = {s - 3: pack(50, 50), s - 1: pack(4, 1), s: pack(6, 3), s + 1: pack(100, 0)}
    # a wait from within s - 1 to within s: the two seconds, the job's own retry start
    # (at the wait's end, in s) taken out of the retries
    seen = starts_while(ring, [(NOW - 500, NOW + 200)], [NOW + 200], NOW + 2000)
    assert seen == StartsWhile(seconds=2, starts=10, others_retries=3)
    assert seen.share == 0.3 and seen.worth_telling
    # two waits: the union of their seconds, each counted once
    both = starts_while(ring, [(NOW - 3000, NOW - 2900), (NOW - 800, NOW)], [], NOW + 2000)
    assert both == StartsWhile(seconds=3, starts=60, others_retries=54)
    # a second with no starts counts nothing; a share under TELL_SHARE is not told
    assert not StartsWhile(10, 100, int(100 * TELL_SHARE) - 1).worth_telling
    assert not StartsWhile(1, 0, 0).worth_telling and StartsWhile(1, 0, 0).share == 0.0


def test_a_wait_the_ring_no_longer_holds_is_not_told() -> None:
    old = NOW - BUCKETS * WIDTH_MS
    assert starts_while({}, [(old, NOW)], [], NOW) is None
    assert starts_while({}, [], [], NOW) is None
    assert starts_while({}, [(old + WIDTH_MS, NOW)], [], NOW) == StartsWhile(BUCKETS, 0, 0)
