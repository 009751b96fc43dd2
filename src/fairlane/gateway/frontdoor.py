"""The front door: every request of the tenants' API (``/v1/``) passes it before it
touches the store, and a tenant past its bounds is answered 429, never 503.

The tenant is known from the bearer key alone when the gateway has read the key's record
before (``ApiKeys.vouched``: the digest matches the record it holds), which is every
request of a key but its first; the admin key is a flow of its own, and so are the keys
not read yet (their first request, and keys that are not valid), which share one flow
among them. A request without a key at all passes straight to authentication, which
refuses it without asking the store. Then, in this order (``FrontDoorSettings``):

1. **In flight.** A tenant with ``max_in_flight`` requests in this process (answered or
   waiting for a seat) gets 429 ``tenant_in_flight``, Retry-After 1 s.
2. **Rate.** A submit (``POST /v1/jobs``) takes a token from its tenant's bucket
   (``buckets``); an empty bucket gives 429 ``tenant_rate``, with the wait until the
   next token as Retry-After (whole seconds in the header, the exact wait in the body).
3. **Seat.** The request waits for a seat (``seats``: tenant-fair, bounded); refused
   one, it gets 429 ``gateway_busy``, Retry-After 1 s, and its token back.

A flow refused again before its last Retry-After has run out gets its 429 only after a
hold (``holds``: ``refusal_hold``, 1 s), so a client that ignores Retry-After cannot
fill the event loop with refusals.

The seat is held while the request uses the store and given back before its answer is
sent; a long poll (``GET /v1/jobs/{id}/result?wait=``) gives it back before it waits
(``give_back_seat``). The answer of a request refused here was decided without the store:
nothing was stored, and a 503 still means only that the store cannot be reached or is
full.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Final

from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from fairlane.config.frontdoor import DoorBounds, FrontDoorSettings
from fairlane.gateway.apikeys import parse_key
from fairlane.gateway.auth import bearer_key, is_admin_key
from fairlane.gateway.buckets import TenantBuckets
from fairlane.gateway.governor import govern
from fairlane.gateway.holds import Holds
from fairlane.gateway.responses import error
from fairlane.gateway.seats import FairSeats, Seat
from fairlane.gateway.state import GatewayState
from fairlane.policy.frontdoor import SeatGovernor
from fairlane.policy.rates import Rate

__all__ = [
    "API_PREFIX",
    "GATEWAY_BUSY",
    "REASONS",
    "TENANT_IN_FLIGHT",
    "TENANT_RATE",
    "FrontDoor",
    "FrontDoorGate",
    "Refused",
    "Unnamed",
    "give_back_seat",
]

#: the paths of the tenants' API, which pass the front door
API_PREFIX: Final = "/v1/"
TENANT_IN_FLIGHT: Final = "tenant_in_flight"
TENANT_RATE: Final = "tenant_rate"
GATEWAY_BUSY: Final = "gateway_busy"
REASONS: Final = (TENANT_IN_FLIGHT, TENANT_RATE, GATEWAY_BUSY)
#: Retry-After of a refusal that no refill time measures: one of the tenant's own
#: requests, or a seat, comes free within about one store call; a second is the header's
#: least
SHORT_RETRY_AFTER: Final = 1.0
#: where a request's pass lives in its ASGI scope's state
_PASS: Final = "fairlane.front_door"


class Unnamed(enum.Enum):
    """The flows that are not a tenant's."""

    ADMIN = "admin"
    UNREAD_KEY = "unread key"


Flow = str | Unnamed


class Refused(Exception):
    """A request the front door turns away: answered 429 with ``reason`` and Retry-After."""

    def __init__(self, reason: str, detail: str, retry_after: float) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after

    def response(self) -> JSONResponse:
        return error(429, self.detail, self.reason, round(self.retry_after, 3))


