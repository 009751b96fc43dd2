"""Aging between service classes (``max_wait``; fairlane.policy.classes, rules A1-A3).

Hand-worked cases of where an aged head goes, random states checked against the rules
written here again from the module docstring, and a lane on a virtual clock: a batch
job on a lane its standard work keeps full starts once it has waited past its
``max_wait``, and not before; and with no ``max_wait`` it never starts.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.classes import (
    ClassTable,
    ServiceClass,
    allocate,
    levels,
    move_aged,
    next_class,
)

STANDARD_BATCH = ClassTable(
    [
        ServiceClass("standard", nominal_share=1.0),
        ServiceClass("batch", batch=True, max_wait="1s"),
    ]
)


def test_max_wait_reads_durations_and_refuses_nonsense() -> None:
    assert ServiceClass("b", batch=True, max_wait="12h").max_wait == 43200.0
    assert ServiceClass("b", batch=True, max_wait=timedelta(minutes=2)).max_wait_ms == 120_000
    assert ServiceClass("b", batch=True, max_wait=0.5).max_wait_ms == 500
    assert ServiceClass("b", batch=True).max_wait_ms is None
    for bad in (0, -1, "soon", float("inf")):
        with pytest.raises(ValueError, match=r"max_wait|duration"):
            ServiceClass("b", batch=True, max_wait=bad)
    with pytest.raises(TypeError, match="max_wait"):
        ServiceClass("b", batch=True, max_wait=True)
    with pytest.raises(ValueError, match="declared first"):
        ClassTable([ServiceClass("only", nominal_share=1.0, max_wait="1h")])


def test_an_aged_batch_head_is_served_as_the_class_above_on_a_full_lane() -> None:
    # standard holds 3 of 4 slots and has more waiting: batch, on spare only, gets nothing
    state = (4, {"standard": 3}, {"standard": 1, "batch": 1})
    young = {"standard": 10, "batch": 900}
    aged = {"standard": 10, "batch": 1001}
    assert next_class(STANDARD_BATCH, *state) == "standard"
    assert next_class(STANDARD_BATCH, *state, waited_ms=young) == "standard"
    assert next_class(STANDARD_BATCH, *state, waited_ms=aged) == "batch"
    # standard's own head has waited longer still: it goes first (a tie too)
    assert next_class(STANDARD_BATCH, *state, waited_ms={"standard": 1500, "batch": 1500}) == (
        "standard"
    )
    # aged or not, the lane is full: nothing starts
    full = (4, {"standard": 4}, {"standard": 1, "batch": 1})
    assert next_class(STANDARD_BATCH, *full, waited_ms=aged) is None


def test_aged_work_counts_against_the_level_of_the_class_above() -> None:
    table = ClassTable(
        [
            ServiceClass("guaranteed", nominal_share=0.5, lendable=0.0),
            ServiceClass("standard", nominal_share=0.5, borrowable=0.0),
            ServiceClass("batch", batch=True, max_wait="1s"),
        ]
    )
    # standard is assured 5 of 10 and capped there; guaranteed keeps its 5 in reserve
    heads = {"standard": None, "batch": 1}
    aged = {"batch": 5000}
    f, w, _, moved = move_aged(table, 10, {"standard": 2, "batch": 2}, heads, aged)
    assert moved == {"standard": "batch"}
    assert (f["standard"], f["batch"], w["standard"], w["batch"]) == (4, 0, 1, None)
    assert next_class(table, 10, {"standard": 2, "batch": 2}, heads, waited_ms=aged) == "batch"
    # with batch's 3 and standard's 2 in flight, standard's ceiling is reached: the aged
    # head keeps its own class's rules, and guaranteed's reserve is not spare
    assert move_aged(table, 10, {"standard": 2, "batch": 3}, heads, aged)[3] == {}
    assert next_class(table, 10, {"standard": 2, "batch": 3}, heads, waited_ms=aged) is None


def test_a_head_too_wide_for_the_class_above_keeps_its_own_rules() -> None:
    table = ClassTable(
        [
            ServiceClass("standard", nominal_share=0.5, borrowable=0.0),
            ServiceClass("batch", batch=True, max_wait="1s"),
        ]
    )
    # standard's widest job is 4 of 8; an aged 6-slot batch head runs on spare as batch
    _, w, _, moved = move_aged(table, 8, {}, {"batch": 6}, {"batch": 9000})
    assert moved == {}
    assert w["batch"] == 6
    assert next_class(table, 8, {}, {"batch": 6}, waited_ms={"batch": 9000}) == "batch"


def test_aging_moves_one_class_up_at_most() -> None:
    table = ClassTable(
        [
            ServiceClass("guaranteed", nominal_share=0.5),
            ServiceClass("standard", nominal_share=0.5, max_wait="1s"),
            ServiceClass("batch", batch=True, max_wait="1s"),
        ]
    )
    heads = {"guaranteed": 1, "standard": 1, "batch": 1}
    # standard's head is older than guaranteed's: it moves up, and batch may not move
    # into the place it left
    ages = {"guaranteed": 100, "standard": 3000, "batch": 5000}
    assert move_aged(table, 10, {}, heads, ages)[3] == {"guaranteed": "standard"}
    # guaranteed's head is the oldest: standard stays, and batch's older head moves in
    ages = {"guaranteed": 9000, "standard": 3000, "batch": 5000}
    assert move_aged(table, 10, {}, heads, ages)[3] == {"standard": "batch"}


# --- random states ------------------------------------------------------------------------


@st.composite
def tables(draw: st.DrawFn) -> ClassTable:
    n = draw(st.integers(2, 4))
    shares = draw(st.lists(st.integers(0, 10), min_size=n, max_size=n))
    total = max(10, sum(shares))
    classes = []
    for i, share in enumerate(shares):
        max_wait = draw(st.sampled_from([None, 0.001, 0.02, 1.0])) if i else None
        if draw(st.integers(0, 3)) == 0:
            classes.append(ServiceClass(f"c{i}", batch=True, max_wait=max_wait))
            continue
        classes.append(
            ServiceClass(
                f"c{i}",
                nominal_share=share / total,
                min_slots=draw(st.integers(0, 3)),
                lendable=draw(st.sampled_from([1.0, 0.5, 0.0])),
                borrowable=draw(st.sampled_from([None, 0.0, 1.0])),
                max_wait=max_wait,
            )
        )
    return ClassTable(classes)


@settings(max_examples=400, deadline=None)
@given(table=tables(), cap=st.integers(1, 16), data=st.data())
def test_random_states_follow_the_aging_rules(
    table: ClassTable, cap: int, data: st.DataObject
) -> None:
    n, names = len(table), table.names
    in_flight = data.draw(st.lists(st.integers(0, cap // 2), min_size=n, max_size=n))
    f = dict(zip(names, in_flight, strict=True))
    widths = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    heads = {c: (w or None) for c, w in zip(names, widths, strict=True)}
    waited = data.draw(
        st.lists(st.sampled_from([0, 1, 2, 20, 21, 999, 1001]), min_size=n, max_size=n)
    )
    ages = dict(zip(names, waited, strict=True))
    chosen = next_class(table, cap, f, heads, waited_ms=ages)
    plain = allocate(table, cap, f, heads).chosen
    assert next_class(table, cap, f, heads) == plain  # no ages: nothing ages
    _, _, ceil, widest = levels(table, cap)
    moved = move_aged(table, cap, f, heads, ages)[3]
    went_up = set(moved.values())
    for i in range(1, n):  # A1, written again
        c, u = table.classes[i], names[i - 1]
        wi = heads[c.name]
        should = (
            c.max_wait_ms is not None
            and wi is not None
            and ages[c.name] > c.max_wait_ms
            and u not in went_up
            and (heads[u] is None or ages[u] < ages[c.name])
            and wi <= widest[i - 1]
            and f[u] + f[c.name] + wi <= ceil[i - 1]
        )
        assert (moved.get(u) == c.name) == should
    if chosen is not None:
        # P1: the chosen head fits the free slots
        assert heads[chosen] is not None
        assert heads[chosen] <= cap - sum(f.values())
    for u in moved:  # a moved head is never overtaken by the younger head it displaced
        assert chosen != u
    if not moved:
        assert chosen == plain


# --- a lane on a virtual clock --------------------------------------------------------------


@dataclass
class Lane:
    """A lane of ``capacity`` one-slot jobs; per class a FIFO of arrival times (ms)."""

    table: ClassTable
    capacity: int
    now: int = 0
    queues: dict[str, deque[int]] = field(default_factory=dict)
    running: list[tuple[int, str]] = field(default_factory=list)
    started: list[tuple[int, str, int]] = field(default_factory=list)  # (at, class, arrival)

    def __post_init__(self) -> None:
        self.queues = {name: deque() for name in self.table.names}

    def dispatch(self, duration: int) -> None:
        while True:
            flying = dict.fromkeys(self.table.names, 0)
            for _, cls in self.running:
                flying[cls] += 1
            heads = {c: (1 if q else None) for c, q in self.queues.items()}
            waited = {c: self.now - q[0] for c, q in self.queues.items() if q}
            demand = {c: len(q) for c, q in self.queues.items()}
            chosen = next_class(
                self.table, self.capacity, flying, heads, demand=demand, waited_ms=waited
            )
            if chosen is None:
                return
            arrival = self.queues[chosen].popleft()
            heapq.heappush(self.running, (self.now + duration, chosen))
            self.started.append((self.now, chosen, arrival))
            assert len(self.running) <= self.capacity

    def run(self, until: int, *, step: int, duration: int) -> None:
        """Standard work arrives every ``step`` ms, faster than the lane serves it."""
        while self.now < until:
            while self.running and self.running[0][0] <= self.now:
                heapq.heappop(self.running)
            self.queues["standard"].append(self.now)
            self.dispatch(duration)
            self.now += step


@pytest.mark.parametrize("max_wait", [None, "1s"])
def test_a_batch_job_on_a_busy_lane_starts_once_it_has_waited_max_wait(
    max_wait: str | None,
) -> None:
    table = ClassTable(
        [
            ServiceClass("standard", nominal_share=1.0),
            ServiceClass("batch", batch=True, max_wait=max_wait),
        ]
    )
    lane = Lane(table, capacity=4)
    lane.run(500, step=10, duration=100)  # 4 slots, a job every 10 ms of 100 ms each
    lane.queues["batch"].append(lane.now)
    enqueued = lane.now
    lane.run(10_000, step=10, duration=100)
    batch = [(at, arrival) for at, cls, arrival in lane.started if cls == "batch"]
    standard = [(at, arrival) for at, cls, arrival in lane.started if cls == "standard"]
    if max_wait is None:
        assert batch == []  # the lane is never idle: batch never starts
        return
    assert len(batch) == 1
    at = batch[0][0]
    assert at - enqueued > 1000  # not before it aged
    # it took the first start after the standard jobs older than it
    older = [s for s in standard if s[1] < enqueued]
    assert all(start <= at for start, _ in older)
    assert not [s for s in standard if s[1] > enqueued and s[0] < at and s[0] > enqueued + 1000]
