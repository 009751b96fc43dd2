"""The admission policy (fairlane.policy.admission): cost, learned cost, Retry-After, the gate."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fairlane.policy.admission import (
    MAX_TOKENS,
    MIN_CHARGE_MILLI,
    AdmissionClass,
    Coefficients,
    Decision,
    DeferredJob,
    Estimate,
    EstimationSettings,
    LearnedCost,
    PoolConfig,
    PoolState,
    RetryAfterPolicy,
    charge_milli,
    decide,
    drain,
    reservation_units,
    retry_after,
    to_milli,
    too_wide,
    unit_table,
)
from fairlane.policy.classes import ClassTable, ServiceClass

# -- estimates -------------------------------------------------------------------------------


def test_units_follow_the_coefficients() -> None:
    e = Estimate(input_tokens=3000, max_output_tokens=1000, tool_calls=4, tool_seconds=20.0)
    assert e.units(Coefficients()) == pytest.approx(4.0 + 1.0 + 2.0)
    c = Coefficients(per_1k_tokens=2.0, per_tool_call=1.0, per_tool_second=0.0)
    assert e.units(c) == pytest.approx(8.0 + 4.0)


def test_a_models_multiplier_scales_only_the_token_part() -> None:
    c = Coefficients(models={"big-model": 3.0})
    big = Estimate(input_tokens=1000, tool_calls=1, model="big-model")
    other = Estimate(input_tokens=1000, tool_calls=1, model="small-model")
    assert big.units(c) == pytest.approx(3.0 + 0.25)
    assert other.units(c) == pytest.approx(1.0 + 0.25)
    assert Estimate().units(c) == 0.0


def test_coefficients_copy_the_models_and_hash() -> None:
    models = {"m": 2.0}
    c = Coefficients(models=models)
    models["m"] = 100.0
    assert c.multiplier("m") == 2.0
    assert c.multiplier(None) == 1.0
    assert hash(c) == hash(Coefficients(models={"m": 2.0}))
    assert c == Coefficients(models={"m": 2.0})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"per_1k_tokens": -1.0},
        {"per_tool_call": math.inf},
        {"per_tool_second": math.nan},
        {"models": {"m": -0.5}},
        {"models": {"": 1.0}},
    ],
)
def test_bad_coefficients_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Coefficients(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"input_tokens": True}, TypeError),
        ({"input_tokens": 1.5}, TypeError),
        ({"max_output_tokens": -1}, ValueError),
        ({"input_tokens": MAX_TOKENS + 1}, ValueError),
        ({"tool_calls": 10**6 + 1}, ValueError),
        ({"tool_seconds": 1e7 + 1}, ValueError),
        ({"tool_seconds": math.nan}, ValueError),
        ({"tool_seconds": -0.1}, ValueError),
        ({"tool_seconds": "3"}, TypeError),
        ({"model": ""}, TypeError),
        ({"workflow": 3}, TypeError),
    ],
)
def test_absurd_or_malformed_estimates_are_refused(
    kwargs: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Estimate(**kwargs)  # type: ignore[arg-type]


def test_the_largest_estimate_stays_exact_in_milli_units() -> None:
    e = Estimate(MAX_TOKENS, MAX_TOKENS, 10**6, 1e7, model="m")
    milli = to_milli(e.units(Coefficients(models={"m": 10.0})))
    assert milli < 2**53


def test_to_milli_rounds_half_up() -> None:
    assert to_milli(1.0) == 1000
    assert to_milli(0.0005) == 1
    assert to_milli(0.0004) == 0
    assert to_milli(2.5e-3) == 3
    with pytest.raises(ValueError):
        to_milli(-1.0)


# -- reservation and learned cost ------------------------------------------------------------


def test_a_reservation_is_the_larger_cost_times_the_safety_multiplier() -> None:
    s = EstimationSettings()
    assert reservation_units(2.0, None, s) == 2.5
    assert reservation_units(2.0, 8.0, s) == 10.0
    assert reservation_units(8.0, 2.0, s) == 10.0
    assert not too_wide(40.0, s)
    assert too_wide(40.001, s)


def test_estimation_settings_are_checked() -> None:
    assert EstimationSettings(update_window=1).alpha == 1.0
    for kwargs in ({"update_window": 0}, {"safety_multiplier": 0.9}, {"default_units": -1.0}):
        with pytest.raises(ValueError):
            EstimationSettings(**kwargs)  # type: ignore[arg-type]


def test_learned_cost_takes_the_first_sample_then_rises_fast_and_decays_slowly() -> None:
    cost = LearnedCost(update_window=9)  # alpha = 0.2
    assert cost.value is None
    assert cost.observe(10.0) == 10.0
    assert cost.observe(20.0) == 15.0
    assert cost.observe(5.0) == pytest.approx(13.0)
    assert cost.state == (pytest.approx(13.0), 3)
    restored = LearnedCost(9, mean=13.0, samples=3)
    assert restored.observe(5.0) == pytest.approx(cost.observe(5.0))


@given(
    m0=st.floats(0.0, 1e6),
    gap=st.floats(1e-3, 1e6),
    k=st.integers(1, 40),
    window=st.integers(1, 10_000),
)
def test_an_under_declarer_converges_within_the_stated_bound(
    m0: float, gap: float, k: int, window: int
) -> None:
    x = m0 + gap
    cost = LearnedCost(window, mean=m0, samples=1)
    for _ in range(k):
        cost.observe(x)
    value = cost.value
    assert value is not None
    assert x - value == pytest.approx(gap / 2**k, rel=1e-6, abs=1e-9 * x)
    assert value <= x


def test_one_cheap_job_barely_lowers_the_learned_cost() -> None:
    cost = LearnedCost(500, mean=10.0, samples=100)
    assert cost.observe(0.0) == pytest.approx(10.0 * (1 - 2 / 501))


def test_learned_cost_refuses_bad_samples() -> None:
    with pytest.raises(ValueError):
        LearnedCost().observe(-1.0)
    with pytest.raises(ValueError):
        LearnedCost(0)


# -- Retry-After -----------------------------------------------------------------------------

policies = st.builds(
    RetryAfterPolicy,
    base_seconds=st.floats(0.0, 1e4),
    max_seconds=st.floats(1.0, 1e6),
)
counts = st.integers(0, 10_000)
draws = st.floats(0.0, 1.0, exclude_max=True)


def test_retry_after_is_the_spec_formula() -> None:
    p = RetryAfterPolicy()
    assert retry_after(0, 0.5, p) == 2.0
    assert retry_after(3, 0.0, p) == pytest.approx(16 * 0.7)
    assert retry_after(3, 0.999, p) == pytest.approx(16 * (0.7 + 0.6 * 0.999))
    assert retry_after(10, 0.5, p) == 120.0
    assert retry_after(0, 0.0, RetryAfterPolicy(base_seconds=0.1)) == 1.0
    with pytest.raises(ValueError):
        retry_after(-1, 0.5, p)
    with pytest.raises(ValueError):
        retry_after(1, 1.0, p)
    with pytest.raises(ValueError):
        RetryAfterPolicy(max_seconds=0.5)


@given(policies, counts, draws)
def test_retry_after_stays_within_one_second_and_the_cap(
    p: RetryAfterPolicy, n: int, u: float
) -> None:
    assert 1.0 <= retry_after(n, u, p) <= p.max_seconds


@given(policies, counts, draws, draws)
def test_retry_after_grows_with_rejections(p: RetryAfterPolicy, n: int, u: float, v: float) -> None:
    assert retry_after(n + 1, u, p) >= retry_after(n, u, p)
    # The whole range moves up: n+1's lowest is not below n's lowest, nor its highest.
    low, high = 0.0, math.nextafter(1.0, 0.0)
    assert retry_after(n + 1, low, p) >= retry_after(n, low, p)
    assert retry_after(n + 1, high, p) >= retry_after(n, high, p)


@given(policies, counts, draws, draws)
def test_retry_after_is_jittered_unless_capped(
    p: RetryAfterPolicy, n: int, u: float, v: float
) -> None:
    assume(abs(u - v) > 1e-6)
    a, b = retry_after(n, u, p), retry_after(n, v, p)
    capped = {1.0, p.max_seconds}
    if a not in capped and b not in capped:
        assert a != b


@given(policies, draws)
def test_retry_after_is_capped(p: RetryAfterPolicy, u: float) -> None:
    assume(p.base_seconds > 0)
    n = 10_000
    assert retry_after(n, u, p) <= p.max_seconds
    if u >= 0.5 and p.base_seconds * 2**16 >= p.max_seconds:
        assert retry_after(n, u, p) == p.max_seconds


# -- the gate --------------------------------------------------------------------------------

TABLE = ClassTable(
    [
        ServiceClass("guaranteed", nominal_share=0.5),
        ServiceClass("standard", nominal_share=0.35),
        ServiceClass("batch", nominal_share=0.15),
    ]
)
SEED = PoolConfig(
    100.0,
    (
        AdmissionClass("guaranteed", min_units=30, max_queue=200, when_full="reject"),
        AdmissionClass("standard", min_units=20, max_queue=500, when_full="defer"),
        AdmissionClass("batch", min_units=5, max_queue=1000, when_full="defer"),
    ),
    recovery_reserve_units=5.0,
)
MAX_MILLI = 40_000


def ask(
    state: PoolState,
    service_class: str,
    milli: int,
    *,
    tenant: str = "t1",
    fresh: bool = True,
    pool: PoolConfig = SEED,
    table: ClassTable = TABLE,
    deadline_ms: int | None = None,
    apply: bool = True,
) -> Decision:
    d = decide(
        table,
        pool,
        state,
        service_class=service_class,
        tenant=tenant,
        milli_units=milli,
        fresh=fresh,
        deadline_ms=deadline_ms,
        now_ms=1_000,
        max_reservation_milli=MAX_MILLI,
    )
    if apply and d.status == "accepted":
        state.accept(service_class, tenant, milli)
    elif apply and d.status == "deferred":
        state.defer(service_class)
    return d


def test_unit_table_replaces_the_floors_with_milli_units() -> None:
    units = unit_table(TABLE, SEED)
    assert [c.min_slots for c in units] == [30_000, 20_000, 5_000]
    assert [c.nominal_share for c in units] == [0.5, 0.35, 0.15]
    fine = PoolConfig(1.0, (AdmissionClass("standard", min_units=0.07),))
    assert unit_table(TABLE, fine)["standard"].min_slots == 70
    assert unit_table(TABLE, fine)["guaranteed"].min_slots == 0  # not in the pool: defaults


def test_unit_table_refuses_unknown_classes_and_batch_floors() -> None:
    with pytest.raises(ValueError, match="not classes of the lane"):
        unit_table(TABLE, PoolConfig(10.0, (AdmissionClass("vip"),)))
    batch = ClassTable([ServiceClass("standard", 1.0), ServiceClass("bulk", batch=True)])
    with pytest.raises(ValueError, match="batch class"):
        unit_table(batch, PoolConfig(10.0, (AdmissionClass("bulk", min_units=1),)))


def test_pool_config_is_checked() -> None:
    for args in ((0.0, ()), (10.0, (), 11.0), (math.inf, ())):
        with pytest.raises(ValueError):
            PoolConfig(*args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unique"):
        PoolConfig(10.0, (AdmissionClass("a"), AdmissionClass("a")))
    with pytest.raises(ValueError):
        AdmissionClass("a", when_full="drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AdmissionClass("a", max_queue=True)


def test_rule_1_too_wide_is_rejected_even_when_deferring() -> None:
    d = ask(PoolState(), "standard", MAX_MILLI + 1)
    assert d == Decision("rejected", "too_wide")
    assert ask(PoolState(), "standard", MAX_MILLI).status == "accepted"


def test_rule_2_a_passed_deadline_is_rejected() -> None:
    assert ask(PoolState(), "standard", 1000, deadline_ms=1_000) == Decision(
        "rejected", "deadline_unmeetable"
    )
    assert ask(PoolState(), "standard", 1000, deadline_ms=1_001).status == "accepted"


@pytest.mark.parametrize(
    ("service_class", "status"), [("guaranteed", "rejected"), ("standard", "deferred")]
)
def test_the_201st_submission_to_a_class_of_max_queue_200(service_class: str, status: str) -> None:
    pool = PoolConfig(
        100.0,
        (
            AdmissionClass(
                service_class, max_queue=200, when_full=SEED.admission(service_class).when_full
            ),
        ),
        5.0,
    )
    state = PoolState()
    for i in range(200):
        assert ask(state, service_class, 400, tenant=f"t{i % 7}", pool=pool).status == "accepted"
    assert ask(state, service_class, 400, pool=pool) == Decision(status, "class_queue_full")
    state.release(service_class, "t0", 400)
    assert ask(state, service_class, 400, pool=pool).status == "accepted"


def test_max_queue_units_bounds_the_reserved_units_of_a_class() -> None:
    pool = PoolConfig(100.0, (AdmissionClass("standard", max_queue_units=3.0),))
    state = PoolState()
    assert ask(state, "standard", 2000, pool=pool).status == "accepted"
    assert ask(state, "standard", 1001, pool=pool) == Decision("rejected", "class_queue_full")
    assert ask(state, "standard", 1000, pool=pool).status == "accepted"


def test_a_full_tenant_queue_does_not_affect_another_tenant() -> None:
    pool = PoolConfig(100.0, (AdmissionClass("standard", tenant_max_queue=2),))
    state = PoolState()
    assert ask(state, "standard", 1000, tenant="a", pool=pool).status == "accepted"
    assert ask(state, "standard", 1000, tenant="a", pool=pool).status == "accepted"
    assert ask(state, "standard", 1000, tenant="a", pool=pool) == Decision(
        "rejected", "tenant_queue_full"
    )
    assert ask(state, "standard", 1000, tenant="b", pool=pool).status == "accepted"
    assert ask(state, "guaranteed", 1000, tenant="a", pool=pool).status == "accepted"


def test_a_full_pool_is_class_full_and_deferral_is_bounded() -> None:
    pool = PoolConfig(10.0, (AdmissionClass("standard", when_full="defer", max_deferred=1),))
    state = PoolState()
    assert ask(state, "standard", 10_000, pool=pool).status == "accepted"
    assert ask(state, "standard", 1, pool=pool) == Decision("deferred", "class_full")
    assert ask(state, "standard", 1, pool=pool) == Decision("rejected", "class_full")
    # A retry is already durable: deferred whatever the bounds say.
    assert ask(state, "standard", 1, pool=pool, fresh=False) == Decision("deferred", "class_full")


def test_the_recovery_reserve_is_only_for_retries() -> None:
    state = PoolState()
    assert ask(state, "guaranteed", 40_000).status == "accepted"
    assert ask(state, "standard", 40_000).status == "accepted"
    # 20 units free, 5 of them the recovery reserve.
    assert ask(state, "standard", 15_001, apply=False) == Decision("deferred", "class_full")
    assert ask(state, "standard", 15_000).status == "accepted"
    assert ask(state, "guaranteed", 1, apply=False) == Decision("rejected", "class_full")
    assert ask(state, "guaranteed", 5_000, fresh=False).status == "accepted"
    assert state.total_reserved == 100_000
    assert ask(state, "guaranteed", 1, fresh=False) == Decision("deferred", "class_full")


def test_a_lenders_reserve_is_kept_from_borrowers() -> None:
    table = ClassTable(
        [ServiceClass("guaranteed", 0.5, lendable=0.0), ServiceClass("standard", 0.5)]
    )
    pool = PoolConfig(10.0)
    state = PoolState()
    assert ask(state, "standard", 5_000, table=table, pool=pool).status == "accepted"
    assert ask(state, "standard", 1, table=table, pool=pool) == Decision("rejected", "class_full")
    assert ask(state, "guaranteed", 5_000, table=table, pool=pool).status == "accepted"


def test_a_zero_unit_request_reserves_nothing() -> None:
    state = PoolState()
    assert ask(state, "standard", 0).status == "accepted"
    assert state.total_reserved == 0
    assert state.admitted == {"standard": 1}


def test_unknown_classes_and_bad_releases_raise() -> None:
    with pytest.raises(ValueError, match="unknown service class"):
        ask(PoolState(), "vip", 1)
    with pytest.raises(ValueError):
        ask(PoolState(), "standard", -1)
    with pytest.raises(ValueError, match="never admitted"):
        PoolState().release("standard", "t", 1)
    with pytest.raises(ValueError, match="no deferred"):
        PoolState().undefer("standard")


def test_drain_admits_deferred_heads_in_table_order_until_one_does_not_fit() -> None:
    pool = PoolConfig(
        10.0,
        (AdmissionClass("standard", when_full="defer"), AdmissionClass("batch", when_full="defer")),
    )
    state = PoolState()
    assert ask(state, "guaranteed", 10_000, pool=pool).status == "accepted"
    queues: dict[str, deque[DeferredJob]] = {"standard": deque(), "batch": deque()}
    for name, milli in (
        ("batch", 1_000),
        ("standard", 3_000),
        ("standard", 6_000),
        ("standard", 2_000),
    ):
        assert ask(state, name, milli, pool=pool).status == "deferred"
        queues[name].append(DeferredJob("t1", milli))
    state.release("guaranteed", "t1", 10_000)
    admitted = drain(TABLE, pool, state, queues)
    assert [(name, job.milli_units) for name, job in admitted] == [
        ("standard", 3_000),
        ("standard", 6_000),
        ("batch", 1_000),
    ]
    assert list(queues["standard"]) == [DeferredJob("t1", 2_000)]
    assert state.deferred == {"standard": 1, "batch": 0}
    assert state.total_reserved == 10_000


# Each example runs 200 decisions through the class rules; no per-example deadline.
@settings(deadline=None, max_examples=60)
@given(st.integers(0, 2**32 - 1))
def test_random_sequences_keep_reservations_and_queues_bounded(seed: int) -> None:
    rng = random.Random(seed)
    pool = PoolConfig(
        rng.choice([1.0, 10.0, 100.0]),
        (
            AdmissionClass(
                "guaranteed",
                min_units=rng.choice([0.0, 3.0]),
                max_queue=5,
                tenant_max_queue=rng.choice([None, 2]),
            ),
            AdmissionClass("standard", max_queue=8, when_full="defer", max_deferred=3),
            AdmissionClass("batch", max_queue=rng.choice([0, 4]), when_full="defer"),
        ),
        recovery_reserve_units=rng.choice([0.0, 0.5]),
    )
    capacity = pool.capacity_milli
    state = PoolState()
    live: list[tuple[str, str, int]] = []
    for _ in range(200):
        if live and rng.random() < 0.4:
            state.release(*live.pop(rng.randrange(len(live))))
        else:
            name = rng.choice(TABLE.names)
            tenant = rng.choice("abc")
            milli = rng.choice([0, 1, 250, 1_000, 5_000, 30_000, 50_000])
            fresh = rng.random() < 0.8
            deferred = state.deferred.get(name, 0)
            d = ask(state, name, milli, tenant=tenant, fresh=fresh, pool=pool)
            if d.status == "accepted":
                live.append((name, tenant, milli))
            if d.status == "rejected" and d.reason not in ("too_wide", "deadline_unmeetable"):
                spec = pool.admission(name)
                assert fresh
                assert spec.when_full == "reject" or deferred >= spec.deferred_limit
        assert state.total_reserved <= capacity
        for spec in pool.classes:
            assert state.admitted.get(spec.name, 0) <= spec.max_queue
            for tenant in "abc":
                assert state.tenant_admitted.get((spec.name, tenant), 0) <= spec.tenant_limit


def test_a_job_is_charged_its_learned_cost_or_its_declared_one_if_more() -> None:
    assert charge_milli(None, None) == MIN_CHARGE_MILLI  # nothing known: the least
    assert charge_milli(None, 0.2) == MIN_CHARGE_MILLI  # too cheap to measure
    assert charge_milli(None, 5_000.0) == 5_000.0  # learned
    assert charge_milli(10, 5_000.0) == 5_000.0  # declaring less does not pay
    assert charge_milli(8_000, 5_000.0) == 8_000.0  # declaring more is believed
    assert charge_milli(8_000, None) == 8_000.0
