"""The reference model's invariants: what must hold of its state after every operation.

``fairlane.policy.reference.model`` states them (invariants 1-5 of its docstring) and
``QueueModel.check_invariants`` checks them after each step of the agreement tests;
the store's own state is held to the same ones, read back from the server, by
``tests/store/test_model_vs_lua.py``. These functions only read: they raise
``AssertionError`` naming the first broken invariant.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from fairlane.policy.reference.dispatch import LaneModel, ModelJob
from fairlane.policy.throttle import Throttles

__all__ = ["check_jobs", "check_lanes"]


def check_jobs(
    jobs: Mapping[str, ModelJob],
    lanes: Mapping[str, LaneModel],
    throttles: Throttles,
    *,
    leases: Mapping[str, int],
    dead: Mapping[str, int],
    fence: int,
    parked: Iterable[Mapping[str, float]] = (),
) -> None:
    """Invariants 1, 3, 4 and 5 for every job: one place matching its status (a job a
    pause parked is queued, in its parked set), its attempts within budget, distinct
    tokens none above the counter, its throttle grant (only while running) and offers
    (only while queued)."""
    queued: Counter[str] = Counter()
    for ids in parked:
        queued.update(ids.keys())
    scheduled: Counter[str] = Counter()
    for lane in lanes.values():
        scheduled.update(lane.delayed.keys())
        for cq in lane.classes.values():
            queued.update(i for q in cq.queues.values() for _, i in q)
    for job in jobs.values():
        places = (
            queued[job.id], int(throttles.parked_on(job.id) is not None),
            scheduled[job.id], int(job.id in leases),
        )  # fmt: skip
        expected = {
            "queued": (1, 0, 0, 0),
            "throttled": (0, 1, 0, 0),
            "scheduled": (0, 0, 1, 0),
            "running": (0, 0, 0, 1),
        }.get(job.status, (0, 0, 0, 0))
        assert places == expected, f"{job.id} ({job.status}) is in {places}"
        assert (job.id in dead) == (job.status == "failed"), f"{job.id} dead set"
        assert 0 <= job.attempts <= job.max_attempts, f"{job.id} attempts {job.attempts}"
        assert (job.token is not None) == (job.status == "running"), f"{job.id} token"
        assert job.status != "running" or job.attempts >= 1, f"{job.id} runs unattempted"
        assert throttles.token(job.id) == job.ttok, f"{job.id} throttle grant {job.ttok}"
        assert job.ttok is None or job.status == "running", f"{job.id} grant while waiting"
        offered = throttles.offered(job.id) is not None
        assert not offered or job.status == "queued", f"{job.id} offers while {job.status}"
    tokens = [j.token for j in jobs.values() if j.token is not None]
    assert len(tokens) == len(set(tokens)), "two running jobs share a token"
    assert all(t <= fence for t in tokens), "a token above the counter"


def check_lanes(
    jobs: Mapping[str, ModelJob],
    lanes: Mapping[str, LaneModel],
    throttles: Throttles,
    *,
    held: Mapping[tuple[str, str], set[str]] | None = None,
    parked: Iterable[Mapping[str, float]] = (),
) -> None:
    """Invariants 2 and 5 for every lane and throttle key: a tenant is active exactly
    while it waits (or inactive, held by a pause), in-flight and waiting slots are the
    jobs' widths (a parked job's are not waiting), a key with waiters has no room
    (``Throttles``' I3)."""
    held = held or {}
    out = {i for ids in parked for i in ids}
    for name, lane in lanes.items():
        running = [j for j in jobs.values() if j.lane == name and j.status == "running"]
        waiting = [
            j for j in jobs.values() if j.lane == name and j.status == "queued" and j.id not in out
        ]
        for cls, cq in lane.classes.items():
            for tenant, queue in cq.queues.items():
                active = tenant in cq.fair
                was_held = tenant in held.get((name, cls), ())
                assert active == bool(queue) or (was_held and not active), (
                    f"tenant {tenant} of {name}/{cls}: {active}"
                )
            mine = [j for j in running if j.cls == cls]
            assert cq.run == len(mine), f"in-flight work of {name}/{cls}"
        for cls in set(lane.in_flight) | set(lane.waiting) | {j.cls for j in running}:
            f = sum(j.slots for j in running if j.cls == cls)
            d = sum(j.slots for j in waiting if j.cls == cls)
            assert lane.in_flight[cls] == f, f"in-flight slots of {name}/{cls}"
            assert lane.waiting[cls] == d, f"waiting slots of {name}/{cls}"
    for key in throttles.statistics().keys:
        room = key.limit - key.in_use - key.offers
        assert not key.waiters or room <= 0, f"key {key.key} idles with room {room}"
