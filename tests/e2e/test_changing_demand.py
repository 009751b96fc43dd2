"""Weighted fair shares while demand changes: tenants join and leave a busy lane.

One worker of ``SLOTS`` slots runs short no-op jobs; tasks record who starts, in order,
and the test counts (no timing asserts). Three phases, each a change made while the
worker runs flat out:

1. ``a`` (weight 1) and ``b`` (weight 2) are backlogged: shares 1/3, 2/3;
2. ``c`` (weight 3) joins with a backlog of its own: 1/6, 2/6, 3/6;
3. ``a`` leaves (its waiting jobs drained): ``b`` and ``c`` share 2/5, 3/5.

In each phase the share of starts of every backlogged tenant is held to ``w_i / sum(w)``
over the tenants backlogged then, within a tolerance derived below.

**The tolerance.** Fair dispatch is start-time fair queuing at one unit per job: over
any stretch in which tenants ``i`` and ``j`` both stay backlogged, ``|S_i/w_i - S_j/w_j|
<= 1/w_i + 1/w_j`` (``fairlane.policy.fairqueue``). Summing over ``j`` weighted by
``w_j`` gives ``|S_i - N w_i/W| <= 1 + n w_i/W <= n + 1`` jobs for a run of ``N``
dispatches among ``n`` tenants of total weight ``W``. The test counts *starts*, not
dispatches: at most ``SLOTS`` jobs are leased and not yet started at any moment (no
prefetch), so

* after a change at most ``SLOTS`` jobs dispatched under the old rule still start; the
  window of a phase opens ``SLOTS`` starts after the change was made (those are
  skipped), and any old-rule job left in it is one of at most ``SLOTS``;
* at the window's two ends at most ``SLOTS`` jobs of the phase's own run of dispatches
  are cut off each (skipped at the start, or not started yet when the next change is
  made).

Those shift tenant ``i``'s count against ``N w_i/W`` by at most ``2 * SLOTS`` more, so
over a window of ``N`` starts the share is within ``(n + 1 + 2 * SLOTS) / N`` of the
weighted fair share. With ``N`` of at least ``WINDOW`` starts this is about 0.04, well
under the gap to an unweighted split (which the test checks too, so that it could fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from tests.e2e.helpers import WAIT, make_app, running_worker

pytestmark = pytest.mark.anyio

SLOTS = 8
#: starts measured in each phase, at least
WINDOW = 480
WEIGHTS = {"a": 1.0, "b": 2.0, "c": 3.0}
#: each tenant's backlog: more than it can get through the three phases
BACKLOG = 1500


def _tolerance(active: Sequence[str], window: int) -> float:
    return (len(active) + 1 + 2 * SLOTS) / window


def _check_phase(name: str, started: list[str], lo: int, hi: int, active: Sequence[str]) -> None:
    window = started[lo:hi]
    assert len(window) >= WINDOW, (name, lo, hi)
    total = sum(WEIGHTS[t] for t in active)
    tol = _tolerance(active, len(window))
    shares = {t: window.count(t) / len(window) for t in active}
    print(f"{name}: {len(window)} starts, shares {shares}, tolerance {tol:.3f}")
    # nobody else starts in the window but, at most, the leavers' last leased jobs
    assert sum(window.count(t) for t in active) >= len(window) - SLOTS, (name, window)
    for t in active:
        fair = WEIGHTS[t] / total
        assert abs(shares[t] - fair) <= tol, (name, t, shares[t], fair, tol)
    # the tolerance is tight enough to tell weights from an even split
    assert any(abs(WEIGHTS[t] / total - 1 / len(active)) > 2 * tol for t in active), name


async def test_shares_follow_the_weights_of_whoever_is_backlogged(
    redis_url: str, namespace: str
) -> None:
    app = make_app(namespace, redis_url)
    started: list[str] = []
    target = [0]
    reached = asyncio.Event()

    @app.task
    async def work(owner: str) -> None:
        started.append(owner)
        if len(started) >= target[0]:
            reached.set()

    async def until(n: int) -> int:
        target[0] = n
        reached.clear()
        if len(started) < n:
            async with asyncio.timeout(WAIT):
                await reached.wait()
        return len(started)

    async with app:
        for tenant, weight in WEIGHTS.items():
            await app.tenants.configure(tenant, weight=weight)
        for tenant in ("a", "b"):
            await work.enqueue_many([(tenant,)] * BACKLOG, tenant=tenant)
        async with running_worker(app, concurrency=SLOTS):
            # phase 1 from the first start: a and b were both waiting before the worker ran
            c_joins = await until(WINDOW)
            await work.enqueue_many([("c",)] * BACKLOG, tenant="c")
            c_joined = len(started)
            a_leaves = await until(c_joined + SLOTS + WINDOW)
            report = await app.drain(tenant="a")
            a_left = len(started)
            end = await until(a_left + SLOTS + WINDOW)
            assert report.cancelled > 0  # a was still backlogged when it left
    for tenant in WEIGHTS:
        # every tenant was still backlogged at the end of its last phase
        assert started[:end].count(tenant) < BACKLOG, tenant
    _check_phase("a, b", started, 0, c_joins, ["a", "b"])
    _check_phase("a, b, c", started, c_joined + SLOTS, a_leaves, ["a", "b", "c"])
    _check_phase("b, c", started, a_left + SLOTS, end, ["b", "c"])
