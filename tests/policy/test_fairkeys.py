"""``fairlane.policy.fairkeys``: the bounds its docstring states, at every prefix.

Random arrivals of keyed jobs (keys of weights 1/2, 1, 2 and 3, in batches) mixed with
dispatches, in one tenant's queue at one priority:

* two keys that both have jobs waiting from dispatch ``a`` to dispatch ``b`` were
  served ``|n_i / w_i - n_j / w_j| <= 1 / w_i + 1 / w_j`` in ``(a, b]``, checked after
  every single dispatch;
* a key entering with no claim above the head (new, or caught up) goes in behind at most
  one waiting job of each other key (those tagged at the head itself), never behind a
  backlog, and no later arrival passes it;
* tags never run ahead of the FIFO numbers while weights are ``>= 1``.
"""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.fairkeys import KeyTags, TenantOrder, head_order, order_score

KEY_WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 0.5, "e": 1.0}

arrival = st.tuples(st.sampled_from(sorted(KEY_WEIGHTS)), st.integers(1, 6))
step = st.one_of(
    st.tuples(st.just("enqueue"), arrival),
    st.tuples(st.just("dispatch"), st.integers(1, 5)),
)


class Run:
    """A tenant queue under test, with what each key was served and waits."""

    def __init__(self, weights: dict[str, float]) -> None:
        self.order = TenantOrder(weights=weights)
        self.weights = weights
        self.seq = 0
        self.key_of: dict[str, str] = {}
        self.waiting = dict.fromkeys(weights, 0)
        self.served = dict.fromkeys(weights, 0)
        # pairs of keys waiting together since: what each had been served then
        self.since: dict[tuple[str, str], tuple[int, int]] = {}

    def enqueue(self, key: str, n: int) -> None:
        for _ in range(n):
            self.seq += 1
            job = f"j{self.seq:06d}"
            self.key_of[job] = key
            head = self.order.head()
            claim = self.order.tags.next_tag.get(key)
            fresh = self.waiting[key] == 0 and (claim is None or head is None or claim <= head)
            others = sum(1 for k, w in self.waiting.items() if w and k != key)
            order = self.order.enqueue(job, key, 0, self.seq)
            self.waiting[key] += 1
            if fresh:
                position = self.order.queue.index((order_score(0, order), job))
                assert position <= others, (key, position, others)
            if min(self.weights.values()) >= 1:
                assert order <= self.seq
        self.pair_up()

    def pair_up(self) -> None:
        for i, j in combinations(sorted(self.weights), 2):
            if self.waiting[i] and self.waiting[j] and (i, j) not in self.since:
                self.since[i, j] = (self.served[i], self.served[j])

    def dispatch(self, n: int) -> None:
        for _ in range(n):
            job = self.order.pop()
            if job is None:
                return
            key = self.key_of[job]
            self.waiting[key] -= 1
            self.served[key] += 1
            for (i, j), (si, sj) in list(self.since.items()):
                wi, wj = self.weights[i], self.weights[j]
                gap = (self.served[i] - si) / wi - (self.served[j] - sj) / wj
                assert abs(gap) <= 1 / wi + 1 / wj + 1e-9, (i, j, gap)
                if not (self.waiting[i] and self.waiting[j]):
                    del self.since[i, j]


@settings(max_examples=400, deadline=None)
@given(steps=st.lists(step, max_size=60), unit=st.booleans())
def test_keys_share_within_the_bound_and_newcomers_enter_at_the_head(
    steps: list[tuple[str, object]], unit: bool
) -> None:
    weights = dict.fromkeys(KEY_WEIGHTS, 1.0) if unit else dict(KEY_WEIGHTS)
    run = Run(weights)
    for kind, arg in steps:
        if kind == "enqueue":
            key, n = arg  # type: ignore[misc]
            run.enqueue(key, n)
        else:
            run.dispatch(arg)  # type: ignore[arg-type]


def test_a_flood_and_a_newcomer_interleave_one_for_one() -> None:
    run = Run({"flood": 1.0, "quiet": 1.0})
    run.enqueue("flood", 100)
    run.dispatch(10)
    run.enqueue("quiet", 3)
    # the quiet key's jobs go in at the head, then every other place
    got = [run.key_of[run.order.pop() or ""] for _ in range(8)]
    assert got == ["flood", "quiet", "flood", "quiet", "flood", "quiet", "flood", "flood"]


def test_tags_at_or_below_the_head_are_dropped_and_a_drained_queue_forgets_all() -> None:
    tags = KeyTags()
    assert tags.tag("a", 1.0, None, 7) == 7
    assert tags.tag("b", 2.0, 7, 8) == 7
    assert tags.next_tag == {"a": 8, "b": 7.5}
    tags.tag("c", 1.0, 7.5, 9)
    assert tags.next_tag == {"a": 8, "c": 8.5}  # b's 7.5 was at the head
    tags.tag("a", 1.0, None, 20)  # the queue drained: start again at the FIFO number
    assert tags.next_tag == {"a": 21}


def test_the_head_order_drops_the_priority() -> None:
    for prio in (-1000, -3, 0, 5, 1000):
        assert head_order(order_score(prio, 12345)) == 12345
    assert head_order(order_score(0, 12.5)) == 12.5
