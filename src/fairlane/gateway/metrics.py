"""The gateway's Prometheus endpoint, ``GET /metrics``, its autoscaler JSON,
``GET /autoscale`` (what a worker's metrics port serves: ``autoscale_view``, whose
``backlog_total`` leaves batch classes out and whose ``slots_needed`` says what the
deadlines and the backlog need, over the app's ``autoscale_horizon``), and the
gateway-side metrics.

``mount_metrics(api)`` adds to a gateway built by ``create_app``:

- the store-side metrics a worker's metrics port serves (``StoreCollector``: lanes,
  backlog, the oldest waiting job, admission decisions counted by the server), read by
  a ``StoreReader`` in the thread pool, so a scrape never blocks the event loop, and
  cached like a worker's (at most one store read per ``store_max_age``);
- ``fairlane_gateway_requests_total{method,route,status}``: every HTTP answer, by the
  route's template (``/v1/jobs/{job_id}``, never the id; ``unmatched`` for no route);
- ``fairlane_gateway_submit_duration_seconds{verdict}``: the time to answer
  ``POST /v1/jobs``, by the answer;
- ``fairlane_gateway_admissions_total{verdict,reason}``: the admission answers the
  gateway gave (accepted, deferred, rejected, unavailable) and the reason it told the
  caller (``none`` when it told none: accepted and deferred answers carry no reason).

Every label takes a bounded set of values: methods outside the standard ones are
``other``, reasons outside the documented ones are ``other``, routes are the app's
own templates. The answers are read from the responses themselves (status and JSON
body of ``POST /v1/jobs``), so the endpoints need no hook of their own.

``/metrics`` and ``/autoscale`` are open, like a worker's metrics port;
``require_admin=True`` makes them answer 401 unless called with the gateway's admin key.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.exceptions import RedisError
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fairlane.app.admission import CLASS_NOT_ENTITLED, STORE_BUSY, STORE_UNAVAILABLE
from fairlane.gateway.frontdoor import REASONS as FRONT_DOOR_REASONS
from fairlane.gateway.responses import error
from fairlane.gateway.state import GatewayState
from fairlane.metrics.config import MetricsConfig
from fairlane.metrics.store import StoreCollector, StoreReader, autoscale_view
from fairlane.policy.admission.reasons import REJECTION_REASONS

__all__ = ["SUBMIT_BUCKETS", "GatewayMetrics", "mount_metrics"]

SUBMIT_PATH = "/v1/jobs"
_JSON = msgspec.json.Decoder()
#: Submit latency: one store round trip when all is well, seconds when it is not.
SUBMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED = "unmatched"
OTHER = "other"
NONE = "none"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: The reasons a submit's answer may give: admission's (``fairlane.admission.Admission
#: .reason``: a refusal's, an unavailable or busy store's) and the front door's; any
#: other is labelled ``other``.
_REASONS = frozenset((*REJECTION_REASONS, STORE_UNAVAILABLE, STORE_BUSY, *FRONT_DOOR_REASONS))
#: A submit answer's body is small; more than this is not an admission answer.
_MAX_CAPTURED = 4096


class _StoreSide(Collector):
    """The store-side families once the gateway knows its server; until then only
    ``fairlane_store_up 0`` (the gateway connects on first use)."""

    def __init__(self) -> None:
        self.collector: StoreCollector | None = None

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        collector = self.collector
        if collector is not None:
            yield from collector.collect()
            return
        up = GaugeMetricFamily("fairlane_store_up", "1 if the last store read succeeded.")
        up.add_metric([], 0)
        yield up


class GatewayMetrics:
    """One gateway's metrics and the registry ``/metrics`` serves."""

    def __init__(self, config: MetricsConfig | None = None) -> None:
        self.config = config or MetricsConfig()
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fairlane_gateway_requests",
            "HTTP requests answered by the gateway, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.submit_seconds = Histogram(
            "fairlane_gateway_submit_duration_seconds",
            "Time to answer POST /v1/jobs, by verdict (accepted, deferred, rejected, "
            "unavailable; refused: the request itself was refused, e.g. 401, 413, 422).",
            ["verdict"],
            buckets=SUBMIT_BUCKETS,
            registry=self.registry,
        )
        self.admissions = Counter(
            "fairlane_gateway_admissions",
            "Admission answers the gateway gave, by verdict and the reason it told the caller.",
            ["verdict", "reason"],
            registry=self.registry,
        )
        self._store = _StoreSide()
        self.registry.register(self._store)
        self.reader: StoreReader | None = None
        self._children: dict[tuple[object, ...], Any] = {}

    # -- the store side ----------------------------------------------------------------

    async def attach_store(self, state: GatewayState) -> None:
        """Start reading the store once the gateway is connected (connecting if need be)."""
        if self.reader is not None:
            return
        try:
            app = await state.connected()
        except (OSError, RedisError):
            return  # fairlane_store_up stays 0; the next scrape tries again
        if self.reader is not None or app.url is None:
            return
        lanes = [*app.lanes, *(t.options.lane for t in app.tasks.values())]
        self.reader = StoreReader(
            app.url,
            app.name,
            lanes,
            timeout=self.config.store_timeout,
            max_age=self.config.store_max_age,
            shards=app.shards,
            tables=app.lanes,
            horizon=self.config.horizon or app.settings.autoscale_horizon,
        )
        self._store.collector = StoreCollector(self.reader, self.config.key_top_n)

    def close(self) -> None:
        reader, self.reader, self._store.collector = self.reader, None, None
        if reader is not None:
            reader.close()

    def render(self) -> bytes:
        """The Prometheus text; reads the store (blocking): call it in a thread."""
        return generate_latest(self.registry)

    def autoscale(self) -> dict[str, Any]:
        """The ``/autoscale`` JSON; reads the store (blocking): call it in a thread."""
        reader = self.reader
        return autoscale_view(reader.snapshot() if reader is not None else None)

    # -- the HTTP side -----------------------------------------------------------------

    def observe(
        self, method: str, route: str, status: int, seconds: float, body: bytes | None
    ) -> None:
        method = method if method in _METHODS else OTHER
        self._child(self.requests, method, route, str(status)).inc()
        if route != SUBMIT_PATH or method != "POST":
            return
        verdict, reason = _submit_answer(status, body)
        self._child(self.submit_seconds, verdict).observe(seconds)
        if verdict != "refused":
            self._child(self.admissions, verdict, reason).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        # a metric's ``labels()`` checks and locks on every call: on the submit path, a
        # dict of the children already made (labels are bounded, so the dict is too)
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child


