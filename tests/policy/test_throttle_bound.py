"""The fairness bound of a shared throttle key (``fairlane.policy.throttle``, Proofs).

Random runs of tenants with weights 1-3 sharing key ``m`` (limit 1-3), jobs of charges
0.5-2 naming ``m`` and maybe other keys (``a`` before it and ``z`` after it, so a waiter
may move between keys), releases and woken jobs converting their offers in any order.
At every prefix of a run, for every window of operations over which a tenant stayed
backlogged on ``m`` (its group non-empty, never re-formed), the charge woken for it on
``m`` is at least its weight share of the window's wakes, less one maximal charge of
its own and one per other tenant served in the window.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fairlane.policy.throttle import Acquired, Throttles, Wake

TENANTS = ("t1", "t2", "t3")
SHARED = "m"
EXTRA = {"a": 1, "z": 2}

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("arrive"),
            st.sampled_from(TENANTS),
            st.sampled_from([(), (), (), ("a",), ("z",), ("a", "z")]),
            st.sampled_from([1.0, 1.0, 0.5, 2.0]),
            st.sampled_from([1, 1, 1, 8]),  # a burst of jobs alike
        ),
        st.tuples(st.just("release"), st.integers(0, 50)),
        st.tuples(st.just("run"), st.integers(0, 50)),
    ),
    min_size=20,
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    operations=ops,
    limit=st.integers(1, 3),
    weights=st.tuples(*(st.sampled_from([1.0, 2.0, 3.0]) for _ in TENANTS)),
)
def test_a_backlogged_tenant_loses_at_most_one_charge_per_tenant(
    operations: list[tuple[object, ...]], limit: int, weights: tuple[float, ...]
) -> None:
    weight = dict(zip(TENANTS, weights, strict=True))
    thr = Throttles(weight)
    tenant_of: dict[str, str] = {}
    charge_of: dict[str, float] = {}
    top: dict[str, float] = dict.fromkeys(TENANTS, 0.0)  # each tenant's largest charge
    holders: list[str] = []
    offered: list[str] = []
    served: list[list[tuple[str, float]]] = []  # per operation: (tenant, charge) woken on m
    epochs: list[dict[str, int | None]] = [{t: None for t in TENANTS}]  # after each op

    def woke(wakes: tuple[Wake, ...] | list[Wake], out: list[tuple[str, float]]) -> None:
        for w in wakes:
            offered.append(w.job_id)
            if w.key == SHARED:
                out.append((tenant_of[w.job_id], charge_of[w.job_id]))

    for n, op in enumerate(operations):
        now: list[tuple[str, float]] = []
        if op[0] == "arrive":
            _, tenant, extra, charge, burst = op
            assert isinstance(tenant, str) and isinstance(charge, float)
            assert isinstance(burst, int)
            top[tenant] = max(top[tenant], charge)
            for k in range(burst):
                job = f"j{n}.{k}"
                tenant_of[job], charge_of[job] = tenant, charge
                keys = {SHARED: limit, **{x: EXTRA[x] for x in extra}}  # type: ignore[union-attr]
                got = thr.try_acquire(job, keys, 0, 10 * n + k, tenant=tenant, charge=charge)
                woke(got.wakes, now)
                if isinstance(got, Acquired):
                    holders.append(job)
        elif op[0] == "release" and holders:
            job = holders.pop(int(op[1]) % len(holders))  # type: ignore[call-overload]
            woke(thr.release(job), now)
        elif op[0] == "run" and offered:
            job = offered.pop(int(op[1]) % len(offered))  # type: ignore[call-overload]
            got = thr.try_acquire(job, {}, 0, 0, tenant=tenant_of[job], charge=charge_of[job])
            woke(got.wakes, now)
            if isinstance(got, Acquired):
                holders.append(job)
        served.append(now)
        epochs.append({t: thr.epoch(SHARED, t) for t in TENANTS})
        _check_windows(served, epochs, weight, top)


def _check_windows(
    served: list[list[tuple[str, float]]],
    epochs: list[dict[str, int | None]],
    weight: dict[str, float],
    top: dict[str, float],
) -> None:
    """The bound over every window (a, b] ending at the latest operation b."""
    b = len(served)
    got: dict[str, float] = dict.fromkeys(TENANTS, 0.0)
    for a in range(b - 1, -1, -1):
        for tenant, charge in served[a]:
            got[tenant] += charge
        total = sum(got.values())
        for i in TENANTS:
            if epochs[a][i] is None or epochs[a][i] != epochs[b][i]:
                continue  # not backlogged on m throughout (a, b]
            others = [j for j in TENANTS if j != i and got[j] > 0]
            share = weight[i] / (weight[i] + sum(weight[j] for j in others))
            slack = top[i] + sum(top[j] for j in others)
            assert got[i] >= share * total - slack - 1e-9, (i, a, b, got, share, slack)
