"""Restricted classes from Python: only an entitled tenant's jobs are stored in them.

The default ``guaranteed`` class is restricted. A tenant is entitled to it with
``app.tenants.configure(tenant, classes=["guaranteed"])`` and may be given it as the
class of its jobs that name none (``default_class``); ``reset`` lifts both. The store
decides, at enqueue and again when a retry is due, so these tests run on a real server.
"""

from __future__ import annotations

import pytest

from fairlane import App, Backoff, Rejected, ServiceClass
from fairlane.config.files import ConfigError
from fairlane.config.lanes import parse_lanes
from fairlane.config.pools import parse_config
from fairlane.errors import TaskFailed
from fairlane.policy.classes import DEFAULT_CLASSES, ClassTable, Entitlement
from tests.e2e.helpers import WAIT, app_keys, eventually, make_app, running_worker

pytestmark = pytest.mark.anyio


def _app(namespace: str, redis_url: str) -> App:
    app = make_app(namespace, redis_url)

    @app.task(name="echo")
    async def echo(text: str) -> str:
        return text

    @app.task(name="flaky", attempts=3, backoff=Backoff(base=1.0, cap=1.0, jitter="none"))
    async def flaky() -> None:
        raise RuntimeError("fails every time")

    return app


async def _stored(redis_url: str, namespace: str) -> set[bytes]:
    """The app's keys but its counters and wake tokens: every enqueue call counts its
    FIFO numbers and wakes a worker, whatever it stored."""
    keys = await app_keys(redis_url, namespace)
    return {k for k in keys if not k.endswith((b":stats", b":wake"))}