def _submit_answer(status: int, body: bytes | None) -> tuple[str, str]:
    """The verdict and reason of a ``POST /v1/jobs`` answer, from its status and body."""
    data: Any = None
    if body:
        try:
            data = _JSON.decode(body)
        except msgspec.DecodeError:
            data = None
    fields: dict[str, Any] = data if isinstance(data, dict) else {}
    said = fields.get("reason")
    reason = NONE if said is None else (said if said in _REASONS else OTHER)
    if status == 202 and fields.get("state") in ("accepted", "deferred"):
        return str(fields["state"]), reason
    # every admission refusal is a 429 (deadline_unmeetable too, without Retry-After)
    # but a class the tenant is not entitled to
    if status == 429 or (status == 403 and said == CLASS_NOT_ENTITLED):
        return "rejected", reason
    if status == 503:
        return "unavailable", reason
    return "refused", reason


def _route_of(routes: list[BaseRoute], scope: Scope) -> str:
    """The template of the route that answered, or would have (a refusal before
    routing, such as the body limit's 413, happens outside the router)."""
    route = scope.get("route")
    if route is None:
        probe = {**scope, "path_params": {}}
        for candidate in routes:
            match, _ = candidate.matches(probe)
            if match is not Match.NONE:
                route = candidate
                break
    path = getattr(route, "path", None)
    if not isinstance(path, str) or not path:
        return UNMATCHED
    return _included_prefix(route, scope.get("path", "")) + path