class FrontDoor:
    """One gateway process's bounds per tenant, buckets, seats (``settings.seats``, at
    most ``connections``) and held refusals."""

    def __init__(
        self,
        state: GatewayState,
        settings: FrontDoorSettings,
        connections: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.settings = settings
        # no more seats than connections: the store's call gate never makes a seat wait
        count = min(settings.seats, connections)
        self.seats = FairSeats(count, settings.waiting, settings.seat_wait)
        self.buckets = TenantBuckets()
        self.holds = Holds(settings.refusal_hold, clock)
        self.in_flight: dict[Flow, int] = {}
        #: submits counted by tenant since the governor last read them, and the rate
        #: every tenant is held to while the loop lags at one seat (None: none)
        self.submits: dict[str, int] = {}
        self.shed: float | None = None
        self.clock = clock
        self._named = {tenant: settings.bounds_of(tenant) for tenant in settings.tenants}
        self._default = settings.default_bounds()

    def bounds_of(self, tenant: str) -> DoorBounds:
        return self._named.get(tenant, self._default)

    @asynccontextmanager
    async def governed(self) -> AsyncIterator[None]:
        """The seats governed by the loop's lag for the block's length (``governor``),
        when ``lag_target`` is set."""
        target = self.settings.lag_target
        if target is None:
            yield
            return
        rule = SeatGovernor(self.seats.book.seats, target)
        async with asyncio.TaskGroup() as group:
            task = group.create_task(govern(self, rule))
            try:
                yield
            finally:
                task.cancel()

    def flow_of(self, authorization: str | None) -> Flow | None:
        """Whose request bears this ``Authorization`` header; None: no bearer key."""
        key = bearer_key(authorization)
        if key is None:
            return None
        if is_admin_key(self.state, key):
            return Unnamed.ADMIN
        keys = self.state.key_cache
        vouched = keys.vouched(key) if keys is not None else None
        if vouched is not None:
            return vouched[1].tenant
        return Unnamed.UNREAD_KEY if parse_key(key) else None

    @asynccontextmanager
    async def admitted(
        self, authorization: str | None, *, submit: bool
    ) -> AsyncIterator[Seat | None]:
        """Hold a request's place (in flight, its token, a seat) for the block, or raise
        ``Refused`` before it runs (held back first if its flow ignored its last
        Retry-After: ``holds``). A request without a bearer key holds nothing (None):
        authentication refuses it without the store."""
        flow = self.flow_of(authorization)
        if flow is None:
            yield None
            return
        try:
            seat = await self._pass(flow, submit)
        except Refused as refusal:
            await self.holds.hold(flow, refusal.retry_after)
            raise
        try:
            yield seat
        finally:
            seat.give_back()
            self._leave(flow)

    async def _pass(self, flow: Flow, submit: bool) -> Seat:
        """The seat of a request of ``flow``, counted in flight; or ``Refused``."""
        tenant = flow if isinstance(flow, str) else None
        bounds = self.bounds_of(tenant) if tenant is not None else None
        self._enter(flow, bounds)
        try:
            took = submit and tenant is not None and self._take_token(tenant, bounds)
            seat = await self.seats.take(flow)
            if seat is None:
                if took and tenant is not None:
                    self.buckets.give_back(tenant, self._now_ms())
                raise Refused(
                    GATEWAY_BUSY,
                    "no seat on the store came free for this request (its tenant held and "
                    "waited for the most, or the wait ran out); nothing was done",
                    SHORT_RETRY_AFTER,
                )
        except BaseException:
            self._leave(flow)
            raise
        return seat

    def _enter(self, flow: Flow, bounds: DoorBounds | None) -> None:
        now = self.in_flight.get(flow, 0)
        bound = bounds.max_in_flight if bounds is not None else None
        if bound is not None and now >= bound:
            raise Refused(
                TENANT_IN_FLIGHT,
                f"this tenant has {now} requests in flight, its bound here; nothing was done",
                SHORT_RETRY_AFTER,
            )
        self.in_flight[flow] = now + 1

    def _leave(self, flow: Flow) -> None:
        left = self.in_flight[flow] - 1
        if left:
            self.in_flight[flow] = left
        else:
            del self.in_flight[flow]

    def _take_token(self, tenant: str, bounds: DoorBounds | None) -> bool:
        """Whether a token was taken (False: the tenant has no rate); ``Refused`` if
        its bucket is empty. While the loop lags at one seat, every tenant's rate is
        at most the governor's (``shed``)."""
        self.submits[tenant] = self.submits.get(tenant, 0) + 1
        rate = bounds.rate if bounds is not None else None
        shed = self.shed
        if shed is not None and (rate is None or rate.limit > shed):
            rate = Rate(shed, burst=max(1.0, shed / 10))
        if rate is None:
            return False
        wait = self.buckets.take(tenant, rate, self._now_ms())
        if wait is not None:
            raise Refused(
                TENANT_RATE,
                f"this tenant submits faster than its rate here ({rate.limit:g}/s, "
                f"bursts of {rate.capacity:g}); nothing was stored",
                wait,
            )
        return True

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)


def give_back_seat(request: Request) -> None:
    """Give back the request's seat now, keeping it in flight: before a long wait that
    holds no connection to the store."""
    seat = request.scope.get("state", {}).get(_PASS)
    if isinstance(seat, Seat):
        seat.give_back()


class FrontDoorGate:
    """ASGI middleware: the requests of the tenants' API through the front door; a
    refused one answered 429 before the app sees it."""

    def __init__(self, app: ASGIApp, door: FrontDoor, submit_path: str) -> None:
        self.app = app
        self.door = door
        self.submit_path = submit_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not path.startswith(API_PREFIX):
            await self.app(scope, receive, send)
            return
        submit = path == self.submit_path and scope.get("method") == "POST"
        authorization = Headers(scope=scope).get("authorization")
        try:
            async with self.door.admitted(authorization, submit=submit) as seat:
                scope.setdefault("state", {})[_PASS] = seat
                await self.app(scope, receive, send)
                return
        except Refused as refusal:
            answer = refusal.response()
        await answer(scope, receive, send)