async def test_a_restricted_class_is_refused_without_entitlement_and_nothing_is_stored(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    echo = app.tasks["echo"]
    async with app:
        before = await _stored(redis_url, namespace)
        with pytest.raises(Rejected) as refused:
            await echo.enqueue("hi", tenant="acme", service_class="guaranteed")
        assert refused.value.reason == "class_not_entitled"
        assert refused.value.retry_after is None
        admission = await echo.submit("hi", tenant="acme", service_class="guaranteed")
        assert (admission.status, admission.reason, admission.job) == (
            "rejected",
            "class_not_entitled",
            None,
        )
        assert admission.retry_after is None
        with pytest.raises(Rejected, match="class_not_entitled"):
            await echo.enqueue_many([("a",), ("b",)], tenant="acme", service_class="guaranteed")
        assert await _stored(redis_url, namespace) == before
        # an unrestricted class needs no entitlement
        job = await echo.enqueue("hi", tenant="acme", service_class="standard")
        assert (await job.info()).service_class == "standard"


async def test_an_entitled_tenant_uses_the_class_and_gets_its_default_class(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    echo = app.tasks["echo"]
    async with app:
        await app.tenants.configure("acme", classes=["guaranteed"])
        job = await echo.enqueue("hi", tenant="acme", service_class="guaranteed")
        assert (await job.info()).service_class == "guaranteed"
        await app.tenants.configure("acme", default_class="guaranteed")
        assert await app.tenants.entitlement("acme") == Entitlement(
            frozenset({"guaranteed"}), "guaranteed"
        )
        unnamed = await echo.enqueue("hi", tenant="acme")
        assert (await unnamed.info()).service_class == "guaranteed"
        # a class the call names wins over the default
        named = await echo.enqueue("hi", tenant="acme", service_class="batch")
        assert (await named.info()).service_class == "batch"
        # another tenant is untouched: its jobs stay in the lane's default class
        other = await echo.enqueue("hi", tenant="globex")
        assert (await other.info()).service_class == "standard"


async def test_a_default_class_the_tenant_may_not_use_is_not_applied(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    echo = app.tasks["echo"]
    async with app:
        await app.tenants.configure("acme", default_class="guaranteed")
        job = await echo.enqueue("hi", tenant="acme")
        assert (await job.info()).service_class == "standard"


async def test_reset_lifts_the_entitlement_and_the_default_class(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    echo = app.tasks["echo"]
    async with app:
        await app.tenants.configure("acme", classes=["guaranteed"], default_class="batch")
        await app.tenants.reset("acme", "default_class")
        assert await app.tenants.entitlement("acme") == Entitlement(frozenset({"guaranteed"}))
        await app.tenants.configure("acme", default_class="guaranteed")
        await app.tenants.reset("acme")
        assert await app.tenants.entitlement("acme") is None
        assert (await (await echo.enqueue("hi", tenant="acme")).info()).service_class == (
            "standard"
        )
        with pytest.raises(Rejected, match="class_not_entitled"):
            await echo.enqueue("hi", tenant="acme", service_class="guaranteed")
        # named beside a concurrency setting, both are lifted
        await app.tenants.configure("acme", floor=2, classes=["guaranteed"])
        await app.tenants.reset("acme", "floor", "classes")
        assert await app.tenants.limits("acme") is None
        assert await app.tenants.entitlement("acme") is None


async def test_bad_entitlements_are_refused_at_the_call(redis_url: str, namespace: str) -> None:
    app = _app(namespace, redis_url)
    async with app:
        with pytest.raises(TypeError, match="list of class names"):
            await app.tenants.configure("acme", classes="guaranteed")
        with pytest.raises(ValueError, match="classes: class name must be non-empty"):
            await app.tenants.configure("acme", classes=["guaranteed", "a b"])
        with pytest.raises(ValueError, match="default_class"):
            await app.tenants.configure("acme", default_class="")
        with pytest.raises(ValueError, match="unknown tenant settings"):
            await app.tenants.reset("acme", "class")  # type: ignore[arg-type]
        assert await app.tenants.entitlement("acme") is None


async def test_a_retry_after_the_entitlement_was_lifted_is_not_run_nor_redriven(
    redis_url: str, namespace: str
) -> None:
    app = _app(namespace, redis_url)
    flaky = app.tasks["flaky"]
    async with app:
        await app.tenants.configure("acme", classes=["guaranteed"])
        job = await flaky.enqueue(tenant="acme", service_class="guaranteed")
        async with running_worker(app, concurrency=1):

            async def retry_waits() -> bool:
                info = await job.info()
                return info.attempts == 1 and info.status == "scheduled"

            await eventually(retry_waits)
            await app.tenants.reset("acme", "classes")
            with pytest.raises(TaskFailed) as failed:
                await job.result(timeout=WAIT)
        assert failed.value.type_name == "ClassNotEntitled"
        info = await job.info()
        assert (info.status, info.attempts) == ("failed", 1)  # the retry never ran
        # nor does a re-drive put it back in the class until the tenant is entitled again
        assert await app.redrive([job.id]) == []
        await app.tenants.configure("acme", classes=["guaranteed"])
        assert await app.redrive([job.id]) == [job.id]


def test_a_restricted_class_is_declared_and_guaranteed_is_one_by_default() -> None:
    table = ClassTable(DEFAULT_CLASSES)
    assert [c.restricted for c in table] == [True, False, False]
    entitled = Entitlement(frozenset({"guaranteed"}), "guaranteed")
    assert entitled.may_use(table["guaranteed"]) and not Entitlement().may_use(table["guaranteed"])
    assert entitled.class_for(table, "standard", by_name=False) == "guaranteed"
    assert Entitlement(default_class="guaranteed").class_for(table, "standard", by_name=False) == (
        "standard"
    )
    with pytest.raises(TypeError, match="restricted must be True or False"):
        ServiceClass("gold", restricted=1)  # type: ignore[arg-type]


def test_a_lane_or_pool_declares_a_restricted_class_in_toml() -> None:
    lanes = parse_lanes({"lanes": {"x": {"classes": {"gold": {"restricted": True}, "std": {}}}}})
    assert [c.restricted for c in lanes["x"]] == [True, False]
    pool = {"capacity_units": 10, "classes": {"gold": {"nominal_share": 1.0, "restricted": True}}}
    assert parse_config({"pools": {"p": pool}}).lane_tables()["p"]["gold"].restricted
    with pytest.raises(ConfigError, match=r"lanes\.x\.classes\.gold\.restricted: must be true or"):
        parse_lanes({"lanes": {"x": {"classes": {"gold": {"restricted": "yes"}}}}})
