"""The simulator's fast paths agree with the policy core's own objects on random cases.

``fairlane.sim.fastpath`` re-states four decisions of ``fairlane.policy`` on plain lists;
each test drives the fast path and the core's object with the same random inputs and
requires the same answers: ``ClassChooser`` against ``classes.allocate`` (memoised or
not), ``FairClass`` against ``fairqueue.FairQueue`` (same dispatches, bit-equal tags),
``Gate`` against ``admission.fits``; and the throttle keys (``fairlane.sim.keys``, both
rules) against the naive model of the rules in ``tests/sim/naive_keys.py``.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fairlane.policy.admission import AdmissionClass, PoolConfig, PoolState, fits
from fairlane.policy.classes import ClassTable, ServiceClass, allocate
from fairlane.policy.fairqueue import FairQueue, job_order
from fairlane.sim.fastpath import ClassChooser, FairClass, Gate
from fairlane.sim.keys import FairKeys, FifoKeys
from tests.sim.naive_keys import NaiveJob, NaiveKeys


@st.composite
def service_class(draw: st.DrawFn, name: str) -> ServiceClass:
    if draw(st.booleans()) and draw(st.booleans()):
        return ServiceClass(name, lendable=draw(st.sampled_from([0.0, 0.5, 1.0])), batch=True)
    return ServiceClass(
        name,
        nominal_share=draw(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.6])),
        min_slots=draw(st.integers(0, 3)),
        lendable=draw(st.sampled_from([0.0, 0.25, 0.5, 1.0])),
        borrowable=draw(st.sampled_from([None, 0.0, 0.5, 1.0])),
    )


@st.composite
def tables(draw: st.DrawFn) -> ClassTable:
    n = draw(st.integers(1, 4))
    classes = [draw(service_class(f"c{i}")) for i in range(n)]
    assume(sum(c.nominal_share for c in classes if not c.batch) <= 1.0)
    return ClassTable(classes)


@settings(max_examples=150, deadline=None)
@given(table=tables(), capacity=st.integers(0, 24), data=st.data())
def test_chooser_agrees_with_allocate(table: ClassTable, capacity: int, data: Any) -> None:
    chooser = ClassChooser(table, capacity)
    for _ in range(5):
        f = [data.draw(st.integers(0, capacity + 2)) for _ in table]
        w = [data.draw(st.sampled_from([0, 0, 1, 1, 2, 3, 5, 8])) for _ in table]
        d = [data.draw(st.integers(0, 12)) for _ in table]
        names = table.names
        core = allocate(
            table,
            capacity,
            dict(zip(names, f, strict=True)),
            {n: (x or None) for n, x in zip(names, w, strict=True)},
            demand=dict(zip(names, d, strict=True)),
        ).chosen
        fast = chooser.choose(f, w, d)
        assert (names[fast] if fast >= 0 else None) == core


@settings(max_examples=100, deadline=None)
@given(table=tables(), capacity=st.integers(0, 24), data=st.data())
def test_memoised_narrow_choice_agrees_with_allocate(
    table: ClassTable, capacity: int, data: Any
) -> None:
    chooser = ClassChooser(table, capacity)
    for _ in range(8):
        f = [data.draw(st.integers(0, capacity)) for _ in table]
        d = [data.draw(st.sampled_from([0, 0, 1, 2, 3, 7, 40])) for _ in table]
        names = table.names
        core = allocate(
            table,
            capacity,
            dict(zip(names, f, strict=True)),
            {n: (1 if x else None) for n, x in zip(names, d, strict=True)},
            demand=dict(zip(names, d, strict=True)),
        ).chosen
        for _ in range(2):  # computed, then from the memo
            fast = chooser.choose_narrow(f, d)
            assert (names[fast] if fast >= 0 else None) == core


ops_st = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 4), st.floats(0.05, 5.0)),
        st.tuples(st.just("pop"), st.just(0), st.just(0.0)),
        st.tuples(st.just("drop"), st.just(0), st.just(0.0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    ops=ops_st,
    weights=st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 5.0]), min_size=5, max_size=5),
)
def test_fair_class_agrees_with_fair_queue(
    ops: list[tuple[str, int, float]], weights: list[float]
) -> None:
    names = ["t-a", "t-b", "t-c", "t-d", "t-e"]
    core = FairQueue()
    for name, w in zip(names, weights, strict=True):
        core.set_weight(name, w)
    queues: list[deque[Any]] = [deque() for _ in names]
    fast = FairClass([0.0] * len(names), queues, weights, names)
    for seq, (op, t, cost) in enumerate(ops):
        if op == "push":
            activated = core.push(names[t], f"j{seq}", cost, job_order(0, seq))
            assert fast.push(t, (f"j{seq}", cost)) == activated
            continue
        if op == "drop":  # the head job taken out uncharged: FairQueue.remove (rule 3)
            head = fast.head()
            if head >= 0:
                assert core.active_tenants()[0] == names[head]
                assert core.remove(fast.drop()[0])
            continue
        dispatch = core.pop()
        head = fast.head()
        if dispatch is None:
            assert head == -1
            continue
        job_id, job_cost = queues[head][0]
        start = fast.active[0][0]
        fast.pop(job_cost)
        assert (names[head], job_id, start, fast.tags[head]) == (
            dispatch.tenant, dispatch.job_id, dispatch.start_tag, dispatch.finish_tag,
        )  # fmt: skip
        assert fast.v == core.virtual_time


@st.composite
def pools(draw: st.DrawFn) -> tuple[ClassTable, PoolConfig]:
    table = draw(tables())
    capacity = draw(st.sampled_from([1.0, 2.0, 4.0, 6.5, 10.0]))
    specs = []
    for c in table:
        specs.append(
            AdmissionClass(
                c.name,
                min_units=0.0 if c.batch else draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
                max_queue=draw(st.integers(0, 8)),
                max_queue_units=draw(st.sampled_from([None, 1.0, 3.0, 5.0])),
                tenant_max_queue=draw(st.sampled_from([None, 1, 2, 4])),
                tenant_max_queue_units=draw(st.sampled_from([None, 1.0, 2.5])),
            )
        )
    reserve = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return table, PoolConfig(capacity, tuple(specs), min(reserve, capacity))


@settings(max_examples=150, deadline=None)
@given(pool=pools(), data=st.data())
def test_gate_agrees_with_admission_fits(pool: tuple[ClassTable, PoolConfig], data: Any) -> None:
    table, config = pool
    gate = Gate(table, config)
    cap = config.capacity_milli
    reserved = [data.draw(st.integers(0, cap)) for _ in table]
    admitted = [data.draw(st.integers(0, 8)) for _ in table]
    i = data.draw(st.integers(0, len(table) - 1))
    mine_jobs = data.draw(st.integers(0, 4))
    mine_milli = data.draw(st.integers(0, reserved[i]))
    mu = data.draw(st.sampled_from([0, 1, 250, 1000, 1500, 3000]))
    fresh = data.draw(st.booleans())
    name = table.names[i]
    state = PoolState(
        reserved=dict(zip(table.names, reserved, strict=True)),
        admitted=dict(zip(table.names, admitted, strict=True)),
        tenant_admitted={(name, "t"): mine_jobs},
        tenant_reserved={(name, "t"): mine_milli},
    )
    core = fits(table, config, state, service_class=name, tenant="t", milli_units=mu, fresh=fresh)
    fast = gate.fits(
        i, mu, reserved, admitted, tenant_admitted=mine_jobs, tenant_reserved=mine_milli,
        fresh=fresh,
    )  # fmt: skip
    assert fast == core


# tenants a, b, c: a has its own key, b and c share model:x, c also db:y
_KEYS_OF = {"a": ("tenant:a",), "b": ("model:x",), "c": ("db:y", "model:x")}
_TENANTS = ("a", "b", "c")
_WEIGHT = {"a": 1.0, "b": 2.0, "c": 1.0}

key_ops = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.integers(0, 40), st.integers(1, 3)),
        st.tuples(st.just("release"), st.integers(0, 40), st.just(0)),
        st.tuples(st.just("limit"), st.just(0), st.integers(0, 4)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=key_ops, fair=st.booleans(), shared=st.integers(1, 3))
def test_key_tables_agree_with_the_rules(
    ops: list[tuple[str, int, int]], fair: bool, shared: int
) -> None:
    """FairKeys / FifoKeys against the naive model: same admissions, same wakes in the
    same order, same slots in use and offers; ``dispatch`` offers a new job (x picks
    the tenant) or, when x is odd and one waits, a woken job back at its dispatch."""
    names = ["tenant:a", "tenant:b", "tenant:c", "model:x", "db:y"]
    index = {k: i for i, k in enumerate(names)}
    limits = [0, 0, 0, shared, 1]
    keys_of = [tuple(index[k] for k in _KEYS_OF[t]) for t in _TENANTS]
    cost = {"a": 1.0, "b": 0.5, "c": 2.0}
    waited: list[list[int]] = [[], [], []]
    fast: FairKeys | FifoKeys = (
        FairKeys(limits, keys_of, waited, names=_TENANTS,
                 weights=[_WEIGHT[t] for t in _TENANTS],
                 cost_of=lambda job: cost[_TENANTS[job[1]]])
        if fair
        else FifoKeys(limits, keys_of, waited)
    )  # fmt: skip
    naive = NaiveKeys(dict(zip(names, limits, strict=True)), fair=fair)
    jobs: dict[int, tuple[list[Any], NaiveJob]] = {}
    held: list[int] = []
    woken: list[int] = []  # offered (fair) or granted (fifo), not yet started
    out: list[Any] = []

    def woke(got: list[NaiveJob]) -> None:
        assert [j[0] for j in out] == [int(j.id) for j in got]
        (woken if fair else held).extend(j[0] for j in out)
        out.clear()

    for seq, (op, x, lim) in enumerate(ops):
        if op == "limit":
            fast.set_limit(0, lim, out)
            woke(naive.set_limit("tenant:a", lim))
        elif op == "release":
            if held:
                i = held.pop(x % len(held))
                fast.release(keys_of[jobs[i][0][1]], out)
                woke(naive.release(jobs[i][1]))
        else:
            if fair and x % 2 and woken:
                i = woken.pop(0)
            else:
                t = _TENANTS[x % 3]
                i = seq
                jobs[i] = ([i, x % 3, 0.0, 1.0, -1.0, 0, 0.0, 0, None],
                           NaiveJob(str(i), t, i, _KEYS_OF[t], _WEIGHT[t], cost[t]))  # fmt: skip
                if t == "a":  # a's own key: the limit comes with each dispatch
                    fast.set_limit(0, lim, out)
                    woke(naive.set_limit("tenant:a", lim))
            admitted = fast.take(jobs[i][0], out)
            got, others = naive.take(jobs[i][1])
            assert admitted == got
            woke(others)
            if admitted:
                held.append(i)
        for k, name in enumerate(names):
            assert fast.in_use[k] == naive.in_use[name]
            if isinstance(fast, FairKeys):
                assert fast.offers[k] == naive.offers[name]
                assert fast.room(k) == naive.room(name)


def _random_table(rng: random.Random) -> ClassTable:
    while True:
        classes = []
        for i in range(rng.randint(1, 4)):
            if rng.random() < 0.2:
                classes.append(ServiceClass(f"c{i}", lendable=rng.random(), batch=True))
            else:
                classes.append(
                    ServiceClass(
                        f"c{i}",
                        nominal_share=rng.choice([0.0, 0.1, 0.2, 0.25, 0.3, 0.5, 0.6]),
                        min_slots=rng.randint(0, 3),
                        lendable=rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]),
                        borrowable=rng.choice([None, 0.0, 0.5, 1.0]),
                    )
                )
        if sum(c.nominal_share for c in classes if not c.batch) <= 1.0:
            return ClassTable(classes)


def test_chooser_agrees_with_allocate_on_many_seeded_cases() -> None:
    """Dense seeded sampling near the assured levels, where claims and holds matter."""
    rng = random.Random(20241)
    for _ in range(400):
        table, capacity = _random_table(rng), rng.randint(1, 20)
        chooser = ClassChooser(table, capacity)
        names = table.names
        for _ in range(40):
            f = [max(0, a + rng.randint(-3, 2)) for a in chooser.a]
            w = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in names]
            d = [rng.choice([0, 1, 2, 4, 9]) for _ in names]
            core = allocate(
                table, capacity, dict(zip(names, f, strict=True)),
                {n: (x or None) for n, x in zip(names, w, strict=True)},
                demand=dict(zip(names, d, strict=True)),
            ).chosen  # fmt: skip
            fast = chooser.choose(f, w, d)
            assert (names[fast] if fast >= 0 else None) == core, (table, capacity, f, w, d)


def test_gate_agrees_with_admission_fits_on_many_seeded_cases() -> None:
    rng = random.Random(20242)
    for _ in range(300):
        table = _random_table(rng)
        capacity = rng.choice([1.0, 2.0, 4.0, 6.5, 10.0])
        config = PoolConfig(
            capacity,
            tuple(
                AdmissionClass(
                    c.name,
                    min_units=0.0 if c.batch else rng.choice([0.0, 0.5, 1.0, 2.0]),
                    max_queue=rng.randint(0, 8),
                    tenant_max_queue=rng.choice([None, 1, 2, 4]),
                )
                for c in table
            ),
            rng.choice([0.0, 0.5, 1.0]),
        )
        gate, cap = Gate(table, config), config.capacity_milli
        for _ in range(20):
            reserved = [rng.choice([0, cap // 4, cap // 2, cap - 1000, cap]) for _ in table]
            admitted = [rng.randint(0, 8) for _ in table]
            i = rng.randrange(len(table))
            mu, fresh = rng.choice([0, 1, 500, 1000, 2000]), rng.random() < 0.7
            name = table.names[i]
            state = PoolState(
                reserved=dict(zip(table.names, reserved, strict=True)),
                admitted=dict(zip(table.names, admitted, strict=True)),
            )
            core = fits(
                table, config, state, service_class=name, tenant="t", milli_units=mu,
                fresh=fresh,
            )  # fmt: skip
            fast = gate.fits(
                i, mu, reserved, admitted, tenant_admitted=0, tenant_reserved=0, fresh=fresh
            )
            assert fast == core