def _included_prefix(route: object, concrete: str) -> str:
    """The prefix a router was included under (``/ui`` for the dashboard's routes),
    which the route's own template leaves out: the longest head of the request path
    whose rest the route matches. Include prefixes are fixed text, never ids."""
    regex = getattr(route, "path_regex", None)
    if regex is None or regex.fullmatch(concrete):
        return ""
    for i, char in enumerate(concrete):
        if char == "/" and i > 0 and regex.fullmatch(concrete[i:]):
            return concrete[:i]
    return ""


class RequestMetrics:
    """ASGI middleware: counts every HTTP answer and times and classifies submits."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, routes: list[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        method: str = scope.get("method", "")
        status = 500  # unless the app answers: an exception escapes as a server error
        # only a POST's answer is read (it may be a submit's): a few hundred bytes
        captured: bytearray | None = bytearray() if method == "POST" else None

        async def tap(message: Message) -> None:
            nonlocal status, captured
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and captured is not None:
                captured += message.get("body", b"")
                if len(captured) > _MAX_CAPTURED:
                    captured = None
            await send(message)

        try:
            await self.app(scope, receive, tap)
        finally:
            self.metrics.observe(
                method,
                _route_of(self.routes, scope),
                status,
                time.perf_counter() - started,
                bytes(captured) if captured is not None else None,
            )


def mount_metrics(
    api: FastAPI,
    *,
    require_admin: bool = False,
    config: MetricsConfig | None = None,
    path: str = "/metrics",
    autoscale_path: str = "/autoscale",
) -> GatewayMetrics:
    """Serve ``path`` (default ``/metrics``) and ``autoscale_path`` (default
    ``/autoscale``) on a gateway from ``create_app`` and record its HTTP metrics. Call it
    before the app starts (it adds a middleware).

    ``require_admin``: answer 401 unless the caller sends the gateway's admin key
    (``Authorization: Bearer <admin key>``); the gateway must have one. ``config``: the
    store read's timeout and cache age (``store_timeout``, ``store_max_age``).
    """
    state: GatewayState = api.state.gateway
    if require_admin and not state.admin_key:
        raise ValueError("require_admin needs a gateway built with an admin key")
    metrics = GatewayMetrics(config)

    async def serve(request: Request) -> Response:
        if require_admin and not _is_admin(request, state):
            return error(401, "the admin key is required", "unauthorized")
        await metrics.attach_store(state)
        body = await run_in_threadpool(metrics.render)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    async def autoscale(request: Request) -> Response:
        if require_admin and not _is_admin(request, state):
            return error(401, "the admin key is required", "unauthorized")
        await metrics.attach_store(state)
        return JSONResponse(await run_in_threadpool(metrics.autoscale))

    api.add_api_route(path, serve, methods=["GET"], include_in_schema=False)
    api.add_api_route(autoscale_path, autoscale, methods=["GET"], include_in_schema=False)
    # first, so that a catch-all mount added earlier (a UI at "/") cannot shadow them
    routes = api.router.routes
    routes[:0] = [routes.pop(), routes.pop()]
    api.add_middleware(RequestMetrics, metrics=metrics, routes=routes)
    api.router.lifespan_context = _closing(api.router.lifespan_context, metrics.close)
    return metrics


def _is_admin(request: Request, state: GatewayState) -> bool:
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    admin = state.admin_key
    return (
        admin is not None
        and scheme.lower() == "bearer"
        and hmac.compare_digest(key.strip().encode(), admin.encode())
    )


def _closing(inner: Callable[[Any], Any], close: Callable[[], None]) -> Callable[[Any], Any]:
    """The app's lifespan, closing the store reader at shutdown."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        try:
            async with inner(app) as value:
                yield value
        finally:
            close()

    return lifespan
